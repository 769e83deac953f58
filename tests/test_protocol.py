"""The SPML protocol: observed-label sampling and the train/val split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from train.data.protocol import (
    ObservedSpec,
    build_protocol,
    parse_observed,
    sample_observed,
    split_train_val,
)
from train.data.types import DatasetSplits, LabelledImages


def _labels(n: int = 500, c: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < 0.25).astype(np.uint8)
    y[np.arange(n), rng.integers(0, c, n)] = 1  # at least one positive per row
    return y


def test_single_positive_keeps_exactly_one_true_positive_per_image() -> None:
    y = _labels()
    obs = sample_observed(y, ObservedSpec("single"))
    assert obs.shape == y.shape and obs.dtype == np.uint8
    assert (obs.sum(1) == 1).all()
    assert (obs <= y).all()  # only true positives are observed


def test_single_positive_is_fixed_and_matches_cole_reference() -> None:
    y = _labels()
    a = sample_observed(y, ObservedSpec("single"))
    b = sample_observed(y, ObservedSpec("single"))
    np.testing.assert_array_equal(a, b)  # same seed -> the same positive for every method and run
    # independent re-implementation of Cole et al.'s generate_observed_labels
    rng = np.random.RandomState(1200)
    ref = np.zeros_like(y)
    for i in range(len(y)):
        idx = np.nonzero(y[i])[0]
        rng.shuffle(idx)
        ref[i, idx[0]] = 1
    np.testing.assert_array_equal(a, ref)
    c = sample_observed(y, ObservedSpec("single"), seed=7)
    assert (a != c).any()


def test_single_positive_row_without_positive_stays_empty() -> None:
    y = np.array([[0, 0, 0], [0, 1, 1]], dtype=np.uint8)
    obs = sample_observed(y, ObservedSpec("single"))
    assert obs[0].sum() == 0 and obs[1].sum() == 1


def test_partial_keeps_labels_at_the_requested_rate_and_full_is_identity() -> None:
    y = _labels(4000)
    obs = sample_observed(y, parse_observed("partial:0.3"))
    assert (obs <= y).all()
    rate = obs.sum() / y.sum()
    assert 0.28 < rate < 0.32
    np.testing.assert_array_equal(sample_observed(y, parse_observed("full")), y)


@pytest.mark.parametrize("bad", ["partial:0", "partial:1.5", "partial:x", "some", ""])
def test_parse_observed_rejects_bad_values(bad: str) -> None:
    with pytest.raises(ValueError, match="observed"):
        parse_observed(bad)


def test_split_is_cole_split() -> None:
    train, val = split_train_val(101)
    assert len(val) == round(0.2 * 101) and len(train) == 101 - len(val)
    assert set(train).isdisjoint(val) and sorted([*train, *val]) == list(range(101))
    assert (np.diff(train) > 0).all() and (np.diff(val) > 0).all()
    perm = np.random.RandomState(1200).permutation(101)
    np.testing.assert_array_equal(val, np.sort(perm[101 - 20 :]))


def _splits(n: int = 100, explicit_val: bool = False) -> DatasetSplits:
    y = _labels(n, 5)
    classes = [f"c{i}" for i in range(5)]
    images = LabelledImages([Path(f"/x/{i}.jpg") for i in range(n)], y, classes)
    val = LabelledImages([Path(f"/v/{i}.jpg") for i in range(10)], _labels(10, 5, 3), classes) if explicit_val else None
    test = LabelledImages([Path(f"/t/{i}.jpg") for i in range(20)], _labels(20, 5, 1), classes)
    return DatasetSplits("toy", "toy:", classes, images, test=test, val=val)


def test_build_protocol_samples_before_split_and_keeps_val_and_test_full() -> None:
    ds = _splits()
    p = build_protocol(ds, ObservedSpec("single"))
    assert len(p.train) == 80 and len(p.val) == 20 and p.test is not None and len(p.test) == 20
    assert (p.train_observed.sum(1) == 1).all()
    # observed labels were sampled on the whole pool, then split (Cole's order)
    pool_obs = sample_observed(ds.train.labels, ObservedSpec("single"))
    tr, va = split_train_val(100)
    np.testing.assert_array_equal(p.train_observed, pool_obs[tr])
    np.testing.assert_array_equal(p.val.labels, ds.train.labels[va])  # val keeps the full labels
    assert p.fingerprint == build_protocol(_splits(), ObservedSpec("full")).fingerprint


def test_build_protocol_uses_an_explicit_val_split() -> None:
    p = build_protocol(_splits(explicit_val=True), ObservedSpec("single"))
    assert len(p.train) == 100 and len(p.val) == 10
