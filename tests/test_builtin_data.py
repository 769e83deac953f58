"""Tests of the built-in procedural dataset (models.sources.builtin, builtin_scenes, shapes)."""

from __future__ import annotations

import csv
import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.data.cache_folders import GENERATOR_VERSION, cache_root
from models.data.types import DataError
from models.sources import builtin
from models.sources.builtin import BUILTIN_PRESETS, ensure_builtin, label_statistics, read_label_matrix
from models.sources.builtin_scenes import (
    CLASS_NAMES,
    COOCCURRING_PAIRS,
    MAX_OBJECTS,
    SIZE_RANGE,
    generate_image,
    sample_labelled_scene,
    sample_scene,
)

TINY = BUILTIN_PRESETS["tiny"]


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, keyed by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset, seed 0, generated once in one process."""
    return ensure_builtin("tiny", seed=0, cache_dir=tmp_path_factory.mktemp("cache_a"), workers=1,
                          progress=False)


@pytest.fixture(scope="module")
def tiny_digests(tiny_dir: Path) -> dict[str, str]:
    """sha256 of every file of the reference tiny dataset."""
    return _digests(tiny_dir)


# ---------------------------------------------------------------------------------------------- API basics


def test_classes_and_pairs_are_well_formed() -> None:
    """20 distinct class names, 5 valid co-occurring pairs, the presets' sizes."""
    assert len(CLASS_NAMES) == 20
    assert len(set(CLASS_NAMES)) == 20
    assert all(name and name.isidentifier() and ";" not in name for name in CLASS_NAMES)
    assert len(COOCCURRING_PAIRS) == 5
    for a, b in COOCCURRING_PAIRS:
        assert a in CLASS_NAMES and b in CLASS_NAMES and a != b
    assert {"tiny", "small", "default", "large"} <= set(BUILTIN_PRESETS)
    assert (TINY.image_size, TINY.n_train, TINY.n_test) == (64, 200, 80)
    for name, sizes in (("default", (96, 16000, 2000)), ("large", (448, 30000, 6000))):
        preset = BUILTIN_PRESETS[name]
        assert (preset.image_size, preset.n_train, preset.n_test) == sizes
    small, default = BUILTIN_PRESETS["small"], BUILTIN_PRESETS["default"]
    assert (small.image_size, small.n_train, small.n_test) == (96, 2000, 2000)
    assert small.image_size == default.image_size and small.n_test == default.n_test  # see the prefix test


def test_a_smaller_preset_is_a_prefix_of_a_larger_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes `small` the first 2,000 training images of `default` with its test set: two presets of one
    image size write byte-identical images and labels for the indices they share."""
    monkeypatch.setitem(BUILTIN_PRESETS, "few", builtin.BuiltinPreset("few", 32, 3, 2))
    monkeypatch.setitem(BUILTIN_PRESETS, "more", builtin.BuiltinPreset("more", 32, 6, 2))
    few = ensure_builtin("few", seed=0, cache_dir=tmp_path, workers=1, progress=False)
    more = ensure_builtin("more", seed=0, cache_dir=tmp_path, workers=2, progress=False)
    few_files = {k: v for k, v in _digests(few).items() if k.startswith("images/")}
    assert len(few_files) == 5
    assert few_files.items() <= _digests(more).items()
    with (few / "labels.csv").open() as a, (more / "labels.csv").open() as b:
        few_rows, more_rows = list(csv.DictReader(a)), list(csv.DictReader(b))
    more_by_image = {row["image"]: row for row in more_rows}
    assert all(more_by_image[row["image"]] == row for row in few_rows)
    assert len(more_rows) == 8


def test_unknown_preset_and_bad_seed_raise_data_error(tmp_path: Path) -> None:
    """An unknown preset names the valid ones; a negative seed is refused."""
    with pytest.raises(DataError, match=r"tiny.*default.*large"):
        ensure_builtin("huge", cache_dir=tmp_path, progress=False)
    with pytest.raises(DataError, match="seed"):
        ensure_builtin("tiny", seed=-1, cache_dir=tmp_path, progress=False)
    assert not any((tmp_path / "builtin").glob("huge-*"))


def test_cache_root_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$SPML_CACHE wins; otherwise ~/.cache/spml."""
    monkeypatch.setenv("SPML_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("SPML_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "spml"


def test_label_statistics_on_a_known_matrix() -> None:
    """label_statistics on a hand-checked 4x3 matrix."""
    labels = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]], dtype=np.uint8)
    stats = label_statistics(labels)
    assert stats["n_images"] == 4
    assert stats["mean_labels"] == pytest.approx(2.0)
    assert (stats["min_labels"], stats["max_labels"]) == (1, 3)
    assert stats["class_frequency"] == pytest.approx([1.0, 0.5, 0.5])
    assert stats["max_min_ratio"] == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------- structure


