"""Per-class threshold calibration (export/calibrate.py): hand-computed cuts, brute-force references, the PU
criterion against full labels on the built-in dataset's label structure, the report and the plot."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.threshold_calibration import (
    THRESHOLD_MAX,
    THRESHOLD_MIN,
    Calibration,
    CalibrationMode,
    calibrate,
    calibration_report,
    default_mode,
    parse_mode,
    plot_pr_curves,
    write_report,
)

# ---------------------------------------------------------------------------------------------------------
# Independent brute-force references: loop over every distinct score as a cut "predict score >= cut".

Criterion = Callable[[int, int, int, int], float]  # (tp, n_pred, n_pos, n) -> value to maximise


def _f1(tp: int, n_pred: int, n_pos: int, n: int) -> float:
    return 2 * tp / (n_pred + n_pos)


def _lee_liu(tp: int, n_pred: int, n_pos: int, n: int) -> float:
    return (tp / n_pos) ** 2 / (n_pred / n)


def _brute_cut(scores: np.ndarray, labels: np.ndarray, criterion: Criterion) -> tuple[float, float]:
    """The best cut score (highest on ties) and the next lower distinct score (0.0 below the lowest)."""
    distinct = sorted(set(scores.tolist()), reverse=True)
    values = []
    for cut in distinct:
        pred = scores >= cut
        values.append(criterion(int((pred & labels).sum()), int(pred.sum()), int(labels.sum()), len(scores)))
    best = max(values)
    j = next(i for i, v in enumerate(values) if v >= best - 1e-12 * best)
    return distinct[j], (distinct[j + 1] if j + 1 < len(distinct) else 0.0)


def _class_f1(probs: np.ndarray, labels: np.ndarray, thresholds: np.ndarray | float) -> np.ndarray:
    """Per-class F1 (fraction) of ``probs >= thresholds`` against boolean ``labels``."""
    pred = probs >= thresholds
    tp = (pred & labels).sum(0)
    return 2 * tp / (pred.sum(0) + labels.sum(0))


# ---------------------------------------------------------------------------------------------------------
# Hand-made data for mode f1.
#
# class 0 (ties), n_pos = 5; positives are listed FIRST inside each tie group, so an implementation that
# cuts between tied items in input order would see "cuts" that do not exist:
#   score: .95  .7  .7  .7  .7  .4  .4  .2  .2  .05
#   label:  1    1   1   0   0   1   0   1   0   0
#   cut .95: tp 1, pred 1  -> F1 = 2/(1+5)   = .333
#   cut .7 : tp 3, pred 5  -> F1 = 6/(5+5)   = .600
#   cut .4 : tp 4, pred 7  -> F1 = 8/(7+5)   = .667
#   cut .2 : tp 5, pred 9  -> F1 = 10/(9+5)  = .714   <- best
#   cut .05: tp 5, pred 10 -> F1 = 10/(10+5) = .667
#   threshold = midpoint(.2, .05) = .125. (Splitting ties would give .75 after the two positives at .7 and
#   .769 after the positive at .2, and a different threshold.)
# class 1: no positive -> fallback.
# class 2: perfectly separated, positives .9 .8 .6 .55 .5, negatives .45 .3 .2 .1 .02 -> cut .5,
#   threshold midpoint(.5, .45) = .475.
# Fallback = micro-F1 over the 30 pooled entries (10 positives). Pooled cuts, (tp, pred):
#   .95 (1,1) .9 (2,2) .8 (3,3) .7 (5,7) .6 (6,8) .55 (7,9) .5 (8,10) .48 (8,11) .45 (8,12) .4 (9,14) ...
#   F1 = 2tp/(pred+10): ... .6: 12/18=.667, .55: 14/19=.737, .5: 16/20=.800, .48: 16/21=.762,
#   .45: 16/22=.727, .4: 18/24=.750, then tp <= 10 with pred >= 15 -> <= .8 (.2: 20/30 = .667)
#   -> best cut .5, next lower pooled score .48 (class 1) -> fallback threshold .49.

HAND_SCORES = np.array(
    [
        [0.95, 0.70, 0.70, 0.70, 0.70, 0.40, 0.40, 0.20, 0.20, 0.05],
        [0.48, 0.25, 0.20, 0.15, 0.10, 0.08, 0.06, 0.04, 0.03, 0.01],
        [0.90, 0.80, 0.60, 0.55, 0.50, 0.45, 0.30, 0.20, 0.10, 0.02],
    ]
).T
HAND_LABELS = np.array(
    [
        [1, 1, 1, 0, 0, 1, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
    ]
).T


def test_f1_mode_hand_computed_with_ties_and_fallback() -> None:
    cal = calibrate(HAND_SCORES, HAND_LABELS, "f1")
    assert isinstance(cal, Calibration)
    assert cal.mode == "f1"
    np.testing.assert_allclose(cal.thresholds, [0.125, 0.49, 0.475], rtol=0, atol=1e-12)
    assert cal.rules == ["f1", "fallback:micro-f1", "f1"]
    assert cal.positives == [5, 0, 5]
    assert cal.min_positives == 5
    assert cal.fallback_threshold == pytest.approx(0.49, abs=1e-12)
    # the decisions reproduce the hand-computed optimum of class 0 (F1 = 10/14)
    pred0 = HAND_SCORES[:, 0] >= cal.thresholds[0]
    tp0 = int((pred0 & (HAND_LABELS[:, 0] == 1)).sum())
    assert (tp0, int(pred0.sum())) == (5, 9)
    assert json.loads(json.dumps(cal.to_dict())) == {
        "mode": "f1",
        "thresholds": cal.thresholds,
        "rules": cal.rules,
        "positives": [5, 0, 5],
        "min_positives": 5,
        "fallback_threshold": cal.fallback_threshold,
    }


def test_min_positives_moves_classes_to_the_fallback() -> None:
    cal = calibrate(HAND_SCORES, HAND_LABELS, "f1", min_positives=6)  # class 0 and 2 have 5 positives
    assert cal.rules == ["fallback:micro-f1"] * 3
    np.testing.assert_allclose(cal.thresholds, [0.49] * 3, atol=1e-12)
    cal = calibrate(HAND_SCORES, HAND_LABELS, "f1", min_positives=1)
    assert cal.rules == ["f1", "fallback:micro-f1", "f1"]  # 0 positives always falls back


def test_no_positive_anywhere_falls_back_to_one_half() -> None:
    cal = calibrate(HAND_SCORES, np.zeros_like(HAND_LABELS), "f1")
    assert cal.thresholds == [0.5, 0.5, 0.5]
    assert cal.rules == ["fallback:0.5"] * 3
    assert cal.fallback_threshold == 0.5


def test_midpoint_makes_decisions_robust_to_float_noise() -> None:
    cal = calibrate(HAND_SCORES, HAND_LABELS, "f1")
    t = np.array(cal.thresholds)
    rng = np.random.default_rng(0)
    noisy = HAND_SCORES + rng.uniform(-1e-6, 1e-6, HAND_SCORES.shape)  # runtime-to-runtime differences
    expected = np.greater_equal(HAND_SCORES, t)
    np.testing.assert_array_equal(noisy >= t, expected)


def test_adjacent_floats_use_the_score_itself_and_extremes_are_clamped() -> None:
    below = np.nextafter(0.5, 0.0)
    scores = np.array([[0.5, below, 0.1, 0.1, 0.1, 0.2]]).T
    labels = np.array([[1, 0, 0, 0, 0, 0]]).T
    cal = calibrate(scores, labels, "f1", min_positives=1)
    assert cal.thresholds == [0.5]  # the midpoint of adjacent floats would round onto one of them
    assert ((scores[:, 0] >= cal.thresholds[0]) == (labels[:, 0] == 1)).all()
    # a positive at 1.0 and a negative a hair below: the threshold is clamped to 1 - 1e-6
    scores = np.array([[1.0, 1.0 - 1e-9, 0.3]]).T
    cal = calibrate(scores, np.array([[1, 0, 0]]).T, "f1", min_positives=1)
    assert cal.thresholds == [THRESHOLD_MAX]
    # every item positive, lowest score tiny: the midpoint with 0 is clamped to 1e-6
    scores = np.array([[1e-9, 0.9]]).T
    cal = calibrate(scores, np.array([[1, 1]]).T, "f1", min_positives=1)
    assert cal.thresholds == [THRESHOLD_MIN]


@pytest.mark.parametrize("seed", range(3))
def test_f1_and_pu_match_brute_force_on_random_tied_data(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = (rng.random((60, 6)) < 0.3).astype(np.uint8)
    labels[:6, :] = 1  # every class has >= 6 positives: no fallback
    probs = np.round(np.clip(0.35 * labels + rng.random((60, 6)) * 0.7, 0, 1), 1)  # ~11 values: many ties
    for mode, criterion in (("f1", _f1), ("pu", _lee_liu)):
        cal = calibrate(probs, labels, mode)
        assert cal.rules == [mode] * 6
        for c in range(6):
            cut, lower = _brute_cut(probs[:, c], labels[:, c] == 1, criterion)
            assert cal.thresholds[c] == pytest.approx((cut + lower) / 2, abs=1e-12), (mode, c)


# ---------------------------------------------------------------------------------------------------------
# Mode pu on hand-made data. Observed positives (o) among 10 images, n_obs = 4, and a tie at .5:
#   score: .9  .8  .7  .6  .5  .5  .3  .2  .1  .05
#   obs:    o   .   o   .   o   .   .   .   o   .
#   cut  r     P    r^2/P          cut  r    P    r^2/P
#   .9   1/4   .1   .625           .3   3/4  .7   .804
#   .8   1/4   .2   .3125          .2   3/4  .8   .703
#   .7   2/4   .3   .833           .1   1    .9   1.111   <- best
#   .6   2/4   .4   .625           .05  1    1    1.000
#   .5   3/4   .6   .9375
# threshold = midpoint(.1, .05) = .075. Splitting the tie at .5 (observed first) would give r = 3/4 at
# P = .5, i.e. 1.125, and the wrong threshold.


def test_pu_mode_hand_computed() -> None:
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.5, 0.3, 0.2, 0.1, 0.05]]).T
    observed = np.array([[1, 0, 1, 0, 1, 0, 0, 0, 1, 0]]).T
    cal = calibrate(scores, observed, "pu", min_positives=4)
    assert cal.mode == "pu" and cal.rules == ["pu"] and cal.positives == [4]
    assert cal.thresholds[0] == pytest.approx(0.075, abs=1e-12)
    cal = calibrate(scores, observed, "pu")  # 4 observed < 5: pooled Lee & Liu = the same single class
    assert cal.rules == ["fallback:pooled-pu"]
    assert cal.thresholds[0] == pytest.approx(0.075, abs=1e-12)


# Mode pu-f1 on the same data: one class, so its prior is K itself; criterion 2 K r / (K + P).
#   K = .6: cut .1 (r 1, P .9) gives 1.2/1.5 = .8, the best (.5 tie: .9/1.2 = .75) -> threshold .075
#   K = .2: cut .7 (r 2/4, P .3) gives .2/.5 = .4, the best (.5: .3/.8 = .375; .1: .4/1.1 = .364) -> .65


def test_pu_f1_mode_hand_computed_and_priors_from_k() -> None:
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.5, 0.3, 0.2, 0.1, 0.05]]).T
    observed = np.array([[1, 0, 1, 0, 1, 0, 0, 0, 1, 0]]).T
    cal = calibrate(scores, observed, "pu-f1:0.6", min_positives=4)
    assert cal.mode == "pu-f1:0.6" and cal.rules == ["pu-f1:0.6"]
    assert cal.thresholds[0] == pytest.approx(0.075, abs=1e-12)
    cal = calibrate(scores, observed, "pu-f1", min_positives=4, expected_positives=0.2)
    assert cal.mode == "pu-f1:0.2" and cal.thresholds[0] == pytest.approx(0.65, abs=1e-12)
    assert calibrate(scores, observed, "pu-f1:0.2").rules == ["fallback:pooled-pu-f1"]  # 4 < 5 observed
    # two classes: each prior is K times the class's share of the observed labels, so a larger K lowers both
    two = np.hstack([scores, scores[::-1]])
    obs2 = np.hstack([observed, observed[::-1]])
    low, high = (np.array(calibrate(two, obs2, "pu-f1", min_positives=4, expected_positives=k).thresholds)
                 for k in (0.4, 1.2))
    np.testing.assert_allclose(low, [0.65, 0.65], atol=1e-12)  # prior .2 each, as above
    np.testing.assert_allclose(high, [0.075, 0.075], atol=1e-12)  # prior .6 each
    with pytest.raises(ValueError, match="pu-f1 needs the expected number of positives"):
        calibrate(scores, observed, "pu-f1")


# ---------------------------------------------------------------------------------------------------------
# Mode recall:R. Ten positives at .95 .9 ... .5 (step .05) and five negatives at .92 .78 .62 .52 .3.
#   recall:0.7  -> 7 positives needed -> cut at the 7th positive
#                  .65, next lower score .62 -> threshold .635
#   recall:0.75 -> 8 needed -> cut .6, next lower .55 -> .575
#   recall:1    -> 10 needed -> cut .5, next lower .3 -> .4
#   recall:0.05 -> 1 needed -> cut .95, next lower .92 -> .935

RECALL_POS = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5]
RECALL_NEG = [0.92, 0.78, 0.62, 0.52, 0.3]


@pytest.mark.parametrize(
    ("mode", "expected"), [("recall:0.7", 0.635), ("recall:0.75", 0.575), ("recall:1", 0.4), ("recall:0.05", 0.935)]
)
def test_recall_mode_hand_computed(mode: str, expected: float) -> None:
    scores = np.array([RECALL_POS + RECALL_NEG]).T
    labels = np.array([[1] * 10 + [0] * 5]).T
    cal = calibrate(scores, labels, mode)
    assert cal.rules == [str(parse_mode(mode))]
    assert cal.thresholds[0] == pytest.approx(expected, abs=1e-12)
    r = float(mode.split(":")[1])
    recall = (np.array(RECALL_POS) >= cal.thresholds[0]).mean()
    assert recall >= r - 1e-12
    # the next higher cut (the smallest score above the chosen cut) no longer reaches R
    cut = min(s for s in RECALL_POS + RECALL_NEG if s >= cal.thresholds[0])
    above = [s for s in RECALL_POS + RECALL_NEG if s > cut]
    recall_above = (np.array(RECALL_POS) >= min(above)).mean() if above else 0.0
    assert recall_above < r


def test_rate_mode_tags_k_per_image_in_the_shares_of_the_observed_labels() -> None:
    """rate:K: each class tags the share K x (n_c + 1) / (sum n + C) of the validation images (nearest cut), so
    the images get K tags on average whatever the scale of the scores; a class never observed still gets its
    pseudo-count's share; above every score when that share rounds to no image."""
    rng = np.random.default_rng(0)
    n, c = 200, 4
    probs = rng.random((n, c)) ** np.array([1.0, 3.0, 0.3, 2.0])  # four different score scales
    observed = np.zeros((n, c), dtype=int)
    observed[np.arange(n), rng.choice(3, n, p=[0.5, 0.3, 0.2])] = 1  # class 3 never observed
    cal = calibrate(probs, observed, "rate:2")
    counts = observed.sum(0)
    expected = 2 * (counts + 1) / (n + c) * n
    tagged = (probs >= np.array(cal.thresholds)).sum(0)
    assert np.all(np.abs(tagged - expected) <= 1) and tagged[3] >= 1
    assert cal.mode == "rate:2" and cal.rules == ["rate:2"] * c
    assert abs((probs >= np.array(cal.thresholds)).sum(1).mean() - 2) < 0.05
    tiny = calibrate(probs[:, :1], observed[:, :1], "rate:0.001")  # 0.001 x 200 images rounds to none
    assert (probs[:, :1] >= tiny.thresholds[0]).sum() == 0
    assert calibrate(probs, observed, "rate", expected_positives=1.5).mode == "rate:1.5"
    with pytest.raises(ValueError, match="rate needs the expected number of positives"):
        calibrate(probs, observed, "rate")


