"""CUB-200-2011 (``cub:DIR``) and NUS-WIDE (``nus:DIR``) loaders on fabricated miniatures of the official layouts.

The trees carry the real quirks: CUB's ``attributes.txt`` beside ``CUB_200_2011/`` and label lines with an extra
field; NUS's backslash image lists, images missing on disk and images with no positive concept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.data.cub import load_cub
from models.data.file_scan import scan_files
from models.data.nus import load_nus, relative_image_path
from models.data.registry import describe_kinds, detect_kind, load_dataset, spec_dataset_name
from models.data.types import DataError
from train.__main__ import main
from train.methods.base import dataset_family

TRAIN_ONE_EPOCH = ["--method", "an", "--no-lgconv", "--arch", "resnet18", "--weights", "none", "--image-size", "32",
                   "--epochs", "1",
                   "--batch-size", "8", "--workers", "0", "--no-progress"]


def write_image(path: Path, seed: int) -> None:
    """A 16x16 JPEG whose colour depends on ``seed``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (seed * 37 % 256, seed * 91 % 256, seed * 53 % 256)).save(path, format="JPEG")


def error_of(func: object, *args: object, **kwargs: object) -> str:
    """Call ``func`` expecting a ``DataError``; return its message."""
    with pytest.raises(DataError) as info:
        func(*args, **kwargs)  # type: ignore[operator]
    return str(info.value)


# ------------------------------------------------------------------------------------------------------ CUB

@dataclass
class CubTree:
    """A fabricated CUB release: ``parent/CUB_200_2011/...`` + ``parent/attributes.txt``, and its truth."""

    parent: Path
    labels: np.ndarray  # (images, attributes), rows in image-id order
    is_train: np.ndarray  # (images,) bool
    names: list[str]
    paths: list[str]  # relative to images/
    extra_field_lines: list[int]

    @property
    def folder(self) -> Path:
        return self.parent / "CUB_200_2011"


def make_cub(parent: Path, n_images: int = 24, n_attributes: int = 312) -> CubTree:
    """Write a miniature CUB_200_2011 release under ``parent`` (attributes.txt beside the folder)."""
    rng = np.random.default_rng(7)
    labels = (rng.random((n_images, n_attributes)) < 0.1).astype(np.uint8)
    labels[np.arange(n_images), rng.integers(0, n_attributes, n_images)] = 1
    labels[5] = 0  # an image with no present attribute: kept, as in the seeds' formatted files
    is_train = np.arange(n_images) % 3 != 0
    names = [f"has_part_{a // 15}::value_{a}" for a in range(n_attributes)]
    paths = [f"{1 + i % 4:03d}.Species_{i % 4}/Species_{i % 4}_{i:04d}_{1000 + i}.jpg" for i in range(n_images)]
    folder = parent / "CUB_200_2011"
    for i, rel in enumerate(paths):
        write_image(folder / "images" / rel, i)
    (folder / "images.txt").write_text("".join(f"{i + 1} {p}\n" for i, p in enumerate(paths)))
    (folder / "train_test_split.txt").write_text("".join(f"{i + 1} {int(t)}\n" for i, t in enumerate(is_train)))
    (folder / "image_class_labels.txt").write_text("".join(f"{i + 1} {1 + i % 4}\n" for i in range(n_images)))
    (parent / "attributes.txt").write_text("".join(f"{a + 1} {n}\n" for a, n in enumerate(names)))
    lines, extra = [], []
    for i in range(n_images):
        for a in range(n_attributes):
            line = f"{i + 1} {a + 1} {labels[i, a]} {1 + (i + a) % 4} {1.5 + a % 7:.4f}"
            if (i * n_attributes + a) % 1000 == 17:  # the official file's malformed lines: one field too many
                line += " 0"
                extra.append(len(lines) + 1)
            lines.append(line)
    (folder / "attributes").mkdir()
    (folder / "attributes" / "image_attribute_labels.txt").write_text("\n".join(lines) + "\n")
    return CubTree(parent, labels, is_train, names, paths, extra)


