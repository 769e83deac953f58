"""Model-selection criteria: which epoch's weights a run keeps, scored on the validation split.

Every criterion is a pure function ``(val_logits (N, C), val_labels (N, C) 0/1) -> score`` where higher is
better; the trainer keeps the epoch with the best score. ``map`` is the papers' criterion and needs full
validation labels to mean what it says. The others are built for single-positive validation labels (one
observed positive per image, every other label unknown):

* ``observed-auc``: mean over classes of the ROC AUC of the observed positives against all other images. When
  positives are observed at random (SCAR), the AUC on positive-vs-unlabelled data is an increasing affine
  function of the true AUC (Menon et al. 2015), so it ranks models as the true AUC would.
* ``observed-rank``: mean reciprocal rank of each image's observed positive among its classes (by logit).
* ``observed-map``: mAP with every unobserved label counted as negative (what ``map`` computes on such data).
* ``an-loss``: minus the "assume negative" binary cross-entropy of the observed labels (the validation loss of
  the ``an`` method: unobserved labels count as negatives).

:data:`CRITERIA` is the registry (name -> :class:`Criterion`); :func:`default_criterion` gives the one to use
for a validation split with or without full labels. Measured on single-positive val labels (8 runs: AN and EPR,
builtin:small and builtin:dense-small, 2 seeds; docs/your-data.md), the test mAP of the picked epoch against the
epoch clean val picks: ``an-loss`` -0.24 on average (it lost nothing on 7 of 8 runs, 0.84 on one), ``observed-auc``
and ``observed-rank`` +0.47, ``observed-map`` +1.37, the last epoch +2.73 mAP lost. ``an-loss`` is the default;
``observed-auc`` is scale-free (only each class's ranking counts) for methods whose scores are not probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from train.metrics import mean_average_precision

__all__ = ["CRITERIA", "LABEL_FREE_DEFAULT", "Criterion", "default_criterion", "get_criterion", "score"]

ScoreFn = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True)
class Criterion:
    """A selection criterion: ``name``, its function (higher is better), whether it needs full validation labels
    to be meaningful, and a one-line description for the start-of-run print."""

    name: str
    fn: ScoreFn
    needs_full_labels: bool
    description: str


def _check(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels) > 0
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"logits and labels must both be (N, C); got {x.shape} and {y.shape}")
    return x, y


def map_score(logits: np.ndarray, labels: np.ndarray) -> float:
    """Macro mAP in percent (classes without a positive left out), as :func:`train.metrics.evaluate`."""
    x, y = _check(logits, labels)
    return mean_average_precision(x, y)


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
    pessimistically); images without a positive are left out."""
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


CRITERIA: dict[str, Criterion] = {
    "map": Criterion("map", map_score, True, "val mAP (needs full val labels)"),
    "observed-map": Criterion("observed-map", map_score, False,
                              "val mAP with every unobserved label counted as negative"),
    "observed-auc": Criterion("observed-auc", observed_auc, False,
                              "mean per-class AUC of the observed val positives against all other val images"),
    "observed-rank": Criterion("observed-rank", observed_rank, False,
                               "mean reciprocal rank of each val image's observed positive among its classes"),
    "an-loss": Criterion("an-loss", an_loss_score, False, "minus the assume-negative BCE of the val labels"),
}

#: The criterion for validation splits without full labels (chosen by measurement, see the module docstring).
LABEL_FREE_DEFAULT = "an-loss"


def get_criterion(name: str) -> Criterion:
    """The criterion registered as ``name``; a ``ValueError`` lists the known names."""
    if name not in CRITERIA:
        raise ValueError(f"unknown selection criterion {name!r} (known: {', '.join(CRITERIA)})")
    return CRITERIA[name]


def default_criterion(val_has_full_labels: bool) -> Criterion:
    """``map`` when the validation labels are full, :data:`LABEL_FREE_DEFAULT` when they are not."""
    return CRITERIA["map" if val_has_full_labels else LABEL_FREE_DEFAULT]


def score(name: str, val_logits: np.ndarray, val_labels: np.ndarray) -> float:
    """``get_criterion(name).fn(val_logits, val_labels)``."""
    return get_criterion(name).fn(val_logits, val_labels)
