"""Training of single-positive multi-label classifiers (``python -m train``); importing it loads neither gradio nor
onnxruntime. Public API (``__all__``, imported lazily): :class:`TrainConfig`, :func:`build_parser`,
:func:`config_from_args`, :class:`Trainer`, :func:`choose` (``--method auto``) and its steps; imports ``models``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.registry import lazy_exports

#: The public API, imported lazily (PEP 562): ``import train`` stays cheap, torch loads on first use of a name.
_LAZY = {
    "TrainConfig": "train.config",
    "build_parser": "train.options",
    "config_from_args": "train.options",
    "Trainer": "train.trainer",
    "CHOICE_CRITERION": "train.choose",
    "Candidate": "train.choose",
    "CandidateResult": "train.choose",
    "Choice": "train.choose",
    "candidate_methods": "train.choose",
    "choose": "train.choose",
    "choose_on_scores": "train.choose",
    "extract_features": "train.choose",
    "fit_candidate": "train.choose",
    "out_of_fold_logits": "train.choose",
    "prepare": "train.choose",
    "labelled_pool": "train.cross_fitting",
    "training_pool": "train.cross_fitting",
    "rank_pairs": "train.suggestions", "ORDERS": "train.suggestions"}

if TYPE_CHECKING:
    from train.choose import (
        CHOICE_CRITERION,
        Candidate,
        CandidateResult,
        Choice,
        candidate_methods,
        choose,
        choose_on_scores,
        extract_features,
        fit_candidate,
        out_of_fold_logits,
        prepare,
    )
    from train.config import TrainConfig
    from train.cross_fitting import labelled_pool, training_pool
    from train.options import build_parser, config_from_args
    from train.suggestions import ORDERS, rank_pairs
    from train.trainer import Trainer


__getattr__ = lazy_exports("train", _LAZY)


__all__ = [
    "CHOICE_CRITERION",
    "ORDERS",
    "Candidate",
    "CandidateResult",
    "Choice",
    "TrainConfig",
    "Trainer",
    "build_parser",
    "candidate_methods",
    "choose",
    "choose_on_scores",
    "config_from_args",
    "extract_features",
    "fit_candidate",
    "labelled_pool",
    "out_of_fold_logits",
    "prepare",
    "rank_pairs",
    "training_pool"]
