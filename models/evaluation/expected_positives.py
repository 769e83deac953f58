"""The expected number of positives per image, k, and the class priors, without full labels (docs/choosing.md, "k").
:func:`resolve_expected_positives` takes the first source there is; :func:`estimate_k` estimates it from a model's
logits as the geometric mean of two best-bin estimates (after Garg et al., NeurIPS 2021), claimed within 25% only when
informative (:data:`MIN_INFORMATIVE`), narrow (:data:`BRACKET_RATIO`) and the model ranks well
(:data:`MIN_OBSERVED_RANK`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.evaluation.criteria import observed_rank
from models.registry import Row, Table

__all__ = [
    "BRACKET_RATIO", "CHOOSER_K", "K_SOURCES", "MIN_OBSERVED_RANK", "ExpectedPositives", "KEstimate",
    "estimate_class_priors", "estimate_expected_positives", "estimate_k", "mean_positives",
    "resolve_expected_positives"]

#: Where k came from, first source first; a row's value: whether k is known (given, published or counted on
#: labelled images) rather than estimated from one label per image.
K_SOURCES: Table[bool] = Table("source of k", [
    Row("given", "--hp k", True),
    Row("published", "the papers' value for a known dataset", True),
    Row("labels", "the mean of full training (else validation) labels", True),
    Row("audit", "the mean of a few fully labelled images (--audit)", True),
    Row("estimated", "estimated from one label per image (estimate_k)", False),
])
#: the detail of an estimate that ``--method auto`` made from cross-fitted scores (a run keeps it, not re-estimated)
CHOOSER_K = "--method auto"
#: what a user does when the estimate is not good enough (measured: docs/your-data.md, k)
AUDIT_ADVICE = "20 images labelled completely (--audit) put k within 25% of the truth"
#: The least share of a class's observed positives a cut must keep (module docstring).
MIN_OBSERVED_SHARE = 0.25
#: The widest bracket ``high / low`` within which k is said to be known within 25% (module docstring).
BRACKET_RATIO = 1.5
#: How far (on a log scale, from the value of shuffled labels down to 1) an estimate must be to count as informative.
MIN_INFORMATIVE = 0.5
#: The least ``observed-rank`` (percent) of the model whose scores k is claimed from (docs/choosing.md, k: how it was
#: set on the development sets, and that it is not yet checked on a set it was not fitted on).
MIN_OBSERVED_RANK = 45.0
#: Seed of the shuffle of the uninformed estimate.
SHUFFLE_SEED = 0


@dataclass(frozen=True)
class KEstimate:
    """k estimated from one label per image: the ``low`` and ``high`` estimates, the ``uninformed`` one (labels
    shuffled) and the model's observed-``rank`` (None in older records)."""

    low: float
    high: float
    uninformed: float
    rank: float | None = None

    @property
    def k(self) -> float:
        """The estimate: ``sqrt(low x high)``."""
        return float(math.sqrt(self.low * self.high))

    @property
    def narrow(self) -> bool:
        """``high / low`` at most :data:`BRACKET_RATIO`."""
        return self.high <= BRACKET_RATIO * self.low

    @property
    def informativeness(self) -> float:
        """How far the estimate is from the uninformed value towards 1, on a log scale (1: at 1; 0: no closer)."""
        if self.uninformed <= 1.0:
            return 0.0
        return float(math.log(self.uninformed / self.k) / math.log(self.uninformed))

    @property
    def ranks_well(self) -> bool:
        """The model's observed-rank reaches :data:`MIN_OBSERVED_RANK` (unknown in older records: not asked)."""
        return self.rank is None or self.rank >= MIN_OBSERVED_RANK

    @property
    def within_25(self) -> bool:
        """Narrow, informative and from a model that ranks well: the run says k is within 25%."""
        return self.narrow and self.informativeness >= MIN_INFORMATIVE and self.ranks_well


