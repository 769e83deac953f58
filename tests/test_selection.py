"""Model-selection criteria (train.selection): hand-computed values, agreement with brute force, defaults."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from train.selection import CRITERIA, default_criterion, get_criterion, observed_auc, observed_rank, score

# 4 images, 2 classes; one observed positive per image
LOGITS = np.array([[2.0, 1.0], [0.5, 3.0], [1.0, 1.0], [-1.0, 0.0]])
OBSERVED = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])


def brute_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    pairs = [(a, b) for a, b in itertools.product(scores[positive], scores[~positive])]
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def test_hand_computed_values() -> None:
    # class 0: positives {2.0, 1.0} vs {0.5, -1.0}: 4/4; class 1: positives {3.0, 0.0} vs {1.0, 1.0}: 2/4
    assert observed_auc(LOGITS, OBSERVED) == pytest.approx(75.0)
    # observed positive ranks within the image: 1, 1, 2 (tie, pessimistic), 1
    assert observed_rank(LOGITS, OBSERVED) == pytest.approx(100 * (1 + 1 + 0.5 + 1) / 4)
    loss = np.mean(np.logaddexp(0, -LOGITS) * OBSERVED + np.logaddexp(0, LOGITS) * (1 - OBSERVED))
    assert score("an-loss", LOGITS, OBSERVED) == pytest.approx(-loss)
    # AP class 0: ranks 2.0 (pos), 1.0 (pos) -> 1.0; class 1: 3.0 (pos), 1.0, 1.0 (ties), 0.0 (pos) -> (1 + 2/4)/2
    assert score("map", LOGITS, OBSERVED) == pytest.approx(100 * (1.0 + 0.75) / 2)
    assert score("observed-map", LOGITS, OBSERVED) == score("map", LOGITS, OBSERVED)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_brute_force_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(size=(60, 4)), 1)  # many ties
    labels = (rng.random((60, 4)) < 0.3).astype(np.uint8)
    labels[0] = 1  # every class has a positive
    labels[1] = 0  # and a negative
    expected = np.mean([brute_auc(logits[:, c], labels[:, c] > 0) for c in range(4)])
    assert observed_auc(logits, labels) == pytest.approx(100 * expected)


def test_criteria_rank_a_better_model_higher() -> None:
    """A model whose scores follow the full labels more closely scores higher on single-positive labels under
    every ranking criterion; the assume-negative loss does not (it punishes confident unobserved positives)."""
    rng = np.random.default_rng(0)
    full = (rng.random((500, 6)) < 0.3).astype(np.uint8)
    full[full.sum(1) == 0, 0] = 1
    observed = np.zeros_like(full)
    observed[np.arange(500), [rng.choice(np.flatnonzero(r)) for r in full]] = 1
    noise = rng.normal(size=full.shape)
    good, poor = 3.0 * full + noise, 1.0 * full + noise
    for name in ("observed-map", "observed-auc", "observed-rank"):
        assert score(name, good, observed) > score(name, poor, observed), name
    assert score("an-loss", good, observed) < score("an-loss", poor, observed)


def test_registry_and_defaults() -> None:
    assert default_criterion(True).name == "map" and default_criterion(True).needs_full_labels
    label_free = default_criterion(False)
    assert not label_free.needs_full_labels and label_free.name in CRITERIA
    with pytest.raises(ValueError, match="unknown selection criterion 'best'"):
        get_criterion("best")
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        score("observed-auc", LOGITS[:, :1], OBSERVED)
    assert math.isnan(observed_auc(LOGITS, np.zeros_like(OBSERVED)))
    assert math.isnan(observed_rank(LOGITS, np.zeros_like(OBSERVED)))
