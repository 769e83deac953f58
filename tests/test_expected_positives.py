"""k (expected positives per image) and class priors without full labels: the best-bin estimator on simulated
single-positive data, and where k comes from."""

from __future__ import annotations

import numpy as np
import pytest

from models.data.protocol import ObservedSpec, sample_observed
from models.evaluation.criteria import observed_rank
from models.evaluation.expected_positives import (
    MIN_OBSERVED_RANK,
    ExpectedPositives,
    KEstimate,
    estimate_class_priors,
    estimate_expected_positives,
    estimate_k,
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


def single_positive_logits(full: np.ndarray, noise: float, seed: int = 0) -> np.ndarray:
    """Logits of a model trained on one label per image: an image with n labels gets about 1/n for each of them
    (what such a model learns), the others little, plus normal noise of sd ``noise`` on the logit scale."""
    rng = np.random.default_rng(seed)
    n = np.maximum(full.sum(1, keepdims=True), 1)
    p = np.clip(np.where(full > 0, 1.0 / n, 0.01), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p)) + noise * rng.standard_normal(full.shape)


def test_per_class_best_bin_recovers_priors_from_a_good_ranking() -> None:
    """Scores that rank positives well (4 sd apart): every per-class prior within 0.03 (the diagnostic)."""
    full, observed, scores = simulated(4000, separation=4.0)
    assert np.abs(estimate_class_priors(scores, observed) - full.mean(0)).max() < 0.03


def with_label_counts(counts: list[int], n: int, classes: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Full labels where each image has one of ``counts`` labels (drawn uniformly), and one observed per image."""
    rng = np.random.default_rng(seed)
    full = np.zeros((n, classes), dtype=np.uint8)
    for i, size in enumerate(rng.choice(counts, n)):
        full[i, rng.choice(classes, size, replace=False)] = 1
    return full, sample_observed(full, ObservedSpec("single"), seed=seed)


def test_k_from_a_model_that_separates_the_classes_is_within_25_percent_and_says_so() -> None:
    """Two labels on every image, a model that separates the classes: both estimates agree, far from what shuffled
    labels give; k within 25% and the rule says so."""
    full, observed = with_label_counts([2], 4000)
    estimate = estimate_k(single_positive_logits(full, noise=0.5), observed)
    assert estimate.within_25 and abs(estimate.k / 2.0 - 1) < 0.25
    assert estimate.narrow and estimate.informativeness > 0.5 and estimate.uninformed > 6
    assert estimate_expected_positives(single_positive_logits(full, noise=0.5), observed) == estimate.k
    assert estimate.rank == observed_rank(single_positive_logits(full, noise=0.5), observed) >= MIN_OBSERVED_RANK


def test_k_is_not_claimed_from_a_model_that_ranks_the_observed_labels_low() -> None:
    """A narrow, informative bracket from a model whose observed-rank is below the floor is not claimed (a weak model
    pushes both estimates up together), and the caveat says why; records made before the rank was kept still load
    with their old rule."""
    weak = KEstimate(4.05, 4.44, 65.8, rank=34.0)
    assert weak.narrow and weak.informativeness > 0.5 and not weak.within_25
    caveat = str(resolve_expected_positives(estimate=weak).caveat())
    assert "observed-rank 34.0" in caveat and "--audit" in caveat
    assert KEstimate(4.05, 4.44, 65.8, rank=MIN_OBSERVED_RANK).within_25
    k = resolve_expected_positives(estimate=weak)
    assert ExpectedPositives.from_dict(k.to_dict()).estimate == weak
    old = {key: value for key, value in k.to_dict().items() if key != "rank"}
    assert ExpectedPositives.from_dict(old).estimate == KEstimate(4.05, 4.44, 65.8) and ExpectedPositives.from_dict(
        old).within_25


def test_k_is_not_claimed_when_the_two_estimates_disagree() -> None:
    """One to four labels per image and a sharp model: the observed positives come more often from images with few
    labels (scored higher), so the low estimate falls towards 1 and the high one to about the harmonic mean; the
    bracket is wide and the rule does not claim the geometric mean."""
    full, observed = with_label_counts([1, 2, 3, 4], 4000)
    estimate = estimate_k(single_positive_logits(full, noise=0.5), observed)
    assert not estimate.narrow and not estimate.within_25
    assert "differ too much" in str(resolve_expected_positives(estimate=estimate).caveat())


def test_k_from_scores_that_know_nothing_is_not_claimed() -> None:
    """Scores unrelated to the labels: the estimate sits at the uninformed value and the rule says it cannot tell;
    the caveat asks for an audit list."""
    full, observed, _ = simulated(2000, separation=4.0)
    useless = np.random.default_rng(1).standard_normal(full.shape)
    estimate = estimate_k(useless, observed)
    assert estimate.informativeness < 0.2 and not estimate.within_25
    k = resolve_expected_positives(estimate=estimate, estimate_detail="val scores")
    assert k.source == "estimated" and k.estimate == estimate and not k.within_25
    assert "cannot be told within 25%" in str(k.caveat()) and "--audit" in str(k.caveat())
    assert ExpectedPositives.from_dict(k.to_dict()).to_dict() == k.to_dict()  # it travels in config.json
    with pytest.raises(ValueError, match="non-empty"):
        estimate_k(useless[:, :3], observed)


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
    assert "--audit" in str(seen[4].caveat())  # a bare estimate (no bracket) is not claimed
    with pytest.raises(ValueError, match="no source for k"):
        resolve_expected_positives()
    with pytest.raises(ValueError, match="unknown source"):
        ExpectedPositives(1.0, "guessed")