def test_folder_structure(tiny_dir: Path) -> None:
    """classes.txt, labels.csv (header, row count, labels) and the images are as specified."""
    assert tiny_dir.name == f"tiny-seed0-v{GENERATOR_VERSION}" and tiny_dir.parent.name == "builtin"
    assert (tiny_dir / ".complete").is_file()
    assert (tiny_dir / "classes.txt").read_text().splitlines() == CLASS_NAMES
    with open(tiny_dir / "labels.csv", newline="") as f:
        header = f.readline().rstrip("\n")
        rows = list(csv.reader(f))
    assert header == "image,labels,split"
    assert len(rows) == TINY.n_train + TINY.n_test
    assert sum(r[2] == "train" for r in rows) == TINY.n_train
    assert sum(r[2] == "test" for r in rows) == TINY.n_test
    known = set(CLASS_NAMES)
    for image, labels, split in rows:
        assert split in ("train", "test")
        assert image.startswith(f"images/{split}/") and image.endswith(".jpg")
        names = labels.split(";")
        assert 1 <= len(names) <= MAX_OBJECTS
        assert len(set(names)) == len(names)
        assert set(names) <= known
        assert " " not in labels
        with Image.open(tiny_dir / image) as img:
            assert img.format == "JPEG"
            assert img.size == (TINY.image_size, TINY.image_size)
            assert img.mode == "RGB"
    files = {str(p.relative_to(tiny_dir)) for p in (tiny_dir / "images").rglob("*.jpg")}
    assert files == {r[0] for r in rows}


def test_rendered_labels_match_generate_image(tiny_dir: Path) -> None:
    """labels.csv rows equal generate_image's labels for the same (seed, split, index)."""
    classes, labels, splits = read_label_matrix(tiny_dir)
    assert classes == CLASS_NAMES
    test_rows = np.flatnonzero(np.array(splits) == "test")
    for k in (0, 1, 2, 3, 4):
        _img, vec = generate_image(0, "test", k, TINY.image_size)
        np.testing.assert_array_equal(labels[test_rows[k]], vec)


# ---------------------------------------------------------------------------------------------- determinism


def test_same_seed_is_byte_identical_whatever_the_worker_count(
    tiny_digests: dict[str, str], tmp_path: Path
) -> None:
    """Another cache dir and 2 worker processes give the same bytes."""
    other = ensure_builtin("tiny", seed=0, cache_dir=tmp_path, workers=2, progress=False)
    assert _digests(other) == tiny_digests


def test_different_seed_gives_different_data(tiny_digests: dict[str, str], tmp_path: Path) -> None:
    """Seed 1 changes labels.csv and every image."""
    other = _digests(ensure_builtin("tiny", seed=1, cache_dir=tmp_path, workers=1, progress=False))
    assert other.keys() == tiny_digests.keys()
    assert other["labels.csv"] != tiny_digests["labels.csv"]
    images = [k for k in other if k.endswith(".jpg")]
    assert sum(other[k] != tiny_digests[k] for k in images) == len(images)


# ---------------------------------------------------------------------------------------------- statistics


