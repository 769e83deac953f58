"""Dataset loaders (generic CSV, PASCAL VOC, MS-COCO) and the dataset registry, on tiny fixtures."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import models.sources
from models.data.coco import load_coco
from models.data.csv_format import load_csv, read_classes_file, write_csv
from models.data.registry import (
    DATASET_KINDS,
    describe_kinds,
    detect_kind,
    load_dataset,
    parse_builtin_argument,
)
from models.data.types import DataError, LabelledImages
from models.data.voc import VOC_CLASSES, find_voc_dir, load_voc

# --------------------------------------------------------------------------------------------- helpers


def make_image(path: Path, fmt: str | None = None) -> Path:
    """Write a 4x4 RGB image at ``path`` (creating folders) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (120, 30, 200)).save(path, format=fmt)
    return path


def make_csv_folder(
    folder: Path,
    rows: Sequence[str],
    classes: Sequence[str] | None = ("cat", "dog", "bird"),
    images: Sequence[str] = (),
) -> Path:
    """Create ``folder`` with labels.csv (``rows`` joined by newlines), optional classes.txt and images."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in images:
        make_image(folder / name)
    if classes is not None:
        (folder / "classes.txt").write_text("\n".join(classes) + "\n", encoding="utf-8")
    csv_path = folder / "labels.csv"
    csv_path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return csv_path


def error_of(func: Callable[..., object], *args: object, **kwargs: object) -> str:
    """Call ``func`` expecting a DataError and return its message."""
    with pytest.raises(DataError) as info:
        func(*args, **kwargs)
    return str(info.value)


IMAGES = ("img/a.png", "img/b.png", "img/c.png", "img/d.png")

# ------------------------------------------------------------------------------------------- generic CSV


def test_csv_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Any column order, extra column, split case, absolute path, multi-label: classes, matrix, splits."""
    outside = make_image(tmp_path / "elsewhere" / "e.png")
    csv_path = make_csv_folder(
        tmp_path / "pets",
        [
            "split,extra,labels,image",  # any column order, extra column ignored
            "train,x,cat,img/a.png",
            ",x, dog ; cat ,img/b.png",  # no split = train; whitespace stripped; multi-label
            f"TRAIN,x,bird,{outside}",  # absolute path, split case-insensitive
            "val,x,dog,img/c.png",
            "Test,x,bird;cat,img/d.png",
        ],
        images=IMAGES,
    )
    splits = load_csv(csv_path)
    assert splits.classes == ["cat", "dog", "bird"]  # order of classes.txt
    assert splits.name == "pets"
    assert splits.source == f"csv:{csv_path.resolve()}"
    assert splits.train.labels.dtype == np.uint8
    np.testing.assert_array_equal(splits.train.labels, [[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    assert splits.val is not None and splits.test is not None
    np.testing.assert_array_equal(splits.val.labels, [[0, 1, 0]])
    np.testing.assert_array_equal(splits.test.labels, [[1, 0, 1]])
    assert (len(splits.train), len(splits.val), len(splits.test)) == (3, 1, 1)
    for part in (splits.train, splits.val, splits.test):
        assert all(p.is_absolute() and p.is_file() for p in part.paths)
        assert part.classes == splits.classes
    assert splits.train.paths[0] == (tmp_path / "pets" / "img" / "a.png").resolve()
    assert splits.train.paths[2] == outside.resolve()
    assert splits.notes == []
    assert capsys.readouterr().err == ""


def test_csv_without_classes_file_sorts_names_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No classes.txt: classes are the sorted names seen, and a note says so."""
    csv_path = make_csv_folder(
        tmp_path / "d", ["image,labels", "img/a.png,zebra", "img/b.png,ant;zebra"], None, IMAGES
    )
    splits = load_csv(csv_path)
    assert splits.classes == ["ant", "zebra"]
    np.testing.assert_array_equal(splits.train.labels, [[0, 1], [1, 1]])
    assert splits.test is None and splits.val is None  # empty splits are None
    err = capsys.readouterr().err
    assert "no class file" in err and "sorted" in err
    assert len(splits.notes) == 1 and splits.notes[0] in err


def test_csv_warns_of_a_class_without_training_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A class with positives in val or test only cannot be learnt: the loader says which (as a note)."""
    csv_path = make_csv_folder(tmp_path / "d", ["image,labels,split", "img/a.png,cat,train", "img/b.png,dog,train",
                                                "img/c.png,bird;cat,test"], ("cat", "dog", "bird"), IMAGES)
    splits = load_csv(csv_path)
    assert splits.classes == ["cat", "dog", "bird"]
    err = capsys.readouterr().err
    assert "1 class(es) have no training image (bird)" in err and any("bird" in note for note in splits.notes)


def test_csv_images_root_and_explicit_classes_file(tmp_path: Path) -> None:
    """``images_root`` and ``classes_file`` override the CSV-folder defaults."""
    make_image(tmp_path / "pics" / "x.png")
    classes = tmp_path / "meta" / "names.txt"
    classes.parent.mkdir()
    classes.write_text("\nb\n\na\n", encoding="utf-8")  # blank lines ignored
    csv_path = make_csv_folder(tmp_path / "d", ["image,labels", "x.png,a"], classes=None)
    splits = load_csv(csv_path, classes_file=classes, images_root=tmp_path / "pics")
    assert splits.classes == ["b", "a"]
    np.testing.assert_array_equal(splits.train.labels, [[0, 1]])
    assert splits.train.paths == [(tmp_path / "pics" / "x.png").resolve()]


def test_csv_bom_and_quoted_multiline_field_keep_line_numbers(tmp_path: Path) -> None:
    """A BOM is accepted and a quoted newline does not shift reported line numbers."""
    folder = tmp_path / "d"
    make_csv_folder(folder, [], images=IMAGES)
    text = 'image,labels,note\nimg/a.png,cat,"two\nlines"\nimg/b.png,dgo,x\n'
    (folder / "labels.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    msg = error_of(load_csv, folder / "labels.csv")
    assert "labels.csv:4:" in msg and "unknown class 'dgo'" in msg and "did you mean 'dog'" in msg


def test_csv_merges_duplicate_rows_and_prints_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows for the same image merge into the union of labels; the count is printed."""
    csv_path = make_csv_folder(
        tmp_path / "d",
        [
            "image,labels,split",
            "img/a.png,cat,train",
            "img/b.png,dog,",
            "img/a.png,dog,train",
            "./img/a.png,bird,train",  # same file, other spelling
            "img/b.png,bird,train",  # empty split and train are the same split
        ],
        images=IMAGES,
    )
    splits = load_csv(csv_path)
    np.testing.assert_array_equal(splits.train.labels, [[1, 1, 1], [0, 1, 1]])
    assert len(splits.train) == 2
    err = capsys.readouterr().err
    assert "merged 3 duplicate rows into 2 images" in err
    assert splits.notes == [err.strip()]


@pytest.mark.parametrize(
    ("rows", "line", "fragment"),
    [
        (["image,labels", "img/a.png,cat", "img/zz.png,cat"], 3, "image not found"),
        (["image,labels", "img/a.png,cat", "img/b.png,dgo"], 3, "unknown class 'dgo' (known: cat, dog, bird"),
        (["image,labels", "img/a.png,cat", "img/b.png,"], 3, "empty labels field"),
        (["image,labels", "img/a.png,  "], 2, "empty labels field"),
        (["image,labels", "img/a.png,cat;;dog"], 2, "empty class name between ';'"),
        (["image,labels", "img/a.png,cat;"], 2, "empty class name between ';'"),
        (["image,labels", "img/a.png,cat", "img/b.png,dog,extra"], 3, "expected 2 fields"),
        (["image,labels", "img/a.png"], 2, "expected 2 fields"),
        (["image,label", "img/a.png,cat"], 1, "missing required column 'labels'"),
        (["img/a.png,cat", "img/b.png,dog"], 1, "missing required column 'image'"),
        (["image,labels,image", "a,b,c"], 1, "duplicate column 'image'"),
        (["image,labels", ",cat"], 2, "empty image field"),
        (["image,labels,split", "img/a.png,cat,train", "img/b.png,cat,dev"], 3, "unknown split 'dev'"),
        (
            ["image,labels,split", "img/a.png,cat,train", "img/b.png,cat,val", "img/a.png,dog,test"],
            4,
            "split 'test' but line 2 gave it split 'train'",
        ),
        (["image,labels", 'img/a.png,"cat"x'], 2, "malformed CSV"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path: Path, rows: list[str], line: int, fragment: str) -> None:
    """Each bad row raises DataError with ``labels.csv:<line>:`` and a specific reason."""
    csv_path = make_csv_folder(tmp_path / "d", rows, images=IMAGES)
    msg = error_of(load_csv, csv_path)
    assert f"labels.csv:{line}:" in msg, msg
    assert fragment in msg, msg


def test_csv_missing_image_message_names_path(tmp_path: Path) -> None:
    """A missing image's message names the resolved missing path."""
    csv_path = make_csv_folder(tmp_path / "d", ["image,labels", "img/missing.png,cat"], images=IMAGES)
    msg = error_of(load_csv, csv_path)
    assert str((tmp_path / "d" / "img" / "missing.png").resolve()) in msg


def test_csv_undecodable_bytes(tmp_path: Path) -> None:
    """Non-UTF-8 bytes raise DataError with the line they are on."""
    folder = tmp_path / "d"
    make_csv_folder(folder, [], images=IMAGES)
    (folder / "labels.csv").write_bytes(b"image,labels\nimg/a.png,cat\nimg/b.png,d\xffg\n")
    msg = error_of(load_csv, folder / "labels.csv")
    assert "labels.csv:3:" in msg and "UTF-8" in msg


def test_csv_duplicate_class_in_classes_file(tmp_path: Path) -> None:
    """A duplicate name in classes.txt names the file, its line and the first line."""
    csv_path = make_csv_folder(
        tmp_path / "d", ["image,labels", "img/a.png,cat"], classes=["cat", "", "dog", "cat"], images=IMAGES
    )
    msg = error_of(load_csv, csv_path)
    assert "classes.txt:4:" in msg and "duplicate class 'cat' (first on line 1)" in msg
    assert "classes.txt:4:" in error_of(read_classes_file, tmp_path / "d" / "classes.txt")


def test_csv_empty_or_header_only_or_no_train(tmp_path: Path) -> None:
    """Empty file, header-only file, no train rows and a missing file are errors."""
    folder = tmp_path / "d"
    make_csv_folder(folder, [], images=IMAGES)
    (folder / "labels.csv").write_text("\n\n", encoding="utf-8")
    assert "empty file" in error_of(load_csv, folder / "labels.csv")
    (folder / "labels.csv").write_text("image,labels\n", encoding="utf-8")
    assert "no data rows" in error_of(load_csv, folder / "labels.csv")
    (folder / "labels.csv").write_text("image,labels,split\nimg/a.png,cat,test\n", encoding="utf-8")
    assert "no training images" in error_of(load_csv, folder / "labels.csv")
    assert "not found" in error_of(load_csv, folder / "nope.csv")


def test_write_csv_round_trip(tmp_path: Path) -> None:
    """write_csv output (relative paths under the folder) loads back identically."""
    folder = tmp_path / "out"
    inside = [make_image(folder / "images" / f"{i}.png") for i in range(3)]
    outside = make_image(tmp_path / "other" / "o.png")
    classes = ["red", "green"]
    train = LabelledImages([inside[0], inside[1], outside], np.array([[1, 0], [1, 1], [0, 1]]), classes)
    test = LabelledImages([inside[2]], np.array([[0, 1]]), classes)
    csv_path = write_csv(folder, {"train": train, "test": test})
    text = csv_path.read_text(encoding="utf-8").splitlines()
    assert text[0] == "image,labels,split"
    assert text[1] == "images/0.png,red,train"
    assert text[2] == "images/1.png,red;green,train"
    assert text[3] == f"{outside.resolve()},green,train"
    assert (folder / "classes.txt").read_text(encoding="utf-8") == "red\ngreen\n"
    splits = load_csv(csv_path)
    assert splits.classes == classes
    assert splits.train.paths == [p.resolve() for p in train.paths]
    np.testing.assert_array_equal(splits.train.labels, train.labels)
    assert splits.test is not None
    np.testing.assert_array_equal(splits.test.labels, test.labels)
    with pytest.raises(DataError, match="no positive label"):
        write_csv(folder, {"train": LabelledImages([inside[0]], np.zeros((1, 2)), classes)})
    with pytest.raises(DataError, match="a leading -"):  # it would read back as a known negative
        write_csv(folder, {"train": LabelledImages([inside[0]], np.ones((1, 2)), ["red", "-"])})


# ------------------------------------------------------------------------------------------------ VOC

Objects = list[tuple[str, int]]  # (class name, difficult)


def voc_xml(objects: Objects) -> str:
    """Return a VOC annotation XML text with ``objects``."""
    parts = ["<annotation>", "  <filename>x.jpg</filename>"]
    for name, difficult in objects:
        parts += [
            "  <object>",
            f"    <name>{name}</name>",
            "    <pose>Unspecified</pose>",
            f"    <difficult>{difficult}</difficult>",
            "    <part><name>head</name></part>" if name == "person" else "",
            "  </object>",
        ]
    parts.append("</annotation>")
    return "\n".join(parts) + "\n"


def make_voc(
    devkit: Path,
    year: str,
    annotations: dict[str, Objects],
    lists: dict[str, list[str]],
    without_xml: Sequence[str] = (),
    without_jpeg: Sequence[str] = (),
) -> Path:
    """Build ``devkit/VOC<year>`` with XMLs, JPEGs and ImageSets/Main list files; return the year folder."""
    year_dir = devkit / f"VOC{year}"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (year_dir / sub).mkdir(parents=True, exist_ok=True)
    for image_id, objects in annotations.items():
        if image_id not in without_xml:
            (year_dir / "Annotations" / f"{image_id}.xml").write_text(voc_xml(objects), encoding="utf-8")
        if image_id not in without_jpeg:
            make_image(year_dir / "JPEGImages" / f"{image_id}.jpg", fmt="JPEG")
    for name, ids in lists.items():
        (year_dir / "ImageSets" / "Main" / name).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return year_dir


VOC_ANNOTATIONS: dict[str, Objects] = {
    "2012_000001": [("dog", 0), ("cat", 1), ("person", 0)],
    "2012_000002": [("aeroplane", 0), ("tvmonitor", 0), ("aeroplane", 1)],
    "2012_000003": [("bird", 1)],  # difficult only -> skipped
    "2012_000004": [("cat", 0)],
    "2012_000005": [],  # no object -> skipped
}
VOC_LISTS = {
    "train.txt": ["2012_000001", "2012_000002", "2012_000003"],
    "val.txt": ["2012_000004", "2012_000005"],
}


def row(*names: str) -> list[int]:
    """0/1 row over VOC_CLASSES with ``names`` set."""
    return [int(c in names) for c in VOC_CLASSES]


def test_voc2012_valid_and_difficult_handling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """VOC2012: train.txt/val.txt splits, difficult objects absent, empty images skipped."""
    devkit = tmp_path / "VOCdevkit"
    year_dir = make_voc(devkit, "2012", VOC_ANNOTATIONS, VOC_LISTS)
    for root in (devkit, year_dir, tmp_path):  # VOCdevkit, VOCdevkit/VOC2012, or its parent
        splits = load_voc(root)
        assert splits.name == "voc2012"
        assert splits.source == f"voc:{root.resolve()}"
        assert splits.classes == list(VOC_CLASSES) and len(VOC_CLASSES) == 20
        assert splits.classes[0] == "aeroplane" and splits.classes[-1] == "tvmonitor"
        assert splits.val is None and splits.test is not None
        np.testing.assert_array_equal(
            splits.train.labels, [row("dog", "person"), row("aeroplane", "tvmonitor")]
        )
        np.testing.assert_array_equal(splits.test.labels, [row("cat")])
        assert splits.train.labels.dtype == np.uint8
        jpegs = year_dir.resolve() / "JPEGImages"
        assert splits.train.paths == [jpegs / "2012_000001.jpg", jpegs / "2012_000002.jpg"]
        assert all(p.is_absolute() for p in splits.train.paths + splits.test.paths)
        assert splits.notes == [
            "voc: skipped 1 of 3 images in train.txt with no non-difficult object",
            "voc: skipped 1 of 2 images in val.txt with no non-difficult object",
        ]
        err = capsys.readouterr().err
        assert "voc: skipped 1 of 3 images in train.txt with no non-difficult object" in err
    assert find_voc_dir(devkit) == year_dir.resolve()


def test_voc2007_uses_trainval_and_test(tmp_path: Path) -> None:
    """An annotated test.txt (VOC2007) gives train = trainval, test = test."""
    annotations = {f"00000{i}": [("cat", 0)] if i % 2 else [("horse", 0), ("sofa", 0)] for i in range(1, 7)}
    lists = {
        "train.txt": ["000001", "000002"],
        "val.txt": ["000003"],
        "trainval.txt": ["000001", "000002", "000003"],
        "test.txt": ["000004", "000005", "000006"],
    }
    make_voc(tmp_path / "VOCdevkit", "2007", annotations, lists)
    splits = load_voc(tmp_path / "VOCdevkit")
    assert splits.name == "voc2007"
    assert splits.test is not None
    assert (len(splits.train), len(splits.test)) == (3, 3)
    assert [p.stem for p in splits.test.paths] == ["000004", "000005", "000006"]
    expected = [row("horse", "sofa"), row("cat"), row("horse", "sofa")]
    np.testing.assert_array_equal(splits.test.labels, expected)


def test_voc_test_list_without_annotations_falls_back_to_train_val(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A test.txt without annotations falls back to train/val with a note."""
    annotations = dict(VOC_ANNOTATIONS, **{"2012_000009": [("cat", 0)]})
    lists = dict(VOC_LISTS, **{"test.txt": ["2012_000009"], "trainval.txt": ["2012_000001"]})
    make_voc(tmp_path / "VOCdevkit", "2012", annotations, lists, without_xml=["2012_000009"])
    splits = load_voc(tmp_path / "VOCdevkit")
    assert splits.test is not None
    assert (len(splits.train), len(splits.test)) == (2, 1)
    assert "lacks annotations for 1 of 1 images" in capsys.readouterr().err


def test_voc_malformed_xml_names_file_and_line(tmp_path: Path) -> None:
    """Malformed XML names the XML file and the parser's line."""
    year_dir = make_voc(tmp_path / "VOCdevkit", "2012", VOC_ANNOTATIONS, VOC_LISTS)
    (year_dir / "Annotations" / "2012_000002.xml").write_text(
        "<annotation>\n  <object>\n    <name>cat</name>\n  </objec>\n</annotation>\n", encoding="utf-8"
    )
    msg = error_of(load_voc, tmp_path / "VOCdevkit")
    assert "2012_000002.xml:4:" in msg and "malformed XML" in msg


def test_voc_unknown_class_names_xml(tmp_path: Path) -> None:
    """An unknown object class names the XML file."""
    annotations = dict(VOC_ANNOTATIONS, **{"2012_000002": [("aeroplane", 0), ("dgo", 0)]})
    make_voc(tmp_path / "VOCdevkit", "2012", annotations, VOC_LISTS)
    msg = error_of(load_voc, tmp_path / "VOCdevkit")
    assert "2012_000002.xml" in msg and "unknown class 'dgo'" in msg and "did you mean 'dog'" in msg


def test_voc_missing_jpeg_names_id_and_list(tmp_path: Path) -> None:
    """A missing JPEG names the list file, line and image id."""
    make_voc(tmp_path / "VOCdevkit", "2012", VOC_ANNOTATIONS, VOC_LISTS, without_jpeg=["2012_000005"])
    msg = error_of(load_voc, tmp_path / "VOCdevkit")
    assert "val.txt:2:" in msg and "'2012_000005'" in msg and "2012_000005.jpg" in msg


def test_voc_structure_errors(tmp_path: Path) -> None:
    """Non-VOC folder, ambiguous years and a malformed list file are errors."""
    assert "not a PASCAL VOC folder" in error_of(load_voc, tmp_path)
    make_voc(tmp_path / "VOCdevkit", "2012", VOC_ANNOTATIONS, VOC_LISTS)
    make_voc(tmp_path / "VOCdevkit", "2007", VOC_ANNOTATIONS, VOC_LISTS)
    assert "several VOC years found (VOC2007, VOC2012)" in error_of(load_voc, tmp_path / "VOCdevkit")
    val_list = tmp_path / "VOCdevkit" / "VOC2012" / "ImageSets" / "Main" / "val.txt"
    val_list.write_text("a b\n", encoding="utf-8")
    msg = error_of(load_voc, tmp_path / "VOCdevkit" / "VOC2012")
    assert "val.txt:1:" in msg and "one image id per line" in msg


# ----------------------------------------------------------------------------------------------- COCO

COCO_CATEGORIES = [  # deliberately not in id order
    {"id": 18, "name": "dog", "supercategory": "animal"},
    {"id": 1, "name": "person", "supercategory": "person"},
    {"id": 3, "name": "car", "supercategory": "vehicle"},
]


def make_coco_split(
    root: Path,
    split: str,
    year: str,
    annotations: list[dict[str, int]],
    n_images: int = 3,
    categories: list[dict[str, object]] | None = None,
) -> Path:
    """Write ``annotations/instances_<split><year>.json`` and its images; return the json path."""
    images = []
    for i in range(1, n_images + 1):
        name = f"COCO_{split}{year}_{i:012d}.jpg"
        make_image(root / f"{split}{year}" / name, fmt="JPEG")
        images.append({"id": i * 10, "file_name": name, "width": 4, "height": 4})
    data = {
        "info": {},
        "images": images,
        "annotations": annotations,
        "categories": COCO_CATEGORIES if categories is None else categories,
    }
    path = root / "annotations" / f"instances_{split}{year}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def ann(ann_id: int, image_id: int, category_id: int) -> dict[str, int]:
    """A minimal COCO instance annotation."""
    return {"id": ann_id, "image_id": image_id, "category_id": category_id, "iscrowd": 0}


def make_coco(root: Path, year: str = "2014") -> Path:
    """A valid tiny COCO root: train has 3 images (one unannotated), val 2 images (one unannotated)."""
    make_coco_split(root, "train", year, [ann(1, 10, 18), ann(2, 10, 1), ann(3, 30, 3), ann(4, 30, 3)])
    make_coco_split(root, "val", year, [ann(5, 20, 1)], n_images=2)
    return root


def test_coco_valid_skips_unannotated_with_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Classes by category id, labels, skipped unannotated images counted per split."""
    root = make_coco(tmp_path / "coco")
    splits = load_coco(root)
    assert splits.name == "coco2014" and splits.source == f"coco:{root.resolve()}"
    assert splits.classes == ["person", "car", "dog"]  # sorted by category id
    assert splits.val is None and splits.test is not None
    assert splits.train.classes == splits.classes == splits.test.classes
    np.testing.assert_array_equal(splits.train.labels, [[1, 0, 1], [0, 1, 0]])
    np.testing.assert_array_equal(splits.test.labels, [[1, 0, 0]])
    assert splits.train.labels.dtype == np.uint8
    assert splits.train.paths == [
        (root / "train2014" / f"COCO_train2014_{i:012d}.jpg").resolve() for i in (1, 3)
    ]
    assert splits.test.paths == [(root / "val2014" / "COCO_val2014_000000000002.jpg").resolve()]
    err = capsys.readouterr().err
    assert "coco: skipped 1 of 3 train2014 images with no instance annotation" in err
    assert "coco: skipped 1 of 2 val2014 images with no instance annotation" in err
    assert len(splits.notes) == 2


def test_coco_prefers_2014_else_2017(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2017 is used alone; with both years 2014 wins and a note says so."""
    root = make_coco(tmp_path / "coco", "2017")
    assert load_coco(root).name == "coco2017"
    make_coco(root, "2014")
    capsys.readouterr()
    splits = load_coco(root)
    assert splits.name == "coco2014"
    assert all("train2014" in str(p) for p in splits.train.paths)
    assert "using 2014" in capsys.readouterr().err


def test_coco_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    """Malformed JSON names the json file and the decoder's line."""
    root = make_coco(tmp_path / "coco")
    (root / "annotations" / "instances_train2014.json").write_text('{\n  "images": [],\n  oops\n}\n')
    msg = error_of(load_coco, root)
    assert "instances_train2014.json:3:" in msg and "malformed JSON" in msg


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        (ann(77, 10, 999), "annotation id 77: unknown category_id 999"),
        (ann(78, 12345, 1), "annotation id 78: unknown image_id 12345"),
        ({"id": 79, "image_id": 10}, "annotation id 79: missing key 'category_id'"),
        ({"image_id": 10, "category_id": 1}, "annotation #2: missing key 'id'"),
    ],
)
def test_coco_bad_annotations(tmp_path: Path, annotation: dict[str, int], fragment: str) -> None:
    """Bad annotations name the json file and the annotation id."""
    root = make_coco(tmp_path / "coco")
    make_coco_split(root, "val", "2014", [ann(5, 20, 1), annotation], n_images=2)
    msg = error_of(load_coco, root)
    assert "instances_val2014.json" in msg and fragment in msg, msg


def test_coco_structure_errors(tmp_path: Path) -> None:
    """Missing image, missing top-level key, differing categories, non-COCO folder."""
    root = make_coco(tmp_path / "coco")
    (root / "val2014" / "COCO_val2014_000000000002.jpg").unlink()
    msg = error_of(load_coco, root)
    assert "instances_val2014.json" in msg and "image id 20" in msg and "COCO_val2014_000000000002.jpg" in msg
    path = root / "annotations" / "instances_train2014.json"
    path.write_text(json.dumps({"images": [], "annotations": []}), encoding="utf-8")
    assert "missing top-level key 'categories'" in error_of(load_coco, root)
    make_coco_split(root, "train", "2014", [ann(1, 10, 1)], categories=COCO_CATEGORIES[:2])
    assert "categories differ" in error_of(load_coco, root)
    assert "not a COCO folder" in error_of(load_coco, tmp_path)


# ------------------------------------------------------------------------------------------- registry


def test_registry_kinds_and_help() -> None:
    """The kinds are registered, the help lists them, builtin arguments parse."""
    assert set(DATASET_KINDS) == {"builtin", "csv", "voc", "coco", "cub", "nus", "formatted", "folder",
                                  "openclipart", "tuxpaint", "icons"}
    text = describe_kinds()
    for form in ("builtin", "csv:", "voc:", "coco:", "cub:", "nus:", "formatted:", "folder:", "auto-detected"):
        assert form in text
    assert parse_builtin_argument("tiny") == ("tiny", 0)
    assert parse_builtin_argument("tiny@seed3") == ("tiny", 3)
    assert parse_builtin_argument("") == ("default", 0)
    assert parse_builtin_argument("@seed7") == ("default", 7)
    with pytest.raises(DataError, match="builtin:<preset>"):
        parse_builtin_argument("tiny@3")


def test_registry_csv_voc_coco_specs_and_autodetect(tmp_path: Path) -> None:
    """``kind:arg`` specs and bare paths load each kind; sources round-trip."""
    csv_path = make_csv_folder(tmp_path / "mine", ["image,labels", "img/a.png,cat"], images=IMAGES)
    make_voc(tmp_path / "voc" / "VOCdevkit", "2012", VOC_ANNOTATIONS, VOC_LISTS)
    coco_root = make_coco(tmp_path / "coco")
    devkit = tmp_path / "voc" / "VOCdevkit"

    for spec in (f"csv:{csv_path}", f"csv:{csv_path.parent}", str(csv_path), str(csv_path.parent)):
        splits = load_dataset(spec)
        assert splits.name == "mine" and splits.source == f"csv:{csv_path.resolve()}"
        assert load_dataset(splits.source).source == splits.source  # round-trips
    for spec in (f"voc:{devkit}", str(devkit), str(devkit / "VOC2012"), str(tmp_path / "voc")):
        assert load_dataset(spec).name == "voc2012"
    for spec in (f"coco:{coco_root}", str(coco_root)):
        assert load_dataset(spec).name == "coco2014"

    assert detect_kind(csv_path) == "csv"
    assert detect_kind(devkit) == "voc"
    assert detect_kind(coco_root) == "coco"
    assert detect_kind(tmp_path) is None
    assert detect_kind(tmp_path / "mine" / "img" / "a.png") is None


def test_registry_errors_list_accepted_forms(tmp_path: Path) -> None:
    """Unknown kinds and undetectable paths raise DataError listing the forms."""
    msg = error_of(load_dataset, "imagenet:/data/imagenet")
    assert "unknown dataset kind 'imagenet'" in msg and "csv:<labels.csv" in msg and "voc:" in msg
    (tmp_path / "junk").mkdir()
    msg = error_of(load_dataset, str(tmp_path / "junk"))
    assert "cannot tell what kind of dataset" in msg and "coco:" in msg
    msg = error_of(load_dataset, str(tmp_path / "missing"))
    assert "no such file or folder" in msg and "builtin" in msg
    assert "labels.csv" in error_of(load_dataset, f"csv:{tmp_path / 'junk'}")
    assert "needs an argument" in error_of(load_dataset, "voc")
    assert "Dataset specs" in error_of(load_dataset, "  ")


def _fake_builtin(tmp_path: Path, calls: list[tuple[str, int]]) -> Callable[..., Path]:
    """An ``ensure_builtin`` stand-in that writes a two-image CSV dataset and records its arguments."""

    def ensure_builtin(preset: str = "default", seed: int = 0, **_: object) -> Path:
        """Write the stand-in dataset for (preset, seed) and return its folder."""
        calls.append((preset, seed))
        folder = tmp_path / f"{preset}-{seed}"
        paths = [make_image(folder / "images" / f"{i}.png") for i in range(2)]
        write_csv(folder, {"train": LabelledImages(paths, np.array([[1, 0], [0, 1]]), ["a", "b"])})
        return folder

    return ensure_builtin


def test_registry_builtin_plumbing_with_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """builtin specs call ensure_builtin(preset, seed) and set name/source."""
    calls: list[tuple[str, int]] = []
    fake = types.ModuleType("models.sources.builtin")
    fake.BUILTIN_PRESETS = {"tiny": None, "default": None, "large": None}  # type: ignore[attr-defined]
    fake.ensure_builtin = _fake_builtin(tmp_path, calls)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "models.sources.builtin", fake)
    monkeypatch.setattr(models.sources, "builtin", fake, raising=False)

    splits = load_dataset("builtin:tiny@seed3")
    assert (splits.name, splits.source) == ("builtin-tiny", "builtin:tiny@seed3")
    assert splits.classes == ["a", "b"] and len(splits.train) == 2
    assert load_dataset(splits.source).source == splits.source
    assert load_dataset("builtin").source == "builtin:default@seed0"
    assert load_dataset("builtin:large").name == "builtin-large"
    assert calls == [("tiny", 3), ("tiny", 3), ("default", 0), ("large", 0)]
    assert "unknown builtin preset 'huge'" in error_of(load_dataset, "builtin:huge")


def test_registry_builtin_real_module_interface(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real builtin module exposes the presets and signature the registry uses."""
    builtin = pytest.importorskip("models.sources.builtin")
    assert {"tiny", "default", "large"} <= set(builtin.BUILTIN_PRESETS)
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(builtin, "ensure_builtin", _fake_builtin(tmp_path, calls))
    assert load_dataset("builtin:tiny@seed2").source == "builtin:tiny@seed2"
    assert calls == [("tiny", 2)]


def test_registry_builtin_tiny_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """builtin:tiny generates (into tmp_path) and loads through load_csv."""
    builtin = pytest.importorskip("models.sources.builtin")
    real = builtin.ensure_builtin

    def in_tmp(preset: str = "default", seed: int = 0, **_: object) -> Path:
        """Generate into tmp_path, quietly, instead of the user's cache."""
        return real(preset=preset, seed=seed, cache_dir=tmp_path, workers=1, progress=False)

    monkeypatch.setattr(builtin, "ensure_builtin", in_tmp)
    splits = load_dataset("builtin:tiny@seed1")
    assert (splits.name, splits.source) == ("builtin-tiny", "builtin:tiny@seed1")
    assert splits.test is not None and len(splits.train) > 0 and len(splits.test) > 0
    assert splits.train.labels.dtype == np.uint8 and splits.train.labels.sum(axis=1).min() >= 1
    assert all(p.is_absolute() and p.is_relative_to(tmp_path.resolve()) for p in splits.train.paths)


def test_spec_options_split_path_and_reject_unknown_keys() -> None:
    from models.data.spec_options import split_spec_options

    assert split_spec_options("/d/nus?images=/mnt/x&keep-unlabelled", {"images", "keep-unlabelled"}, "nus") == (
        "/d/nus", {"images": "/mnt/x", "keep-unlabelled": ""})
    assert split_spec_options("/d/nus", {"images"}, "nus") == ("/d/nus", {})
    with pytest.raises(DataError, match="unknown option 'imgs' \\(accepted: images\\)"):
        split_spec_options("/d?imgs=/x", {"images"}, "nus")