@pytest.fixture(scope="module")
def cub(tmp_path_factory: pytest.TempPathFactory) -> CubTree:
    return make_cub(tmp_path_factory.mktemp("cub"))


def test_cub_labels_splits_and_names(cub: CubTree) -> None:
    assert len(cub.extra_field_lines) >= 5
    for root in (cub.parent, cub.folder):  # the folder or its parent
        splits = load_cub(root)
        assert splits.name == "cub" and dataset_family(splits.name) == "cub"
        assert splits.source == f"cub:{cub.folder.resolve()}" and splits.val is None
        assert splits.classes == cub.names and len(splits.classes) == 312
        train, test = np.flatnonzero(cub.is_train), np.flatnonzero(~cub.is_train)
        assert len(splits.train) == 16 and splits.test is not None and len(splits.test) == 8
        np.testing.assert_array_equal(splits.train.labels, cub.labels[train])
        np.testing.assert_array_equal(splits.test.labels, cub.labels[test])
        assert splits.train.paths == [cub.folder.resolve() / "images" / cub.paths[i] for i in train]
        assert splits.notes == ["cub: 24 images x 312 attributes (the official release has 11,788 x 312)"]
    assert not splits.train.labels[np.flatnonzero(train == 5)[0]].any()  # the empty image is kept
    assert detect_kind(cub.parent) == "cub" and detect_kind(cub.folder) == "cub"
    np.testing.assert_array_equal(load_dataset(str(cub.parent)).test.labels, splits.test.labels)  # a bare path
    assert spec_dataset_name(str(cub.parent)) == "cub"


def test_cub_attribute_names_inside_the_folder(tmp_path: Path) -> None:
    tree = make_cub(tmp_path, n_images=6, n_attributes=9)
    (tmp_path / "attributes.txt").rename(tree.folder / "attributes" / "attributes.txt")
    splits = load_cub(tree.folder)
    assert splits.classes == tree.names
    np.testing.assert_array_equal(splits.train.labels, tree.labels[tree.is_train])


def test_cub_errors(tmp_path: Path) -> None:
    tree = make_cub(tmp_path, n_images=6, n_attributes=9)
    labels_file = tree.folder / "attributes" / "image_attribute_labels.txt"
    lines = labels_file.read_text().splitlines()

    labels_file.write_text("\n".join([*lines[:12], lines[3], *lines[12:]]) + "\n")  # image 1 attribute 4 doubled
    assert error_of(load_cub, tree.parent) == (
        f"{labels_file}:13: image 1 attribute 4 appears twice (first on line 4); "
        "expected one row per image and attribute")
    labels_file.write_text("\n".join(lines[:20] + lines[21:]) + "\n")  # line 21 = image 3 attribute 3
    assert error_of(load_cub, tree.parent) == (
        f"{labels_file}: no row for image 3 attribute 3 (found 53 rows; every image needs one row per attribute: "
        "6 x 9 = 54)")
    labels_file.write_text("\n".join([*lines[:7], "1 8 2 3 1.0", *lines[8:]]) + "\n")
    assert error_of(load_cub, tree.parent) == f"{labels_file}:8: is_present must be 0 or 1, found '2'"
    labels_file.write_text("\n".join([*lines, "7 1 0 1 1.0"]) + "\n")
    assert error_of(load_cub, tree.parent) == f"{labels_file}:55: unknown image id 7 (not in images.txt)"

    labels_file.write_text("\n".join(lines) + "\n")
    names_file = tree.parent / "attributes.txt"
    names_file.write_text(names_file.read_text().replace("value_4\n", "value_1\n"))
    assert error_of(load_cub, tree.parent) == (
        f"{names_file}:5: attribute name 'has_part_0::value_1' repeated (first on line 2)")

    labels_file.unlink()
    assert error_of(load_cub, tree.parent) == (
        f"{tree.folder}: missing attributes/image_attribute_labels.txt (expected the official CUB_200_2011 release: "
        "images.txt, train_test_split.txt, attributes/image_attribute_labels.txt, images/, and attributes.txt in "
        "it or beside it)")
    labels_file.write_text("\n".join(lines) + "\n")
    (tree.parent / "attributes.txt").unlink()
    assert error_of(load_cub, tree.folder).startswith(f"{tree.folder}: missing attributes.txt (looked in ")
    assert "missing images.txt" in error_of(load_cub, tmp_path / "CUB_200_2011" / "images")
    assert error_of(load_cub, tmp_path / "nope").startswith(f"{tmp_path / 'nope'}: CUB folder not found (expected")


