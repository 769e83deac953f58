"""Selection criteria for single-positive val labels (train.label_free_selection): hand-computed values,
agreement with brute force, a better model ranked higher, the defaults."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from train.label_free_selection import (
    DESCRIPTIONS,
    LABEL_FREE_CRITERIA,
    an_loss_score,
    default_criterion,
    observed_auc,
    observed_map,
    observed_rank,
)
from train.metrics import mean_average_precision

# 4 images, 2 classes; one observed positive per image
LOGITS = np.array([[2.0, 1.0], [0.5, 3.0], [1.0, 1.0], [-1.0, 0.0]])
OBSERVED = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])


def brute_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    pairs = list(itertools.product(scores[positive], scores[~positive]))
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def test_hand_computed_values() -> None:
    # class 0: positives {2.0, 1.0} vs {0.5, -1.0}: 4/4; class 1: positives {3.0, 0.0} vs {1.0, 1.0}: 2/4
    assert observed_auc(LOGITS, OBSERVED) == pytest.approx(75.0)
    # observed positive ranks within the image: 1, 1, 2 (tie, pessimistic), 1
    assert observed_rank(LOGITS, OBSERVED) == pytest.approx(100 * (1 + 1 + 0.5 + 1) / 4)
    # class 0: observed positives 2.0 and 1.0 rank first and second: AP 1; class 1: 3.0 first, 0.0 fourth: (1 + 2/4) / 2
    assert observed_map(LOGITS, OBSERVED) == pytest.approx(100 * (1 + 0.75) / 2)
    loss = np.mean(np.logaddexp(0, -LOGITS) * OBSERVED + np.logaddexp(0, LOGITS) * (1 - OBSERVED))
    assert an_loss_score(LOGITS, OBSERVED) == pytest.approx(-loss)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_brute_force_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(size=(60, 4)), 1)  # many ties
    labels = (rng.random((60, 4)) < 0.3).astype(np.uint8)
    labels[0] = 1  # every class has a positive
    labels[1] = 0  # and a negative
    expected = np.mean([brute_auc(logits[:, c], labels[:, c] > 0) for c in range(4)])
    assert observed_auc(logits, labels) == pytest.approx(100 * expected)


def test_a_better_model_scores_higher() -> None:
    """Scores that follow the full labels more closely score higher on single-positive labels under the ranking
    criteria (and mAP); the assume-negative loss punishes confident unobserved positives instead, and prefers
    the model closer to the observation probabilities AN trains towards."""
    rng = np.random.default_rng(0)
    full = (rng.random((500, 6)) < 0.3).astype(np.uint8)
    full[full.sum(1) == 0, 0] = 1
    observed = np.zeros_like(full)
    observed[np.arange(500), [rng.choice(np.flatnonzero(r)) for r in full]] = 1
    noise = rng.normal(size=full.shape)
    good, poor = 3.0 * full + noise, 1.0 * full + noise
    for criterion in (observed_auc, observed_rank, mean_average_precision):
        assert criterion(good, observed) > criterion(poor, observed), criterion.__name__
    assert an_loss_score(good, observed) < an_loss_score(poor, observed)
    # models of what AN learns, the chance that a class is the observed one (y / k), mixed with a uniform guess:
    # an-loss prefers the one closer to it
    target = full / full.sum(1, keepdims=True)
    sharp, blurred = (np.log(p / (1 - p)) for p in (w * target + (1 - w) / full.shape[1] for w in (0.9, 0.5)))
    assert an_loss_score(sharp, observed) > an_loss_score(blurred, observed)


def _single_positive(full: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    observed = np.zeros_like(full)
    observed[np.arange(len(full)), [rng.choice(np.flatnonzero(r)) for r in full]] = 1
    return observed


def test_a_run_whose_unobserved_scores_rise_is_not_stopped_at_epoch_1() -> None:
    """What EPR, ROLE, EM or GR-Loss do: epoch 1 scores the observed positive high and everything else low; later
    epochs raise the unobserved positives too (better on the full labels), the observed ones staying on top. The
    default label-free criterion must follow the full labels there, where the assume-negative loss picks epoch 1."""
    rng = np.random.default_rng(0)
    full = (rng.random((400, 8)) < 0.35).astype(np.uint8)
    full[full.sum(1) == 0, 0] = 1
    observed = _single_positive(full, rng)
    noise = rng.normal(size=full.shape)
    # epoch e: the model separates more (scale s) and lifts the unobserved positives more (u of the observed's)
    epochs = [s * (observed + u * (full - observed)) - 2.0 + noise for s, u in ((1.5, 0.1), (3, 0.5), (4, 0.7),
                                                                                  (5, 0.8))]
    full_map = [mean_average_precision(x, full) for x in epochs]
    assert full_map == sorted(full_map) and full_map[0] < full_map[1] - 20
    pick = {name: int(np.argmax([fn(x, observed) for x in epochs])) for name, fn in LABEL_FREE_CRITERIA.items()}
    assert pick["an-loss"] == 0  # the failure this guards against
    assert pick[default_criterion(False)] > 0
    assert pick["observed-map"] == pick["observed-auc"] == pick["observed-rank"] == 1


def test_registry_and_defaults() -> None:
    assert default_criterion(True) == "val_mAP" and default_criterion(False) == "observed-map"
    assert set(LABEL_FREE_CRITERIA) == set(DESCRIPTIONS) == {"an-loss", "observed-auc", "observed-rank",
                                                             "observed-map"}
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        observed_auc(LOGITS[:, :1], OBSERVED)
    assert math.isnan(observed_auc(LOGITS, np.zeros_like(OBSERVED)))
    assert math.isnan(observed_rank(LOGITS, np.zeros_like(OBSERVED)))
    assert math.isnan(observed_map(LOGITS, np.zeros_like(OBSERVED)))
