"""Pseudo-labels from CLIP (``open_clip``) for ``vlpl`` and ``aevlp``: the spec, the scoring pass, AEVLP's crops and the
run's ``pseudo_labels.npz``. The run's stage is :mod:`train.pseudo_label_stage`."""