def _pair_lifts(labels: np.ndarray) -> dict[tuple[str, str], float]:
    lifts = {}
    for a, b in COOCCURRING_PAIRS:
        ia, ib = CLASS_NAMES.index(a), CLASS_NAMES.index(b)
        pa, pb = labels[:, ia].mean(), labels[:, ib].mean()
        lifts[a, b] = float((labels[:, ia] & labels[:, ib]).mean() / (pa * pb))
    return lifts


def test_sample_scene_is_cheap_and_well_formed() -> None:
    """sample_scene gives 1-6 objects in the size range, never an occluder first."""
    for i in range(500):
        scene = sample_scene(np.random.default_rng([7, i]))
        objects = [o for o in scene if not o.is_occluder]
        assert 1 <= len(objects) <= MAX_OBJECTS
        assert not scene[0].is_occluder
        for o in objects:
            assert SIZE_RANGE[0] <= o.size <= SIZE_RANGE[1]
            assert 0.0 < o.cx < 1.0 and 0.0 < o.cy < 1.0


def test_label_statistics_of_3000_visibility_filtered_scenes() -> None:
    """Mean labels, long tail and pair lift on 3000 occlusion-filtered scenes."""
    """Labels after occlusion (masks rasterised at 64 px, as rendering does at its own size)."""
    labels = np.stack([sample_labelled_scene(np.random.default_rng([11, i]), 64)[1] for i in range(3000)])
    stats = label_statistics(labels)
    assert stats["min_labels"] >= 1 and stats["max_labels"] <= MAX_OBJECTS
    assert 2.5 <= stats["mean_labels"] <= 3.0
    assert 7.0 <= stats["max_min_ratio"] <= 14.0
    for pair, lift in _pair_lifts(labels).items():
        assert lift >= 2.0, (pair, lift)
    # The visibility filter really drops occluded instances: fewer labels than classes drawn.
    drawn = 0
    for i in range(300):
        scene, shown = sample_labelled_scene(np.random.default_rng([12, i]), 64)
        drawn += len({o.cls for o in scene if not o.is_occluder}) - int(shown.sum())
    assert drawn > 0


def test_rendered_tiny_set_statistics(tiny_dir: Path) -> None:
    """The rendered tiny set has plausible statistics and every class occurs."""
    _classes, labels, _splits = read_label_matrix(tiny_dir)
    stats = label_statistics(labels)
    assert 2.3 <= stats["mean_labels"] <= 3.2  # 280 images: a loose band around the 2.5-3.0 target
    assert min(stats["class_frequency"]) > 0
    assert max(stats["class_frequency"]) > 4 * min(stats["class_frequency"])


# ---------------------------------------------------------------------------------------------- cache safety


def test_complete_folder_is_reused_not_regenerated(tiny_dir: Path) -> None:
    """A folder with .complete is returned as it is."""
    marker = tiny_dir / "extra.txt"
    marker.write_text("still here")
    try:
        assert ensure_builtin("tiny", seed=0, cache_dir=tiny_dir.parent.parent, progress=False) == tiny_dir
        assert marker.read_text() == "still here"
    finally:
        marker.unlink()


def test_leftovers_of_an_interrupted_generation_are_replaced(
    tiny_digests: dict[str, str], tmp_path: Path
) -> None:
    """A stale temp folder and a folder without .complete are replaced."""
    parent = tmp_path / "builtin"
    stale_tmp = parent / f".tiny-seed0-v{GENERATOR_VERSION}.tmp-999-deadbeef"
    (stale_tmp / "images" / "train").mkdir(parents=True)
    (stale_tmp / "labels.csv").write_text("image,labels,split\n")
    half = parent / f"tiny-seed0-v{GENERATOR_VERSION}"
    (half / "images" / "train").mkdir(parents=True)
    (half / "images" / "train" / "000000.jpg").write_bytes(b"truncated")
    (half / "junk.txt").write_text("junk")

    folder = ensure_builtin("tiny", seed=0, cache_dir=tmp_path, progress=False)
    assert folder == half
    assert _digests(folder) == tiny_digests
    assert not stale_tmp.exists()
    assert [p.name for p in parent.iterdir() if ".tmp-" in p.name] == []