def test_cub_missing_image(tmp_path: Path) -> None:
    tree = make_cub(tmp_path, n_images=6, n_attributes=9)
    (tree.folder / "images" / tree.paths[2]).unlink()
    assert error_of(load_cub, tree.parent) == (
        f"{tree.folder / 'images.txt'}:3: image not found: {tree.folder / 'images' / tree.paths[2]} "
        f"(1 of 6 listed images are missing under {tree.folder / 'images'})")


def test_cub_cli_error_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "train", "--data", "cub:/nonexistent", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: /nonexistent: CUB folder not found (expected the official CUB_200_2011 release: images.txt, "
        "train_test_split.txt, attributes/image_attribute_labels.txt, images/, and attributes.txt in it or beside "
        "it)"]


def test_cub_trains_one_epoch(cub: CubTree, tmp_path: Path) -> None:
    assert main(["--data", f"cub:{cub.parent}", *TRAIN_ONE_EPOCH, "--runs-dir", str(tmp_path), "--name", "c"]) == 0
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["test"]["num_images"] == 8 and 0 < summary["test"]["mAP"] <= 100
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    assert config["config"]["data"] == f"cub:{cub.parent}"
    resolved = config["resolved"]
    assert resolved["dataset"] == "cub" and resolved["source"] == f"cub:{cub.folder.resolve()}"
    assert resolved["notes"] == ["cub: 24 images x 312 attributes (the official release has 11,788 x 312)"]
    assert resolved["splits"].startswith("train 13 (observed single: 1.00 labels/image of ")
    assert resolved["splits"].endswith("val 3, test 8, 312 classes")


# ------------------------------------------------------------------------------------------------------ NUS

CONCEPTS = ["animal", "beach", "clouds", "sky", "sunset", "water"]


@dataclass
class NusTree:
    """A fabricated NUS-WIDE annotation tree with its truth per split."""

    root: Path
    entries: dict[str, list[str]]  # relative image paths in list order
    labels: dict[str, np.ndarray]
    present: dict[str, np.ndarray]


def make_nus(root: Path, sizes: tuple[int, int] = (20, 12), missing_every: int = 6, images: bool = True) -> NusTree:
    """Write Concepts81.txt, the two image lists (backslash paths, one full Windows path), the per-concept label
    files, and the images that are not 'missing' under root/Flickr (empty files when ``images`` is False)."""
    rng = np.random.default_rng(3)
    (root / "ImageList").mkdir(parents=True)
    (root / "Groundtruth" / "TrainTestLabels").mkdir(parents=True)
    (root / "Concepts81.txt").write_text("\n".join(CONCEPTS) + "\n")
    tree = NusTree(root, {}, {}, {})
    for split, size in zip(("train", "test"), sizes, strict=True):
        folders = [CONCEPTS[i % len(CONCEPTS)] for i in range(size)]
        entries = [f"{folder}/{i:04d}_{10_000 + i + (size if split == 'test' else 0)}.jpg"
                   for i, folder in enumerate(folders)]
        labels = (rng.random((size, len(CONCEPTS))) < 0.3).astype(np.uint8)
        labels[1::4] = 0  # images with no positive concept
        present = np.arange(size) % missing_every != 2
        lines = [e.replace("/", "\\") for e in entries]
        lines[0] = "C:\\ImageData\\Flickr\\" + lines[0]  # the form of the full Imagelist.txt
        (root / "ImageList" / f"{split.capitalize()}Imagelist.txt").write_text("\r\n".join(lines) + "\r\n")
        for c, concept in enumerate(CONCEPTS):
            path = root / "Groundtruth" / "TrainTestLabels" / f"Labels_{concept}_{split.capitalize()}.txt"
            path.write_text("".join(f"{v}\n" for v in labels[:, c]))
        for i in np.flatnonzero(present):
            if images:
                write_image(root / "Flickr" / entries[i], i)
            else:
                (root / "Flickr" / entries[i]).parent.mkdir(parents=True, exist_ok=True)
                (root / "Flickr" / entries[i]).touch()
        tree.entries[split], tree.labels[split], tree.present[split] = entries, labels, present
    return tree