def test_recall_mode_float_product_just_above_an_integer() -> None:
    # 50 positives at .99, .98, ..., .50; recall:0.14 needs 7 of them, but 0.14 * 50 = 7.000000000000001 in
    # floats (a bare ceil would ask for 8): cut at the 7th positive .93, next lower .92 -> threshold .925
    scores = np.array([[0.99 - 0.01 * i for i in range(50)] + [0.1]]).T
    labels = np.array([[1] * 50 + [0]]).T
    cal = calibrate(scores, labels, "recall:0.14")
    assert cal.thresholds[0] == pytest.approx(0.925, abs=1e-9)


def test_criterion_ties_prefer_the_highest_threshold() -> None:
    # positive .9, negatives .8 .7, positive .6; n_pos = 2 (min_positives=1 to calibrate it):
    # cut .9: F1 = 2/(1+2) = .667, cut .8: 2/(2+2) = .5, cut .7: 2/(3+2) = .4, cut .6: 4/(4+2) = .667
    # -> exact tie between .9 and .6: the highest cut .9 wins -> threshold midpoint(.9, .8) = .85
    scores = np.array([[0.9, 0.8, 0.7, 0.6]]).T
    labels = np.array([[1, 0, 0, 1]]).T
    cal = calibrate(scores, labels, "f1", min_positives=1)
    assert cal.thresholds[0] == pytest.approx(0.85, abs=1e-12)