def test_failed_generation_leaves_no_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An interruption mid-generation leaves neither the dataset folder nor a temp folder."""
    calls = {"n": 0}
    real = builtin._generate_chunk

    def flaky(*args: object) -> list[str]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(builtin, "_generate_chunk", flaky)
    with pytest.raises(KeyboardInterrupt):
        ensure_builtin("tiny", seed=0, cache_dir=tmp_path, workers=1, progress=False)
    parent = tmp_path / "builtin"
    assert not (parent / f"tiny-seed0-v{GENERATOR_VERSION}").exists()
    assert [p.name for p in parent.iterdir() if ".tmp-" in p.name] == []


def test_concurrent_calls_do_not_corrupt_each_other(tiny_digests: dict[str, str], tmp_path: Path) -> None:
    """Two simultaneous calls both get the same, intact dataset."""
    results: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(ensure_builtin("tiny", seed=0, cache_dir=tmp_path, workers=1, progress=False))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 2 and results[0] == results[1]
    assert _digests(results[0]) == tiny_digests


# ---------------------------------------------------------------------------------------------- command line


def test_command_line_prints_folder_and_statistics(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the folder then the statistics; --help works."""
    assert builtin.main(["--preset", "tiny", "--out", str(tiny_dir.parent.parent), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(tiny_dir)
    assert "labels per image: mean" in out and "max/min ratio" in out
    with pytest.raises(SystemExit) as exc:
        builtin.main(["--help"])
    assert exc.value.code == 0
    assert "--preset" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- dense variant


def test_dense_variant_same_images_with_attribute_labels(tiny_dir: Path, tmp_path: Path) -> None:
    """dense-tiny: the tiny images byte for byte, the same shape labels, plus 7 attributes checked against the
    scenes; about 6.4 positives per image (2.8 shapes + attributes)."""
    from models.sources.builtin_attributes import (
        ATTRIBUTE_NAMES,
        DENSE_CLASS_NAMES,
        generate_dense_image,
        scene_attributes,
    )

    dense = ensure_builtin("dense-tiny", seed=0, cache_dir=tmp_path, workers=1, progress=False)
    classes, labels, splits = read_label_matrix(dense)
    _, plain, plain_splits = read_label_matrix(tiny_dir)
    assert classes == list(DENSE_CLASS_NAMES) and len(classes) == len(CLASS_NAMES) + len(ATTRIBUTE_NAMES)
    assert splits == plain_splits
    np.testing.assert_array_equal(labels[:, : len(CLASS_NAMES)], plain)
    images = sorted(p.relative_to(dense).as_posix() for p in (dense / "images").rglob("*.jpg"))
    assert all((dense / p).read_bytes() == (tiny_dir / p).read_bytes() for p in images)
    assert 5.5 <= labels.sum(1).mean() <= 7.5
    assert labels[:, len(CLASS_NAMES):].sum(0).min() > 0  # every attribute occurs
    for index in range(5):
        _img, vec = generate_dense_image(0, "train", index, TINY.image_size)
        np.testing.assert_array_equal(vec, labels[index])
    # hand-made scene: one large, unhidden square in the top-left quadrant, nothing else
    from models.sources.builtin_scenes import SceneObject

    scene = [SceneObject(CLASS_NAMES.index("square"), 0.3, 0.3, 0.52, 0.0)]
    assert dict(zip(ATTRIBUTE_NAMES, scene_attributes(scene, 128).tolist(), strict=True)) == {
        "top_left": 1, "top_right": 0, "bottom_left": 0, "bottom_right": 0, "large": 1, "partly_hidden": 0,
        "crowded": 0}
    hidden = [*scene, SceneObject(-1, 0.3, 0.3, 0.3, 0.0, (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))]
    assert scene_attributes(hidden, 128)[ATTRIBUTE_NAMES.index("partly_hidden")] == 1
