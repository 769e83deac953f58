"""Evaluation and model selection: the metrics of a model's predictions, the criterion that picks the best epoch,
and the best epoch so far.

A selection criterion is a function of the validation predictions (logits, one row per image) and the
validation labels that returns a score, higher being better (NaN when it cannot be computed). Today's is the
validation mAP (the papers' protocol). Adding one is one function in :data:`CRITERIA`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from train.metrics import evaluate, mean_average_precision

Criterion = Callable[[np.ndarray, np.ndarray], float]


def validation_map(logits: np.ndarray, labels: np.ndarray) -> float:
    """mAP (percent) of the predictions against the validation labels, classes without positives left out."""
    return mean_average_precision(logits, labels)


CRITERIA: dict[str, Criterion] = {"val_mAP": validation_map}
DEFAULT_CRITERION = "val_mAP"


def finite_score(value: float | None) -> float:
    """``value`` as a comparable score: -inf for None or NaN."""
    return -math.inf if value is None or math.isnan(value) else float(value)


@dataclass
class Assessment:
    """A model's predictions on a split, judged: ``metrics`` against the split's labels (mAP, F1, per-class AP;
    :func:`train.metrics.evaluate`) and ``score``, the selection criterion's value (-inf when undefined)."""

    metrics: dict[str, Any]
    score: float


def assess(logits: np.ndarray, labels: np.ndarray, classes: list[str],
           criterion: Criterion = CRITERIA[DEFAULT_CRITERION]) -> Assessment:
    """The metrics of ``logits`` (N, C) against ``labels`` (N, C) and the criterion's score."""
    return Assessment(evaluate(logits, labels, classes), finite_score(criterion(logits, labels)))


@dataclass
class Candidate:
    """Weights that could be the epoch's pick: the trained ``model`` itself or its EMA (``name``), assessed."""

    name: str
    module: nn.Module
    assessment: Assessment


def pick(candidates: list[Candidate]) -> Candidate:
    """The candidate with the highest score (the first on a tie)."""
    return max(candidates, key=lambda c: c.assessment.score)


class BestSoFar:
    """The best score and its epoch in the current stage (or LinearInit phase)."""

    def __init__(self) -> None:
        self.score = -math.inf
        self.epoch = 0

    def offer(self, score: float, epoch: int) -> bool:
        """Take ``score`` of ``epoch`` when it beats the best so far; True when it did."""
        if score > self.score:
            self.score, self.epoch = score, epoch
            return True
        return False

    def reset(self) -> None:
        """Forget the best (a new stage selects its own)."""
        self.score, self.epoch = -math.inf, 0

    def state_dict(self) -> dict[str, float | int]:
        """Resume state (``best_map`` keeps the key name of earlier checkpoints)."""
        return {"best_map": self.score, "best_epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.score, self.epoch = float(state["best_map"]), int(state["best_epoch"])
