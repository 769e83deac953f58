"""The SPML protocol: observed labels, the train/val split and the val labels, compared value for value with the
reference code's outputs stored in tests/data/reference_protocol/ (see its README)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from reference_layouts import FIXTURES, build_coco, build_cub, build_voc, read_description, reference_outputs

from models.data.protocol import (
    ObservedSpec,
    build_protocol,
    parse_observed,
    sample_observed,
    split_train_val,
)
from models.data.registry import load_dataset
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

WEIGHTS = FIXTURES / "coco_weights.json"
BIASES = {"size": "single:size", "loc": "single:location", "semantic": f"single:empirical?weights={WEIGHTS}"}


def _labels(n: int = 500, c: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < 0.25).astype(np.uint8)
    y[np.arange(n), rng.integers(0, c, n)] = 1  # at least one positive per row
    return y


def test_uniform_sampling_equals_the_reference_for_every_setting() -> None:
    """generate_observed_labels.py's output for VOC/COCO/NUS/CUB-shaped matrices (NUS rows without a positive, a
    row without a negative), seeds 1200/7/31, num_pos 0/1/2/3/all, num_neg 0/2/3/5/all."""
    stored = reference_outputs("uniform")
    cases = [re.fullmatch(r"(\w+?)__seed(\d+)_pos(-?\d+)_neg(-?\d+)", key) for key in stored]
    checked = 0
    for match in filter(None, cases):
        matrix, seed, num_pos, num_neg = match.group(1), *(int(g) for g in match.groups()[1:])
        spec = parse_observed(f"single?pos={'all' if num_pos < 0 else num_pos}&neg={'all' if num_neg < 0 else num_neg}")
        got = sample_observed(stored[f"{matrix}_labels"], spec, seed)
        assert got.dtype == np.int8 and np.array_equal(got, stored[match.group(0)]), match.group(0)
        checked += 1
    assert checked == 64


def test_single_keeps_one_true_positive_and_consumes_the_negatives_shuffle() -> None:
    y = _labels()
    obs = sample_observed(y, parse_observed("single"))
    assert obs.shape == y.shape and (obs.sum(1) == 1).all() and ((obs == 1) <= (y == 1)).all()
    # the reference shuffles the negatives too (keeping none): a loop over the positives alone drifts apart
    rng, positives_only = np.random.RandomState(1200), np.zeros_like(obs)
    for i, row in enumerate(y):
        idx = np.flatnonzero(row)
        rng.shuffle(idx)
        positives_only[i, idx[0]] = 1
    assert (obs[0] == positives_only[0]).all() and (obs != positives_only).any(axis=1).sum() > 100
    assert (sample_observed(y, parse_observed("single"), 7) != obs).any()
    empty = sample_observed(np.array([[0, 0, 0], [0, 1, 1]]), ObservedSpec("single"))
    assert empty[0].sum() == 0 and empty[1].sum() == 1


def test_negatives_partial_and_full() -> None:
    y = _labels(4000)
    obs = sample_observed(y, parse_observed("single?pos=2&neg=3"))
    assert ((obs == 1).sum(1) == np.minimum(y.sum(1), 2)).all()
    assert ((obs == -1).sum(1) == np.minimum((y == 0).sum(1), 3)).all()
    assert ((obs == -1) <= (y == 0)).all() and ((obs == 1) <= (y == 1)).all()
    partial = sample_observed(y, parse_observed("partial:0.3"))
    assert (partial <= y).all() and 0.28 < partial.sum() / y.sum() < 0.32
    np.testing.assert_array_equal(sample_observed(y, parse_observed("full")), y)


@pytest.mark.parametrize(("text", "canonical"), [
    ("single", "single"), ("SINGLE?pos=1&neg=0&val=clean", "single"), ("single:uniform?neg=all", "single?neg=all"),
    ("single?val=observed&neg=2&pos=3", "single?pos=3&neg=2&val=observed"), ("single:loc", "single:location"),
    ("single:size?val=observed", "single:size?val=observed"), ("partial:0.50", "partial:0.5"), ("full", "all"),
    ("all", "all"), ("auto", "auto"),
    (f"single:semantic?weights={WEIGHTS}", f"single:empirical?weights={WEIGHTS}"),
])
def test_parse_observed_round_trips(text: str, canonical: str) -> None:
    spec = parse_observed(text)
    assert spec.argument() == canonical and parse_observed(canonical) == spec


@pytest.mark.parametrize(("bad", "fragment"), [
    ("partial:0", "partial:R"), ("partial:1.5", "partial:R"), ("partial:x", "partial:R"), ("some", "use auto, single"),
    ("", "use auto, single"), ("single:shape", "unknown variant 'shape'"), ("single?neg=-2", "neg= takes a number"),
    ("single?pos=x", "pos= takes"), ("single?colour=red", "unknown option 'colour'"),
    ("single:size?neg=1", "pos= and neg= apply to single:uniform only"), ("single:empirical", "needs weights=FILE"),
    ("single?weights=w.json", "weights= applies to single:empirical"), ("full?val=observed", "--method bce"),
    ("partial:0.5?neg=1", "apply to single only"), ("single?val=noisy", "val= takes clean or observed"),
])
def test_parse_observed_rejects_bad_values(bad: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="observed") as info:
        parse_observed(bad)
    assert fragment in str(info.value)


def test_split_is_cole_split() -> None:
    train, val = split_train_val(101)
    assert len(val) == round(0.2 * 101) and len(train) == 101 - len(val)
    assert set(train).isdisjoint(val) and sorted([*train, *val]) == list(range(101))
    perm = np.random.RandomState(1200).permutation(101)
    np.testing.assert_array_equal(val, np.sort(perm[101 - 20 :]))


def _splits(n: int = 100, explicit_val: bool = False) -> DatasetSplits:
    y = _labels(n, 5)
    classes = [f"c{i}" for i in range(5)]
    images = LabelledImages([Path(f"/x/{i}.jpg") for i in range(n)], y, classes)
    val = LabelledImages([Path(f"/v/{i}.jpg") for i in range(10)], _labels(10, 5, 3), classes) if explicit_val else None
    test = LabelledImages([Path(f"/t/{i}.jpg") for i in range(20)], _labels(20, 5, 1), classes)
    return DatasetSplits("toy", "toy:", classes, images, test=test, val=val, complete_splits=ALL_SPLITS)


def test_build_protocol_samples_the_pool_then_splits_and_scores_val_clean_or_observed() -> None:
    ds = _splits()
    p = build_protocol(ds, ObservedSpec("single"))
    assert len(p.train) == 80 and len(p.val) == 20 and p.test is not None and len(p.test) == 20
    pool_obs = sample_observed(ds.train.labels, ObservedSpec("single"))
    tr, va = split_train_val(100)
    np.testing.assert_array_equal(p.train_observed, pool_obs[tr])
    np.testing.assert_array_equal(p.val_observed, pool_obs[va])
    np.testing.assert_array_equal(p.val.labels, ds.train.labels[va])  # val=clean: the full labels
    assert p.fingerprint == build_protocol(_splits(), ObservedSpec("all")).fingerprint
    observed_val = build_protocol(ds, parse_observed("single?neg=2&val=observed"))
    assert observed_val.val.paths == p.val.paths and (observed_val.val.labels.sum(1) == 1).all()
    np.testing.assert_array_equal(observed_val.val.labels, observed_val.val_observed == 1)
    assert "val 20 (observed labels)" in observed_val.summary() and " negatives)" in observed_val.summary()


def test_an_explicit_val_split_is_observed_like_a_pool(tmp_path: Path) -> None:
    ds = _splits(explicit_val=True)
    p = build_protocol(ds, parse_observed("single?val=observed"))
    assert len(p.train) == 100 and len(p.val) == 10
    np.testing.assert_array_equal(p.val.labels, sample_observed(ds.val.labels, ObservedSpec("single")))
    np.save(tmp_path / "obs.npy", sample_observed(ds.train.labels, ObservedSpec("single")))
    assert build_protocol(ds, parse_observed(str(tmp_path / "obs.npy"))).val_observed is None
    with pytest.raises(DataError, match="no observed labels for the validation images"):
        build_protocol(ds, parse_observed(f"{tmp_path / 'obs.npy'}?val=observed"))


# ---------------------------------------------------------------- the format scripts and the whole chain

def _relative(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[DatasetSplits, Path]]:
    """The three miniatures, loaded; with the folder their formatted image names are relative to."""
    root = tmp_path_factory.mktemp("reference-trees")
    voc = build_voc(root / "pascal", read_description("voc"))
    coco = build_coco(root / "coco", read_description("coco"))
    cub = build_cub(root / "cub", read_description("cub"))
    return {"voc": (load_dataset(f"voc:{voc / 'VOCdevkit'}"), voc / "VOCdevkit" / "VOC2012" / "JPEGImages"),
            "coco": (load_dataset(f"coco:{coco}"), coco),
            "cub": (load_dataset(f"cub:{cub}"), cub / "CUB_200_2011" / "images")}


@pytest.mark.parametrize("name", ["voc", "coco", "cub"])
def test_loaders_equal_the_format_scripts_and_the_chain_equals_the_reference(
        trees: dict[str, tuple[DatasetSplits, Path]], name: str) -> None:
    """Image order and labels as format_pascal/coco/cub.py write them (sorted lists, images without a positive or
    with difficult objects only left out, COCO ids sorted as strings, CUB's file order); then observed labels
    (seed 1200) and the 80/20 split as generate_observed_labels.py + datasets.py give them."""
    splits, image_root = trees[name]
    ref = reference_outputs(name)
    assert splits.test is not None
    assert _relative(splits.train.paths, image_root) == list(ref["train_images"])
    assert _relative(splits.test.paths, image_root) == list(ref["test_images"])
    np.testing.assert_array_equal(splits.train.labels, ref["train_labels"])
    np.testing.assert_array_equal(splits.test.labels, ref["test_labels"])
    protocol = build_protocol(splits, parse_observed("single"))
    assert _relative(protocol.train.paths, image_root) == list(ref["chain_train_images"])
    assert _relative(protocol.val.paths, image_root) == list(ref["chain_val_images"])
    np.testing.assert_array_equal(protocol.train_observed, ref["chain_train_obs"])
    np.testing.assert_array_equal(protocol.val_observed, ref["chain_val_obs"])


@pytest.mark.parametrize("bias", sorted(BIASES))
def test_coco_label_bias_equals_the_reference(trees: dict[str, tuple[DatasetSplits, Path]], bias: str) -> None:
    """biased_labels.py (size, loc, semantic with the fixture's class weights) for seeds 1200 and 5, and the
    bias branch's chain for 1200; the fixture's images with zero-weight classes only sort early, so a draw
    made the wrong way changes the later images too."""
    splits, root = trees["coco"]
    ref = reference_outputs("coco")
    spec = parse_observed(BIASES[bias])
    for seed in (1200, 5):
        got = sample_observed(splits.train.labels, spec, seed, splits)
        np.testing.assert_array_equal(got, ref[f"{bias}_seed{seed}_train_obs"])
    uniform = sample_observed(splits.train.labels, parse_observed("single"), 1200)
    assert (uniform != ref[f"{bias}_seed1200_train_obs"]).any(axis=1).sum() >= 10  # the bias changes the draws
    protocol = build_protocol(splits, spec)
    assert _relative(protocol.train.paths, root) == list(ref[f"chain_train_images_{bias}"])
    np.testing.assert_array_equal(protocol.train_observed, ref[f"chain_train_obs_{bias}"])
    np.testing.assert_array_equal(protocol.val_observed, ref[f"chain_val_obs_{bias}"])
    assert str(protocol.observed) == spec.argument()


def test_the_seeds_formatted_coco_folder_with_its_annotations_gives_the_biased_labels(tmp_path: Path) -> None:
    """The reference's own data/coco layout: formatted files beside annotations/ (formatted: loader)."""
    root = build_coco(tmp_path / "coco", read_description("coco"))
    ref = reference_outputs("coco")
    for phase, name in (("train", "train"), ("val", "test")):
        np.save(root / f"formatted_{phase}_images.npy", ref[f"{name}_images"])
        np.save(root / f"formatted_{phase}_labels.npy", ref[f"{name}_labels"].astype(np.float64))
    splits = load_dataset(f"formatted:{root}")
    protocol = build_protocol(splits, parse_observed("single:location"))
    np.testing.assert_array_equal(protocol.train_observed, ref["chain_train_obs_loc"])


def test_coco_categories_by_id_or_in_the_jsons_order_with_reference(tmp_path: Path) -> None:
    """A json listing its categories out of id order: the loader sorts them by id (the official files are in id
    order, so both agree there); ?reference keeps the json's order, as format_coco.py."""
    description = read_description("coco")
    for phase in ("train", "val"):
        description[phase]["categories"].reverse()
    root = build_coco(tmp_path / "coco", description)
    ref = reference_outputs("coco")
    by_id, as_listed = load_dataset(f"coco:{root}"), load_dataset(f"coco:{root}?reference")
    np.testing.assert_array_equal(by_id.train.labels, ref["train_labels"])
    np.testing.assert_array_equal(as_listed.train.labels, ref["shuffled_train_labels"])
    assert as_listed.test is not None
    np.testing.assert_array_equal(as_listed.test.labels, ref["shuffled_test_labels"])
    assert as_listed.classes == by_id.classes[::-1] and as_listed.source == f"coco:{root}?reference"
    with pytest.raises(DataError, match="unknown option 'sorted'"):
        load_dataset(f"coco:{root}?sorted")


def test_a_dataset_without_objects_has_no_size_variant() -> None:
    with pytest.raises(DataError, match="dataset toy does not describe"):
        build_protocol(_splits(), parse_observed("single:location"))


def test_builtin_size_variant_prefers_the_large_objects(builtin_cache: Path) -> None:
    """The built-in data knows its shapes: single:size keeps a true positive, drawn by visible area (an annotator
    biased towards large objects); the largest class is kept far more often than a uniform draw keeps it."""
    splits = load_dataset("builtin:tiny")
    assert splits.train_objects is not None
    table = splits.train_objects()
    size = sample_observed(splits.train.labels, parse_observed("single:size"), 1200, splits)
    uniform = sample_observed(splits.train.labels, parse_observed("single"), 1200)
    assert ((size == 1) <= (splits.train.labels == 1)).all() and (size.sum(1) == 1).all()
    area = np.zeros(splits.train.labels.shape)
    for i in range(len(table)):
        for cls, visible, _, _ in table.row(i):
            area[i, cls] += visible
    several = splits.train.labels.sum(1) > 1
    largest = area.argmax(1)
    size_rate = (size.argmax(1) == largest)[several].mean()
    uniform_rate = (uniform.argmax(1) == largest)[several].mean()
    assert size_rate > uniform_rate + 0.15, (size_rate, uniform_rate)
    np.testing.assert_array_equal(size, sample_observed(splits.train.labels, parse_observed("single:size"), 1200,
                                                        splits))
    location = sample_observed(splits.train.labels, parse_observed("single:location"), 1200, splits)
    assert (location.sum(1) == 1).all() and (location != size).any()


def test_train_help_explains_the_observed_forms() -> None:
    from train.options import build_parser

    text = " ".join(build_parser().format_help().split())
    for form in ("single?pos=N&neg=M", "single:size|location", "single:empirical?weights=FILE", "val=observed",
                 "train_set_variant='clean'", "coco:DIR[?reference]"):
        assert form in text, form