@pytest.fixture(scope="module")
def nus(tmp_path_factory: pytest.TempPathFactory) -> NusTree:
    return make_nus(tmp_path_factory.mktemp("nus"))


def test_nus_relative_paths() -> None:
    assert relative_image_path("actor\\0001_2124494179.jpg") == "actor/0001_2124494179.jpg"
    assert relative_image_path(" C:\\ImageData\\Flickr\\actor\\0001_2124494179.jpg ") == "actor/0001_2124494179.jpg"


@pytest.mark.parametrize("keep_unlabelled", [False, True])
def test_nus_labels_missing_and_unlabelled(nus: NusTree, keep_unlabelled: bool) -> None:
    splits = load_nus(nus.root, keep_unlabelled=keep_unlabelled)
    assert splits.name == "nus" and dataset_family(splits.name) == "nus" and splits.classes == CONCEPTS
    assert splits.val is None
    notes = ["nus: 6 concepts (the official list has 81)", "nus: using 27 of 32 images; 5 missing"]
    action = "kept as all-negative rows" if keep_unlabelled else \
        "dropped (keep them as all-negative rows with nus:DIR?keep-unlabelled)"
    for split, loaded in (("train", splits.train), ("test", splits.test)):
        assert loaded is not None
        labelled = nus.labels[split].any(axis=1)
        keep = nus.present[split] & (True if keep_unlabelled else labelled)
        rows = np.flatnonzero(keep)
        np.testing.assert_array_equal(loaded.labels, nus.labels[split][rows])
        assert loaded.paths == [nus.root.resolve() / "Flickr" / nus.entries[split][i] for i in rows]
        unlabelled = int((nus.present[split] & ~labelled).sum())
        notes.append(f"nus: {unlabelled} of {int(nus.present[split].sum())} {split} images have no positive label; "
                     f"{action}")
    assert (len(splits.train), len(splits.test)) == ((17, 10) if keep_unlabelled else (10, 7))
    assert splits.notes == notes
    assert splits.source == f"nus:{nus.root.resolve()}" + ("?keep-unlabelled" if keep_unlabelled else "")