@dataclass(frozen=True)
class ExpectedPositives:
    """k and where it came from (one of :data:`K_SOURCES`), with a short detail for the start-of-run print."""

    k: float
    source: str
    detail: str = ""
    estimate: KEstimate | None = None  # how an estimate was made (its bracket and uninformed value)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ExpectedPositives:
        """Inverse of :meth:`to_dict`."""
        rank = record.get("rank")
        estimate = (KEstimate(float(record["low"]), float(record["high"]), float(record["uninformed"]),
                              None if rank is None else float(rank))
                    if all(key in record for key in ("low", "high", "uninformed")) else None)
        return cls(float(record["k"]), str(record["source"]), str(record.get("detail", "")), estimate)

    def __post_init__(self) -> None:
        K_SOURCES.row(self.source)  # an unknown source: the one message listing them

    @property
    def known(self) -> bool:
        """Whether k is given, published or counted on labelled images, not estimated (:data:`K_SOURCES`)."""
        return K_SOURCES[self.source]

    def describe(self) -> str:
        """``k = 2.83 (estimated: ...)``."""
        return f"k = {self.k:.2f} ({self.source}" + (f": {self.detail})" if self.detail else ")")

    @property
    def within_25(self) -> bool:
        """Whether an estimate holds k within 25% by the rule of the module docstring."""
        return self.estimate is not None and self.estimate.within_25

    def caveat(self) -> str | None:
        """For an estimate: how far it may be from the truth and what brings it closer (None for other sources)."""
        if self.known:
            return None
        e = self.estimate
        if e is None:
            return f"k is estimated from the model's scores, not measured; {AUDIT_ADVICE}"
        if e.within_25:
            return (f"k is estimated from one label per image, within 25%: its two estimates are {e.low:.2f} and "
                    f"{e.high:.2f}, far from the {e.uninformed:.2f} of shuffled labels "
                    "(models/evaluation/expected_positives.py)")
        why = (f"its two estimates, {e.low:.2f} and {e.high:.2f}, differ too much" if not e.narrow else
               f"the model ranks the observed labels too low for its scores to tell (observed-rank {e.rank:.1f}, "
               f"below {MIN_OBSERVED_RANK:g})" if not e.ranks_well else
               f"the scores tell it little (shuffled labels give {e.uninformed:.2f})")
        return f"k cannot be told within 25% from one label per image here: {why}; {AUDIT_ADVICE}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (config.json, checkpoint metadata)."""
        out: dict[str, Any] = {"k": round(float(self.k), 4), "source": self.source, "detail": self.detail}
        if self.estimate is not None:
            out.update(low=round(self.estimate.low, 4), high=round(self.estimate.high, 4),
                       uninformed=round(self.estimate.uninformed, 4), within_25=self.within_25)
            if self.estimate.rank is not None:
                out["rank"] = round(self.estimate.rank, 2)
        return out


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
    """Per-class priors (C,) from held-out ``scores`` and their observed labels (0 without an observed positive)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(observed) > 0
    if s.ndim != 2 or s.shape != y.shape or len(s) == 0:
        raise ValueError(f"scores and observed must both be non-empty (N, C); got {s.shape} and {y.shape}")
    return np.array([_best_bin_prior(s[:, c], y[:, c]) if y[:, c].any() else 0.0
                     for c in range(s.shape[1])])




def _bracket(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The ``low`` and ``high`` pooled best-bin estimates of k (module docstring)."""
    classes = x.shape[1]
    low = classes * _best_bin_prior(x.ravel(), y.ravel())
    log_p = -np.logaddexp(0.0, -x)
    high = classes * _best_bin_prior((log_p - log_p.max(axis=1, keepdims=True)).ravel(), y.ravel())
    low = max(low, float(y.sum(1).mean()))  # an image has at least its observed positives
    return low, max(high, low)


def estimate_k(logits: np.ndarray, observed: np.ndarray) -> KEstimate:
    """k from ``logits`` (N, C; logits, not probabilities: the ``high`` estimate compares log-probabilities within an
    image) and their observed 0/1 labels (N, C, one or a few positives per image): :class:`KEstimate`."""
    x = np.asarray(logits, dtype=np.float64)
    y = np.asarray(observed) > 0
    if x.ndim != 2 or x.shape != y.shape or len(x) == 0 or not y.any():
        raise ValueError(f"logits and observed must both be non-empty (N, C) with a positive; got {x.shape}, "
                         f"{y.shape}")
    low, high = _bracket(x, y)
    shuffled = y[np.random.default_rng(SHUFFLE_SEED).permutation(len(y))]
    uninformed = math.sqrt(float(np.prod(_bracket(x, shuffled))))
    return KEstimate(low, high, uninformed, observed_rank(x, y.astype(np.float32)))


def estimate_expected_positives(logits: np.ndarray, observed: np.ndarray) -> float:
    """k = :func:`estimate_k`'s geometric mean."""
    return estimate_k(logits, observed).k


def resolve_expected_positives(*, given: float | None = None, published: float | None = None,
                               full_labels: np.ndarray | None = None, audit_labels: np.ndarray | None = None,
                               estimate: float | KEstimate | None = None,
                               estimate_detail: str = "") -> ExpectedPositives:
    """k from the first source of :data:`K_SOURCES` there is; ``ValueError`` when nothing is given."""
    if given is not None:
        return ExpectedPositives(float(given), "given", "--hp k")
    if published is not None:
        return ExpectedPositives(float(published), "published")
    if full_labels is not None:
        return ExpectedPositives(mean_positives(full_labels), "labels",
                                 f"mean of {len(full_labels)} fully labelled images")
    if audit_labels is not None:
        return ExpectedPositives(mean_positives(audit_labels), "audit", f"{len(audit_labels)} audited images")
    if isinstance(estimate, KEstimate):
        return ExpectedPositives(estimate.k, "estimated", estimate_detail, estimate)
    if estimate is not None:
        return ExpectedPositives(float(estimate), "estimated", estimate_detail)
    raise ValueError("no source for k: give --hp k, an audit list, full training labels or an estimate")
