"""Label regime per split: detected from the label matrix (single-positive / full) or declared (partial)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.data.label_regime import (
    NOT_AVAILABLE,
    describe_regimes,
    detect_regime,
    detect_regimes,
    parse_declared,
)

SINGLE = np.array([[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 1, 0]])  # one image unlabelled
FULL = np.array([[1, 1, 0], [0, 0, 1], [1, 1, 1], [0, 1, 0]])


def test_detects_single_positive_and_full() -> None:
    single = detect_regime(SINGLE, "val")
    assert (single.kind, single.source, single.images, single.max_positives) == ("single-positive", "detected", 4, 1)
    assert single.positives_per_image == pytest.approx(0.75) and not single.full
    full = detect_regime(FULL, "test")
    assert (full.kind, full.max_positives, full.full) == ("full", 3, True)
    assert full.positives_per_image == pytest.approx(1.75)


def test_declarations_override_detection_but_not_contradict_it() -> None:
    assert detect_regime(FULL, "train", "partial").kind == "partial"
    multiclass = detect_regime(SINGLE, "train", "full")  # complete one-class-per-image data
    assert (multiclass.kind, multiclass.source, multiclass.full) == ("full", "declared", True)
    assert detect_regime(SINGLE, "train", "single").kind == "single-positive"
    with pytest.raises(ValueError, match="declared single-positive, but an image has 3 positives"):
        detect_regime(FULL, "train", "single-positive")
    with pytest.raises(ValueError, match="use auto, full, single-positive, partial"):
        parse_declared("most")


def test_regimes_of_all_splits_line_and_json() -> None:
    regimes = detect_regimes({"train": SINGLE, "val": SINGLE[:2], "test": FULL, "extra": None})
    assert list(regimes) == ["train", "val", "test"]
    line = describe_regimes(regimes)
    assert line.startswith("labels: train single-positive (4 images, 0.75 positives/image, detected); val ")
    assert "test full (4 images, 1.75 positives/image, detected)" in line
    assert line.endswith(f"val has no full labels: figures that need them read {NOT_AVAILABLE}")
    assert "n/a" not in describe_regimes(detect_regimes({"val": FULL}))
    saved = json.loads(json.dumps({k: r.to_dict() for k, r in regimes.items()}))
    assert saved["test"] == {"kind": "full", "source": "detected", "images": 4, "positives_per_image": 1.75,
                             "max_positives": 3, "known_negatives": 0}
    with pytest.raises(ValueError, match="2-D"):
        detect_regime(np.zeros(3), "val")