def test_nus_spec_options_and_image_root(tmp_path: Path) -> None:
    tree = make_nus(tmp_path / "nus", images=False)
    (tmp_path / "nus" / "Flickr").rename(tmp_path / "flickr")
    spec = f"nus:{tree.root}?images={tmp_path / 'flickr'}&keep-unlabelled"
    splits = load_dataset(spec)
    assert len(splits.train) == 17 and splits.train.paths[0] == (tmp_path / "flickr" / tree.entries["train"][0])
    assert splits.source == f"nus:{tree.root}?images={tmp_path / 'flickr'}&keep-unlabelled"
    assert load_dataset(splits.source).train.paths == splits.train.paths  # the source reloads the same data
    assert len(load_dataset(f"nus:{tree.root}?images={tmp_path / 'flickr'}&keep-unlabelled=false").train) == 10
    assert spec_dataset_name(spec) == "nus" and spec_dataset_name(f"cub:{tmp_path}") == "cub"
    assert detect_kind(tree.root) == "nus" and "nus:<root>[?images=DIR][&keep-unlabelled]" in describe_kinds()
    assert error_of(load_dataset, f"nus:{tree.root}?keep-unlabelled=maybe") == (
        f"nus:{tree.root}?keep-unlabelled=maybe: keep-unlabelled takes no value (or true/false), found 'maybe'")
    assert error_of(load_dataset, f"nus:{tree.root}?imgs=/x") == (
        f"nus:{tree.root}?imgs=/x: unknown option 'imgs' (accepted: images, keep-unlabelled)")
    assert error_of(load_dataset, f"nus:{tree.root}") == (
        f"{tree.root / 'Flickr'}: image folder not found (NUS-WIDE images go under {tree.root / 'Flickr'} or the "
        "folder given with nus:DIR?images=PATH)")


def test_nus_counts_use_thousands_separators(tmp_path: Path) -> None:
    make_nus(tmp_path, sizes=(1500, 600), missing_every=7, images=False)
    splits = load_nus(tmp_path)
    assert "nus: using 1,800 of 2,100 images; 300 missing" in splits.notes


def test_nus_errors(tmp_path: Path) -> None:
    tree = make_nus(tmp_path, images=False)
    short = tree.root / "Groundtruth" / "TrainTestLabels" / "Labels_sky_Train.txt"
    short.write_text("".join(f"{v}\n" for v in tree.labels["train"][:-1, 3]))
    assert error_of(load_nus, tree.root) == (
        f"{short}: 19 labels but ImageList/TrainImagelist.txt lists 20 images (the label file is short)")
    short.write_text("".join(f"{v}\n" for v in tree.labels["train"][:, 3]).replace("0\n", "2\n", 1))
    assert error_of(load_nus, tree.root).startswith(f"{short}: label #")
    short.unlink()
    assert error_of(load_nus, tree.root) == (
        f"{tree.root}: missing Groundtruth/TrainTestLabels/Labels_sky_Train.txt (expected the official NUS-WIDE "
        "layout: Concepts81.txt, ImageList/TrainImagelist.txt, ImageList/TestImagelist.txt, "
        "Groundtruth/TrainTestLabels/Labels_<concept>_{Train,Test}.txt and Flickr/)")
    (tree.root / "ImageList" / "TestImagelist.txt").unlink()
    assert error_of(load_nus, tree.root).startswith(f"{tree.root}: missing ImageList/TestImagelist.txt (expected")
    (tree.root / "Concepts81.txt").unlink()
    assert error_of(load_nus, tree.root).startswith(f"{tree.root}: missing Concepts81.txt (expected")


def test_nus_trains_one_epoch(nus: NusTree, tmp_path: Path) -> None:
    assert main(["--data", f"nus:{nus.root}", *TRAIN_ONE_EPOCH, "--runs-dir", str(tmp_path), "--name", "n"]) == 0
    summary = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert summary["test"]["num_images"] == 7 and 0 < summary["test"]["mAP"] <= 100
    config = json.loads((tmp_path / "n" / "config.json").read_text())
    assert config["resolved"]["dataset"] == "nus" and config["resolved"]["notes"][1] == (
        "nus: using 27 of 32 images; 5 missing")
    assert config["resolved"]["splits"].endswith("val 2, test 7, 6 classes")


def test_scan_files_walks_once_through_link_cycles(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.jpg").touch()
    (tmp_path / "top.txt").touch()
    (tmp_path / "a" / "b" / "loop").symlink_to(tmp_path / "a")  # a cycle: a/b/loop -> a
    assert scan_files(tmp_path, "test", progress=False) == {"a/b/x.jpg", "top.txt"}
