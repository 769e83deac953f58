"""Pseudo-labels from a vision-language model (CLIP through ``open_clip``) for the methods that train on them
(``vlpl``, ``aevlp``): what a method asks for (:mod:`~train.pseudo_labels.spec`, a leaf module the methods import),
the CLIP model and scoring pass (:mod:`~train.pseudo_labels.clip_scores`), AEVLP's crops
(:mod:`~train.pseudo_labels.crops`) and the run's ``pseudo_labels.npz`` (:mod:`~train.pseudo_labels.store`).
The stage a run goes through is :mod:`train.pseudo_label_stage`: it needs the run's config and method, which this
package never imports.
"""
