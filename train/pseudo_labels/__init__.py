"""Pseudo-labels from a vision-language model (CLIP through ``open_clip``), for the methods that train on them
(``vlpl``, ``aevlp``; :attr:`train.methods.base.Method.uses_pseudo_labels`).

- :mod:`train.pseudo_labels.spec` - what a method asks for (a leaf module the methods import);
- :mod:`train.pseudo_labels.clip_scores` - the CLIP model (``--clip MODEL:PRETRAINED``), its availability before
  anything trains, prompts, preprocessing and the scoring pass;
- :mod:`train.pseudo_labels.crops` - AEVLP's grid of crops and how their scores become pseudo-positives;
- :mod:`train.pseudo_labels.store` - the ``pseudo_labels.npz`` file of a run (or ``--pseudo-labels FILE``);
The stage a run goes through (reuse, read or compute, select, report) is :mod:`train.pseudo_label_stage`, beside
this package: it needs the run's config and method, which this package never imports.
"""
