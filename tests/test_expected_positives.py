"""k (expected positives per image) and class priors without full labels: the best-bin estimator on simulated
single-positive data, and where k comes from."""

from __future__ import annotations

import numpy as np
import pytest

from train.data.protocol import ObservedSpec, sample_observed
from train.expected_positives import (
    ExpectedPositives,
    estimate_class_priors,
    estimate_expected_positives,
    mean_positives,
    resolve_expected_positives,
)

PRIORS = np.array([0.6, 0.4, 0.3, 0.2, 0.1, 0.05])


def simulated(n: int, separation: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full labels with PRIORS, one observed positive per image (the protocol's sampler), and scores where a
    positive scores ``separation`` higher on average (normal noise of sd 1)."""
    rng = np.random.default_rng(seed)
    full = (rng.random((n, len(PRIORS))) < PRIORS).astype(np.uint8)
    observed = sample_observed(full, ObservedSpec("single"), seed=seed)
    scores = separation * full + rng.standard_normal(full.shape)
    return full, observed, scores


def test_mean_positives() -> None:
    assert mean_positives(np.array([[1, 1, 0], [0, 0, 1]])) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="non-empty"):
        mean_positives(np.zeros((0, 3)))


def test_best_bin_recovers_priors_and_k_from_a_good_ranking() -> None:
    """Scores that rank positives well (4 sd apart): every prior within 0.03, k within 5% of the truth."""
    full, observed, scores = simulated(4000, separation=4.0)
    priors = estimate_class_priors(scores, observed)
    assert np.abs(priors - full.mean(0)).max() < 0.03
    k_true = full.sum(1).mean()
    assert abs(estimate_expected_positives(scores, observed) - k_true) < 0.05 * k_true
    # any monotone transform of the scores gives the same estimate (only the ranking counts)
    assert estimate_expected_positives(1 / (1 + np.exp(-scores)), observed) == pytest.approx(
        estimate_expected_positives(scores, observed))


def test_best_bin_is_an_upper_bound_that_loosens_with_a_weak_ranking() -> None:
    full, observed, strong = simulated(4000, separation=4.0)
    _, _, weak = simulated(4000, separation=1.0)
    k_true = full.sum(1).mean()
    k_strong, k_weak = (estimate_expected_positives(s, observed) for s in (strong, weak))
    assert k_true * 0.95 < k_strong < k_weak
    useless = np.random.default_rng(1).standard_normal(full.shape)  # no information: about 1 per class
    assert estimate_expected_positives(useless, observed) > 0.6 * len(PRIORS)


def test_class_without_observed_positive_gets_zero_and_bad_input_fails() -> None:
    _, observed, scores = simulated(500, separation=4.0)
    observed[:, 5] = 0
    assert estimate_class_priors(scores, observed)[5] == 0.0
    with pytest.raises(ValueError, match="non-empty"):
        estimate_class_priors(scores[:, :3], observed)


def test_resolve_order_and_description() -> None:
    labels = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1]])
    everything = {"given": 3.0, "published": 2.9, "full_labels": labels, "audit_labels": labels[:2],
                  "estimate": 2.2, "estimate_detail": "best-bin on 400 val images"}
    order = ["given", "published", "full_labels", "audit_labels", "estimate"]
    seen = []
    for drop in range(len(order)):
        kwargs = {k: v for k, v in everything.items() if k not in order[:drop]}
        seen.append(resolve_expected_positives(**kwargs))  # type: ignore[arg-type]
    assert [e.source for e in seen] == ["given", "published", "labels", "audit", "estimated"]
    assert [e.k for e in seen] == [3.0, 2.9, 2.0, 2.0, 2.2]
    assert seen[3].describe() == "k = 2.00 (audit: 2 audited images)"
    assert seen[4].to_dict() == {"k": 2.2, "source": "estimated", "detail": "best-bin on 400 val images"}
    # only an estimate says how far off it may be and that an audit list fixes it
    assert [e.caveat() is None for e in seen] == [True, True, True, True, False]
    assert "--audit" in str(seen[4].caveat()) and "within 25%" in str(seen[4].caveat())
    with pytest.raises(ValueError, match="no source for k"):
        resolve_expected_positives()
    with pytest.raises(ValueError, match="unknown source"):
        ExpectedPositives(1.0, "guessed")
