"""Model-selection criteria for single-positive validation labels (docs/choosing.md): ``(val_logits, val_labels) ->
score``, higher better, NaN when not computable."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from models.evaluation.metrics import mean_average_precision
from models.registry import Row, Table

__all__ = [
    "CRITERIA", "DESCRIPTIONS", "FULL_LABEL_DEFAULT", "LABEL_FREE_CRITERIA", "LABEL_FREE_DEFAULT", "an_loss_score",
    "default_criterion", "observed_auc", "observed_map", "observed_rank", "validation_map"]

Criterion = Callable[[np.ndarray, np.ndarray], float]


def _check(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels) > 0
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"logits and labels must both be (N, C); got {x.shape} and {y.shape}")
    return x, y


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def observed_auc(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean per-class ROC AUC (percent) of the labelled positives against every other image; classes with no
    positive, or only positives, are left out (NaN when none is left). Ties count one half."""
    x, y = _check(logits, labels)
    aucs = []
    for c in range(y.shape[1]):
        pos = y[:, c]
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        if n_pos == 0 or n_neg == 0:
            continue
        ranks = _average_ranks(x[:, c])
        aucs.append((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return float(100 * np.mean(aucs)) if aucs else float("nan")


def observed_rank(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean reciprocal rank (percent) of each labelled positive among its image's classes (ties ranked
    pessimistically); images without a positive are left out (NaN when none has one)."""
    x, y = _check(logits, labels)
    rows, cols = np.nonzero(y)
    if len(rows) == 0:
        return float("nan")
    rank = (x[rows] >= x[rows, cols][:, None]).sum(1)  # classes scoring at least as high, itself included
    return float(100 * np.mean(1.0 / rank))


def an_loss_score(logits: np.ndarray, labels: np.ndarray) -> float:
    """Minus the mean binary cross-entropy of the labels with every unlabelled entry taken as negative."""
    x, y = _check(logits, labels)
    loss = np.logaddexp(0.0, -x) * y + np.logaddexp(0.0, x) * ~y
    return float(-loss.mean())


def observed_map(logits: np.ndarray, labels: np.ndarray) -> float:
    """mAP (percent) against the observed labels, every unobserved label a negative; classes without an observed
    positive are left out (NaN when none has one)."""
    x, y = _check(logits, labels)
    return mean_average_precision(x, y.astype(np.uint8)) if y.any() else float("nan")


def validation_map(logits: np.ndarray, labels: np.ndarray) -> float:
    """mAP (percent) of the predictions against the validation labels, classes without positives left out."""
    return mean_average_precision(logits, labels)


#: The trainer's criterion for fully labelled validation splits (the papers').
FULL_LABEL_DEFAULT = "val_mAP"
#: The criterion for validation splits without full labels (measured best, module docstring).
LABEL_FREE_DEFAULT = "observed-map"
#: Every selection criterion: ``--select`` takes their names (and ``auto``).
CRITERIA: Table[Criterion] = Table("selection criterion", [
    Row(FULL_LABEL_DEFAULT, "the validation mAP (the papers' criterion; needs full val labels)", validation_map),
    Row("an-loss", "minus the assume-negative BCE of the single-positive val labels", an_loss_score),
    Row("observed-auc", "mean per-class AUC of the observed val positives against all other val images",
        observed_auc),
    Row("observed-rank", "mean reciprocal rank of each val image's observed positive among its classes",
        observed_rank),
    Row(LABEL_FREE_DEFAULT, "the val mAP against the observed labels, unobserved ones counted as negatives",
        observed_map),
])
#: The criteria that need no full labels (every one but the validation mAP), name -> function and name -> help.
LABEL_FREE_CRITERIA: dict[str, Criterion] = {row.name: row.value for row in CRITERIA.rows()
                                             if row.name != FULL_LABEL_DEFAULT}
DESCRIPTIONS: dict[str, str] = {row.name: row.help for row in CRITERIA.rows() if row.name != FULL_LABEL_DEFAULT}


def default_criterion(val_has_full_labels: bool) -> str:
    """The criterion to select epochs with: ``val_mAP`` with full validation labels, else :data:`LABEL_FREE_DEFAULT`."""
    return FULL_LABEL_DEFAULT if val_has_full_labels else LABEL_FREE_DEFAULT
