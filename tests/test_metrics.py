"""Metrics against scikit-learn and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from models.evaluation.metrics import evaluate, f1_scores, mean_average_precision, per_class_ap


@pytest.mark.parametrize("seed", range(5))
def test_ap_matches_sklearn_on_random_data(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = (rng.random((200, 7)) < 0.3).astype(int)
    scores = rng.normal(size=(200, 7)) + labels  # informative, continuous
    ours = per_class_ap(scores, labels)
    ref = [average_precision_score(labels[:, c], scores[:, c]) for c in range(7)]
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_ap_matches_sklearn_with_many_ties() -> None:
    rng = np.random.default_rng(1)
    labels = (rng.random((300, 4)) < 0.4).astype(int)
    scores = np.round(rng.random((300, 4)) + 0.3 * labels, 1)  # only ~14 distinct values: heavy ties
    ours = per_class_ap(scores, labels)
    ref = [average_precision_score(labels[:, c], scores[:, c]) for c in range(4)]
    np.testing.assert_allclose(ours, ref, atol=1e-12)


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """The AP of one class, through :func:`per_class_ap`."""
    return float(per_class_ap(scores[:, None], labels[:, None])[0])


def test_ap_hand_computed() -> None:
    # ranking: pos, neg, pos, neg -> precisions at the positives 1/1 and 2/3 -> AP = (1 + 2/3) / 2
    assert average_precision(np.array([0.9, 0.8, 0.7, 0.1]), np.array([1, 0, 1, 0])) == pytest.approx(5 / 6)
    # perfect and worst rankings
    assert average_precision(np.array([3.0, 2.0, 1.0]), np.array([1, 1, 0])) == pytest.approx(1.0)
    assert average_precision(np.array([3.0, 2.0, 1.0]), np.array([0, 0, 1])) == pytest.approx(1 / 3)


def test_class_without_positives_is_excluded_by_default_and_zero_in_paper_mode() -> None:
    labels = np.array([[1, 0], [0, 0], [1, 0]])
    scores = np.array([[0.9, 0.1], [0.2, 0.5], [0.8, 0.3]])
    ap = per_class_ap(scores, labels)
    assert ap[0] == pytest.approx(1.0) and math.isnan(ap[1])
    assert mean_average_precision(scores, labels) == pytest.approx(100.0)  # class 1 excluded
    assert mean_average_precision(scores, labels, empty="zero") == pytest.approx(50.0)  # papers: AP 0, averaged
    assert math.isnan(mean_average_precision(scores, np.zeros_like(labels)))
    out = evaluate(np.log(scores / (1 - scores)), labels, ["a", "b"])
    assert out["classes_without_positives"] == 1
    assert out["per_class_AP"] == {"a": pytest.approx(100.0), "b": None}
    assert out["mAP"] == pytest.approx(100.0) and out["mAP_zero_empty"] == pytest.approx(50.0)


def test_f1_hand_computed() -> None:
    labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    probs = np.array([[0.9, 0.6, 0.4], [0.2, 0.7, 0.1], [0.8, 0.3, 0.6], [0.1, 0.2, 0.3]])
    out = f1_scores(probs, labels, 0.5)
    # predictions: (0,0) (0,1) (1,1) (2,0) (2,2); TP: (0,0) (1,1) (2,0) -> 3 of 5 predicted, 3 of 5 positive
    assert out["OP"] == pytest.approx(60.0) and out["OR"] == pytest.approx(60.0) and out["OF1"] == pytest.approx(60.0)
    # per class: P = [2/2, 1/2, 0/1], R = [2/2, 1/2, 0/1]
    cp = (1 + 0.5 + 0) / 3
    assert out["CP"] == pytest.approx(100 * cp) and out["CR"] == pytest.approx(100 * cp)
    assert out["CF1"] == pytest.approx(100 * cp)
    # per-class thresholds: raising class 1's threshold to 0.65 removes its false positive
    out2 = f1_scores(probs, labels, np.array([0.5, 0.65, 0.5]))
    assert out2["OP"] == pytest.approx(75.0)


def test_evaluate_ranks_on_logits_without_saturation_ties() -> None:
    # sigmoid(40) == sigmoid(45) == 1.0 in float64: ranking on probabilities would tie these two entries
    logits = np.array([[45.0], [40.0], [39.0]])
    labels = np.array([[1], [0], [1]])
    assert evaluate(logits, labels)["mAP"] == pytest.approx(100 * average_precision(logits[:, 0], labels[:, 0]))
    assert evaluate(logits, labels)["mAP"] == pytest.approx(100 * (1 + 2 / 3) / 2)
