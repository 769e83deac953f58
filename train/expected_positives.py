"""The expected number of positives per image, k, and the class priors, without full labels.

EPR and ROLE pull the predicted number of positives per image towards k, and positive-only threshold
calibration needs to know how many tags an image should get. Where k comes from, in order of preference
(:func:`resolve_expected_positives`):

* ``given``: the user's ``--hp k=...``;
* ``published``: the papers' value for a known dataset (VOC 1.5, COCO 2.9, NUS 1.9, CUB 31.4);
* ``labels``: the mean number of positives of full labels (the training split's, else the validation split's);
* ``audit``: the mean over a small list of images the user labelled completely (:func:`mean_positives`);
* ``estimated``: from a model's scores on held-out images with single-positive labels
  (:func:`estimate_class_priors`, summed).

**The estimator** (``estimated``). For each class c, the observed positives of c are a sample of its positives,
and the prior pi_c = P(y_c = 1) is estimated in the manner of the best-bin estimator of mixture proportions
(Garg et al., "Mixture Proportion Estimation and PU Learning: A Modern Approach", NeurIPS 2021): over the cuts
t of the class's validation scores, ``pi_c = min_t q_all(t) / q_obs(t)``, with ``q_all(t)`` the fraction of
ALL images scoring at least t and ``q_obs(t)`` the fraction of the observed positives that do. Every image above
a cut is a positive or a negative, so the ratio is at least pi_c in expectation; it equals pi_c at a cut above
which only positives remain. Only cuts that keep at least :data:`MIN_OBSERVED_SHARE` of the observed positives
count: at the very top a cut holds one or two images and the ratio is noise (it falls to the observed share of
the class, pi_c / k, when the top image happens to be observed); the paper's confidence terms do the same job,
but with the few observed positives of a validation split they widen too much. Then k = sum_c pi_c.

The scores may come from any model trained on the observed labels (only their order per class counts). The
estimate is an upper bound, tight when the model ranks its top-scoring images well; prefer an audit list when the
model is weak (how far off it came with this package's benchmark models, and what that cost EPR: docs/your-data.md,
Measurements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "K_SOURCES",
    "ExpectedPositives",
    "estimate_class_priors",
    "estimate_expected_positives",
    "mean_positives",
    "resolve_expected_positives",
]

K_SOURCES = ("given", "published", "labels", "audit", "estimated")
#: what a user does when the estimate is not good enough (measured: docs/your-data.md, k)
AUDIT_ADVICE = "20 images labelled completely (--audit) put k within 25% of the truth"
#: The least share of a class's observed positives a cut must keep (module docstring).
MIN_OBSERVED_SHARE = 0.25


@dataclass(frozen=True)
class ExpectedPositives:
    """k and where it came from (one of :data:`K_SOURCES`), with a short detail for the start-of-run print."""

    k: float
    source: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.source not in K_SOURCES:
            raise ValueError(f"unknown source of k {self.source!r} (known: {', '.join(K_SOURCES)})")

    def describe(self) -> str:
        """``k = 2.83 (estimated: ...)``."""
        return f"k = {self.k:.2f} ({self.source}" + (f": {self.detail})" if self.detail else ")")

    def caveat(self) -> str | None:
        """For an estimate: how far it may be from the truth and what brings it closer (None for other sources)."""
        if self.source != "estimated":
            return None
        return (f"k is estimated from the model's own validation scores, an upper bound that is close only when "
                f"the model ranks well (measured: bench/README.md, own-data); {AUDIT_ADVICE}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (config.json, checkpoint metadata)."""
        return {"k": round(float(self.k), 4), "source": self.source, "detail": self.detail}


def mean_positives(labels: np.ndarray) -> float:
    """Mean number of positives per image of a fully labelled 0/1 matrix (N, C); ``ValueError`` when empty."""
    matrix = np.asarray(labels)
    if matrix.ndim != 2 or len(matrix) == 0:
        raise ValueError(f"need a non-empty (N, C) label matrix, got shape {matrix.shape}")
    return float((matrix > 0).sum(1).mean())


def _best_bin_prior(scores: np.ndarray, observed: np.ndarray) -> float:
    """The best-bin estimate of P(y = 1) for one class (module docstring); needs one observed positive."""
    n, m = len(scores), int(observed.sum())
    order = np.argsort(-scores, kind="mergesort")
    ordered = scores[order]
    last = np.r_[np.flatnonzero(ordered[1:] != ordered[:-1]), n - 1]  # cuts between distinct scores
    q_all = (last + 1) / n
    q_obs = np.cumsum(observed[order])[last] / m
    ratio = np.where(q_obs >= MIN_OBSERVED_SHARE, q_all / np.maximum(q_obs, 1e-12), np.inf)
    return float(min(1.0, ratio.min()))


def estimate_class_priors(scores: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Per-class prior estimates pi_c (C,) from held-out ``scores`` (N, C, any monotone scale: logits or
    probabilities) and their observed single-positive (or partial) 0/1 labels ``observed`` (N, C). A class with no
    observed positive gets 0 (nothing says it occurs)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(observed) > 0
    if s.ndim != 2 or s.shape != y.shape or len(s) == 0:
        raise ValueError(f"scores and observed must both be non-empty (N, C); got {s.shape} and {y.shape}")
    return np.array([_best_bin_prior(s[:, c], y[:, c]) if y[:, c].any() else 0.0
                     for c in range(s.shape[1])])


def estimate_expected_positives(scores: np.ndarray, observed: np.ndarray) -> float:
    """k = the sum of :func:`estimate_class_priors`."""
    return float(estimate_class_priors(scores, observed).sum())


def resolve_expected_positives(
    *,
    given: float | None = None,
    published: float | None = None,
    full_labels: np.ndarray | None = None,
    audit_labels: np.ndarray | None = None,
    estimate: float | None = None,
    estimate_detail: str = "",
) -> ExpectedPositives:
    """k from the first available source, in the order of :data:`K_SOURCES` (module docstring):
    ``full_labels`` the training (or validation) labels when they are full; ``audit_labels`` the audit list's;
    ``estimate`` a value of :func:`estimate_expected_positives`. ``ValueError`` when nothing is given."""
    if given is not None:
        return ExpectedPositives(float(given), "given", "--hp k")
    if published is not None:
        return ExpectedPositives(float(published), "published")
    if full_labels is not None:
        return ExpectedPositives(mean_positives(full_labels), "labels",
                                 f"mean of {len(full_labels)} fully labelled images")
    if audit_labels is not None:
        return ExpectedPositives(mean_positives(audit_labels), "audit", f"{len(audit_labels)} audited images")
    if estimate is not None:
        return ExpectedPositives(float(estimate), "estimated", estimate_detail)
    raise ValueError("no source for k: give --hp k, an audit list, full training labels or an estimate")
