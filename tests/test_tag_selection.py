"""Tag selection modes on known scores: thresholds, MCut, top-k, the cap and the floor."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from serve.outputs.selection_modes import (
    Selection,
    make_selection,
    mcut_threshold,
    parse_mode,
    select_classes,
    selection_from_dict,
    selection_type,
)

SCORES = np.array([0.91, 0.05, 0.62, 0.58, 0.10, 0.33])
THRESHOLDS = np.array([0.5, 0.5, 0.6, 0.6, 0.05, 0.9])


def test_thresholds_mode_uses_per_class_thresholds_highest_first() -> None:
    assert select_classes(SCORES, THRESHOLDS, Selection()) == [0, 2, 4]


def test_mcut_keeps_the_classes_above_the_largest_gap() -> None:
    # sorted: .91 .62 .58 .33 .10 .05 -> gaps .29 .04 .25 .23 .05: the largest is between .91 and .62
    assert mcut_threshold(SCORES) == pytest.approx(0.765)
    assert select_classes(SCORES, None, Selection("mcut")) == [0]
    # a confident cluster of three
    scores = np.array([0.2, 0.81, 0.15, 0.9, 0.85, 0.1])
    assert select_classes(scores, None, Selection("mcut")) == [3, 4, 1]


def test_mcut_edge_cases() -> None:
    assert mcut_threshold(np.array([0.7])) == 1.0
    assert select_classes(np.array([0.4, 0.4, 0.4]), None, Selection("mcut")) == []  # no gap: nothing stands out


def test_top_k_ignores_thresholds_and_breaks_ties_by_class_order() -> None:
    assert select_classes(SCORES, THRESHOLDS, Selection("top-k", k=2)) == [0, 2]
    assert select_classes(np.array([0.3, 0.5, 0.5, 0.1]), None, Selection("top-k", k=2)) == [1, 2]


def test_cap_and_floor_combine_with_every_mode() -> None:
    assert select_classes(SCORES, THRESHOLDS, Selection(max_tags=2)) == [0, 2]
    assert select_classes(SCORES, THRESHOLDS, Selection(min_score=0.2)) == [0, 2]
    assert select_classes(SCORES, None, Selection("top-k", k=5, min_score=0.3)) == [0, 2, 3, 5]
    assert select_classes(SCORES, None, Selection("top-k", k=5, max_tags=3)) == [0, 2, 3]
    low = np.array([0.04, 0.011, 0.010, 0.009])  # MCut cuts between .04 and .011: the floor removes it
    assert select_classes(low, None, Selection("mcut")) == [0]
    assert select_classes(low, None, Selection("mcut", min_score=0.05)) == []


def test_scores_are_compared_as_stored() -> None:
    # 0.4999996 is stored as 0.5 and so reaches a 0.5 threshold, as its record shows
    assert select_classes(np.array([0.4999996]), np.array([0.5]), Selection()) == [0]


def test_parsing_and_round_trip() -> None:
    assert parse_mode("MCut") == ("mcut", None)
    assert parse_mode("top-k:3") == ("top-k", 3)
    sel = make_selection("top-k:3", max_tags=2, min_score=0.1)
    assert sel == Selection("top-k", 3, 2, 0.1)
    assert selection_from_dict(sel.to_dict()) == sel
    assert sel.describe() == "top-3, at most 2 tags, score >= 0.1"
    for bad in ("top-k", "top-k:0", "rcut", "top-k:x"):
        with pytest.raises(ValueError, match="thresholds, mcut or top-k:K"):
            parse_mode(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        selection_type("best")
    with pytest.raises(ValueError, match="must be >= 1"):
        Selection(max_tags=0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Selection(min_score=1.5)
    with pytest.raises(ValueError, match="needs per-class thresholds"):
        select_classes(SCORES, None, Selection())