def test_recall_mode_fallback_is_pooled_recall() -> None:
    scores = np.array([RECALL_POS + RECALL_NEG, [0.1] * 15]).T
    labels = np.array([[1] * 10 + [0] * 5, [0] * 15]).T
    cal = calibrate(scores, labels, "recall:0.7")
    # pooled: the same 10 positives among 30 entries; the next lower pooled score below .65 is still .62
    assert cal.rules == ["recall:0.7", "fallback:pooled-recall:0.7"]
    np.testing.assert_allclose(cal.thresholds, [0.635, 0.635], atol=1e-12)


def test_fixed_threshold_modes() -> None:
    for text in ("threshold:0.3", "0.3", " Threshold:0.30 ", 0.3):
        cal = calibrate(HAND_SCORES, HAND_LABELS, text)
        assert cal.mode == "threshold:0.3"
        assert cal.thresholds == [0.3, 0.3, 0.3]
        assert cal.rules == ["fixed"] * 3
        assert cal.positives == [5, 0, 5]
        assert cal.fallback_threshold is None


def test_parse_mode_accepts_the_documented_forms() -> None:
    assert parse_mode("f1") == CalibrationMode("f1")
    assert parse_mode(" PU ") == CalibrationMode("pu")
    assert parse_mode("recall:0.9") == CalibrationMode("recall", 0.9)
    assert parse_mode("recall:1") == CalibrationMode("recall", 1.0)
    assert parse_mode("threshold:0.25") == CalibrationMode("threshold", 0.25)
    assert parse_mode("0.25") == CalibrationMode("threshold", 0.25)
    assert str(parse_mode("recall:0.90")) == "recall:0.9"
    assert parse_mode("pu-f1") == CalibrationMode("pu-f1")
    assert parse_mode("PU-F1:2.9") == CalibrationMode("pu-f1", 2.9)
    assert parse_mode("rate") == CalibrationMode("rate") and parse_mode("rate:2.5") == CalibrationMode("rate", 2.5)
    assert default_mode(True) == "f1" and default_mode(False) == "rate"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "use f1, pu"),
        ("f2", "use f1, pu"),
        ("recall", "use f1, pu"),
        ("recall:0", "0 < R <= 1"),
        ("recall:1.5", "0 < R <= 1"),
        ("recall:x", "0 < R <= 1"),
        ("recall:nan", "0 < R <= 1"),
        ("pu-f1:0", "K > 0"),
        ("pu-f1:x", "K > 0"),
        ("rate:0", "K > 0"),
        ("threshold:0", "0 < X < 1"),
        ("threshold:1", "0 < X < 1"),
        ("threshold:abc", "0 < X < 1"),
        ("1.5", "0 < X < 1"),
        ("-0.1", "0 < X < 1"),
        ("nan", "use f1, pu"),
        ("inf", "use f1, pu"),
    ],
)
def test_parse_mode_rejects_bad_values(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid calibration mode") as info:
        parse_mode(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("probs", "labels", "message"),
    [
        (np.full((4, 2), 0.5), np.zeros((4, 3)), "same shape"),
        (np.full(4, 0.5), np.zeros(4), "2-D"),
        (np.zeros((0, 2)), np.zeros((0, 2)), "at least one image"),
        (np.full((4, 2), 0.5), np.full((4, 2), 2), "0 or 1"),
        (np.full((4, 2), 0.5), np.full((4, 2), 0.5), "0 or 1"),
        (np.array([[0.5, np.nan]]), np.zeros((1, 2)), "NaN"),
        (np.array([[0.5, 3.0]]), np.zeros((1, 2)), "sigmoid"),
    ],
)
def test_calibrate_rejects_bad_input(probs: np.ndarray, labels: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calibrate(probs, labels, "f1")


def test_calibrate_rejects_bad_min_positives_and_mode() -> None:
    with pytest.raises(ValueError, match="min_positives"):
        calibrate(HAND_SCORES, HAND_LABELS, "f1", min_positives=0)
    with pytest.raises(ValueError, match="invalid calibration mode"):
        calibrate(HAND_SCORES, HAND_LABELS, "best")
    with pytest.raises(ValueError, match="0 < X < 1"):
        calibrate(HAND_SCORES, HAND_LABELS, 1.5)


# ---------------------------------------------------------------------------------------------------------
# pu against the full-label answer, on the built-in dataset's label structure.


def test_pu_thresholds_approach_the_full_label_optimum(builtin_cache: Path) -> None:
    """Full labels: the 280 images (train + test) of builtin:tiny, repeated 16 times so that each class has
    >= 43 observed positives (280 images alone leave rare classes with ~4 and make any recall estimate
    noise); every copy gets its own single observed positive from ``sample_observed`` and its own scores.
    Scores: positives ~ Beta(a_c, 1.5), negatives ~ Beta(1.5, a_c), a_c in [3, 8] per class, then raised to a
    per-class power g_c in [0.3, 3] (a monotone distortion, so the best threshold differs per class and is
    not 0.5).

    Reference: per-class F1-optimal thresholds on the FULL labels (the oracle). Wrong rule: F1 calibration
    that treats the unobserved labels as negatives. Over 40 seeds of this simulation (seen while writing the
    test): oracle macro-F1 minus PU macro-F1 was 0.004 to 0.022 (PU estimates recall from ~1/2.8 of the
    positives and optimises precision x recall, not F1), hence the 0.03 tolerance; the mean threshold shift
    from the oracle was -0.010 to +0.030 for PU and +0.046 to +0.106 for the wrong rule (it was higher than
    the oracle on >= 80% of the classes); PU beat the wrong rule's macro-F1 on every seed and 0.5 by >= 0.089.
    """
    from models.data.protocol import ObservedSpec, sample_observed
    from models.data.registry import load_dataset

    splits = load_dataset("builtin:tiny")
    assert splits.test is not None
    full = np.tile(np.concatenate([splits.train.labels, splits.test.labels]), (16, 1)).astype(bool)
    observed = sample_observed(full, ObservedSpec("single")).astype(bool)
    assert (observed <= full).all() and (observed.sum(1) == 1).all()
    num_classes = full.shape[1]

    rng = np.random.default_rng(0)
    a = rng.uniform(3.0, 8.0, num_classes)
    g = np.exp(rng.uniform(np.log(0.3), np.log(3.0), num_classes))
    probs = np.where(full, rng.beta(a, 1.5, size=full.shape), rng.beta(1.5, a, size=full.shape)) ** g

    oracle = calibrate(probs, full, "f1")
    pu = calibrate(probs, observed, "pu")
    pu_f1 = calibrate(probs, observed, "pu-f1", expected_positives=float(full.sum(1).mean()))
    wrong = calibrate(probs, observed, "f1")
    assert pu.rules == ["pu"] * num_classes  # every class has enough observed positives
    assert pu.positives == observed.sum(0).tolist()

    t_oracle, t_pu, t_wrong = (np.array(c.thresholds) for c in (oracle, pu, wrong))
    f1_oracle = _class_f1(probs, full, t_oracle).mean()
    f1_pu = _class_f1(probs, full, t_pu).mean()
    f1_wrong = _class_f1(probs, full, t_wrong).mean()
    f1_half = _class_f1(probs, full, 0.5).mean()

    assert f1_pu >= f1_oracle - 0.03
    assert _class_f1(probs, full, np.array(pu_f1.thresholds)).mean() >= f1_oracle - 0.03  # 0.008 in this draw
    assert f1_pu > f1_wrong
    assert f1_pu > f1_half + 0.05
    assert abs(np.mean(t_pu - t_oracle)) < 0.035  # PU: no systematic bias
    assert np.mean(t_wrong - t_oracle) > 0.04  # unobserved-as-negative: thresholds too high
    assert np.mean(t_wrong > t_oracle) >= 0.8
    assert np.mean(t_wrong) > np.mean(t_pu) + 0.02


# ---------------------------------------------------------------------------------------------------------
# Report. 4 images, 2 classes, thresholds (.5, .3):
#   probs  cat  dog|x     labels cat dog|x
#          .9   .2               1   0
#          .6   .45              0   1
#          .4   .7               1   1
#          .1   .35              0   0
# at 0.5: cat pred {0,1}: tp 1, pred 2, pos 2 -> P 50, R 50, F1 50
#         dog pred {2}:   tp 1, pred 1, pos 2 -> P 100, R 50, F1 66.67
#         overall tp 2, pred 3, pos 4 -> OP 66.67, OR 50, OF1 4/7 = 57.14
#         CP 75, CR 50, CF1 2*.75*.5/1.25 = 60
# calibrated: cat as above; dog (.3) pred {1,2,3}: tp 2, pred 3 -> P 66.67, R 100, F1 80
#         overall tp 3, pred 5, pos 4 -> OP 60, OR 75, OF1 .9/1.35 = 66.67
#         CP 58.33, CR 75, CF1 2*(7/12)*.75/(7/12+.75) = 65.625

REPORT_PROBS = np.array([[0.9, 0.2], [0.6, 0.45], [0.4, 0.7], [0.1, 0.35]])
REPORT_LABELS = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
REPORT_CLASSES = ["cat", "dog|x"]


def _report() -> dict[str, Any]:
    return calibration_report(
        REPORT_PROBS, REPORT_LABELS, [0.5, 0.3], REPORT_CLASSES, mode="f1", rules=["f1", "fallback:micro-f1"]
    )


def test_report_values_hand_computed() -> None:
    rep = _report()
    assert rep["mode"] == "f1" and rep["num_images"] == 4 and rep["num_classes"] == 2
    expected = {
        "at_0.5": {"OP": 200 / 3, "OR": 50, "OF1": 400 / 7, "CP": 75, "CR": 50, "CF1": 60},
        "calibrated": {"OP": 60, "OR": 75, "OF1": 200 / 3, "CP": 175 / 3, "CR": 75, "CF1": 65.625},
    }
    for key, values in expected.items():
        for name, value in values.items():
            assert rep["overall"][key][name] == pytest.approx(value, abs=1e-9), (key, name)
    cat, dog = rep["per_class"]
    assert cat["class"] == "cat" and cat["positives"] == 2 and cat["threshold"] == 0.5 and cat["rule"] == "f1"
    assert cat["at_0.5"] == pytest.approx({"precision": 50, "recall": 50, "f1": 50})
    assert cat["calibrated"] == pytest.approx({"precision": 50, "recall": 50, "f1": 50})
    assert dog["threshold"] == 0.3 and dog["rule"] == "fallback:micro-f1"
    assert dog["at_0.5"] == pytest.approx({"precision": 100, "recall": 50, "f1": 200 / 3})
    assert dog["calibrated"] == pytest.approx({"precision": 200 / 3, "recall": 100, "f1": 80})


def test_report_rejects_mismatched_thresholds_and_classes() -> None:
    with pytest.raises(ValueError, match="one threshold per class"):
        calibration_report(REPORT_PROBS, REPORT_LABELS, [0.5, 0.3, 0.2], REPORT_CLASSES)
    with pytest.raises(ValueError, match="class names"):
        calibration_report(REPORT_PROBS, REPORT_LABELS, [0.5, 0.3], ["cat"])


def test_write_report_writes_markdown_and_json(tmp_path: Path) -> None:
    rep = _report()
    md, js = tmp_path / "out" / "calibration.md", tmp_path / "out" / "calibration.json"
    write_report(rep, md, js)
    assert json.loads(js.read_text(encoding="utf-8")) == rep
    text = md.read_text(encoding="utf-8")
    assert "| 0.5 for every class | 66.67 | 50.00 | 57.14 | 75.00 | 50.00 | 60.00 |" in text
    assert "| calibrated | 60.00 | 75.00 | 66.67 | 58.33 | 75.00 | 65.62 |" in text
    assert "| dog\\|x | 2 | 0.3000 | fallback:micro-f1 | 100.00 | 50.00 | 66.67 | 66.67 | 100.00 | 80.00 |" in text


def test_plot_pr_curves_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots" / "pr.png"
    cal = calibrate(HAND_SCORES, HAND_LABELS, "f1")  # class 1 has no positive: a "no positives" panel
    assert plot_pr_curves(HAND_SCORES, HAND_LABELS, cal.thresholds, ["a", "b", "c"], out) is True
    data = out.read_bytes()
    assert len(data) > 1000 and data.startswith(b"\x89PNG")


def test_plot_pr_curves_without_matplotlib_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes any matplotlib import raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "pr.png"
    assert plot_pr_curves(HAND_SCORES, HAND_LABELS, [0.5, 0.5, 0.5], ["a", "b", "c"], out) is False
    assert not out.exists()
    assert "matplotlib is not installed" in capsys.readouterr().err
