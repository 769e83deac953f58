"""MS-COCO (2014, else 2017) instance annotations as a multi-label dataset (docs/datasets.md, "coco"); images ordered as
the seeds' ``format_coco.py`` orders them, so the published splits and observed labels are reproduced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from models.data.csv_format import emit_note
from models.data.types import ALL_SPLITS, AnnotatedObject, DataError, DatasetSplits, LabelledImages, ObjectTable

__all__ = ["coco_objects", "find_coco_year", "load_coco"]

YEARS = ("2014", "2017")


def _json_path(root: Path, split: str, year: str) -> Path:
    """Path of ``annotations/instances_<split><year>.json`` under ``root``."""
    return root / "annotations" / f"instances_{split}{year}.json"


def _has_year(root: Path, year: str) -> bool:
    """True when ``root`` holds both the train and the val instance json of ``year``."""
    return _json_path(root, "train", year).is_file() and _json_path(root, "val", year).is_file()


def find_coco_year(root: Path) -> str | None:
    """Return the year ("2014" preferred, else "2017") whose train and val instance jsons exist, or None."""
    root = Path(root).expanduser().resolve()
    return next((year for year in YEARS if _has_year(root, year)), None)


def _read_json(path: Path) -> dict[str, Any]:
    """Load a COCO json; malformed JSON -> ``DataError`` with the file and line."""
    try:
        with path.open("r", encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: undecodable bytes (the file must be UTF-8 JSON): {exc.reason}") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read file: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object at the top level, found {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if key not in data:
            raise DataError(f"{path}: missing top-level key {key!r}")
        if not isinstance(data[key], list):
            raise DataError(f"{path}: {key!r} must be a list, found {type(data[key]).__name__}")
    return data


def _field(path: Path, record: Any, key: str, kind: type, what: str) -> Any:
    """Return ``record[key]`` checked to be of ``kind`` (ints exclude bools); else ``DataError`` naming it."""
    if not isinstance(record, dict):
        raise DataError(f"{path}: {what}: expected a JSON object, found {type(record).__name__}")
    if key not in record:
        raise DataError(f"{path}: {what}: missing key {key!r}")
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DataError(f"{path}: {what}: {key!r} must be {kind.__name__}, found {value!r}")
    return value


def _categories(path: Path, data: dict[str, Any], json_order: bool = False) -> list[tuple[int, str]]:
    """(id, name) of every category by id (or json order); ``DataError`` on duplicates."""
    cats: dict[int, str] = {}
    for number, cat in enumerate(data["categories"], start=1):
        cat_id = _field(path, cat, "id", int, f"category #{number}")
        name = _field(path, cat, "name", str, f"category id {cat_id}").strip()
        if not name:
            raise DataError(f"{path}: category id {cat_id}: empty name")
        if cat_id in cats:
            raise DataError(f"{path}: duplicate category id {cat_id}")
        if name in cats.values():
            raise DataError(f"{path}: category id {cat_id}: duplicate category name {name!r}")
        cats[cat_id] = name
    if not cats:
        raise DataError(f"{path}: no categories")
    return list(cats.items()) if json_order else sorted(cats.items())


def _load_split(
    root: Path,
    split: str,
    year: str,
    path: Path,
    data: dict[str, Any],
    categories: list[tuple[int, str]],
    notes: list[str],
) -> tuple[LabelledImages, list[int]]:
    """The label matrix of one json, rows ordered as the seeds' (by id as a string); the images and their ids."""
    image_dir = root / f"{split}{year}"
    cat_index = {cat_id: i for i, (cat_id, _) in enumerate(categories)}
    image_index: dict[int, int] = {}
    paths: list[Path] = []
    ids: list[int] = []
    for number, image in enumerate(data["images"], start=1):
        image_id = _field(path, image, "id", int, f"image #{number}")
        file_name = _field(path, image, "file_name", str, f"image id {image_id}")
        if image_id in image_index:
            raise DataError(f"{path}: duplicate image id {image_id}")
        image_path = (image_dir / file_name).resolve()
        if not image_path.is_file():
            raise DataError(f"{path}: image id {image_id}: image not found: {image_path}")
        image_index[image_id] = len(paths)
        paths.append(image_path)
        ids.append(image_id)

    labels = np.zeros((len(paths), len(categories)), dtype=np.uint8)
    for number, ann in enumerate(data["annotations"], start=1):
        ann_id = ann.get("id", f"#{number}") if isinstance(ann, dict) else f"#{number}"
        what = f"annotation id {ann_id}"
        _field(path, ann, "id", int, f"annotation #{number}")
        image_id = _field(path, ann, "image_id", int, what)
        cat_id = _field(path, ann, "category_id", int, what)
        if image_id not in image_index:
            raise DataError(f"{path}: {what}: unknown image_id {image_id}")
        if cat_id not in cat_index:
            raise DataError(f"{path}: {what}: unknown category_id {cat_id}")
        labels[image_index[image_id], cat_index[cat_id]] = 1

    keep = sorted(np.flatnonzero(labels.any(axis=1)).tolist(), key=lambda row: str(ids[row]))
    skipped = len(paths) - len(keep)
    if skipped:
        emit_note(
            notes,
            f"coco: skipped {skipped} of {len(paths)} {split}{year} images with no instance annotation")
    if len(keep) == 0:
        raise DataError(f"{path}: no image has an instance annotation")
    classes = [name for _, name in categories]
    return LabelledImages([paths[i] for i in keep], labels[keep], classes), [ids[i] for i in keep]


def _is_number(value: Any) -> bool:
    """True for a JSON number (int or float, not bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(path: Path, record: dict[str, Any], key: str, what: str) -> float:
    """``record[key]``, a number; else ``DataError`` naming it."""
    value = record.get(key)
    if not _is_number(value):
        raise DataError(f"{path}: {what}: {key!r} must be a number, found {value!r}")
    return value


def coco_objects(path: Path, image_ids: list[int], categories: list[tuple[int, str]] | None = None) -> ObjectTable:
    """The :class:`ObjectTable` of ``image_ids`` from the instance json ``path``."""
    data = _read_json(path)
    if categories is None:
        categories = _categories(path, data, json_order=True)
    sizes: dict[int, tuple[float, float]] = {}
    for image in data["images"]:
        image_id = _field(path, image, "id", int, "image")
        what = f"image id {image_id}"
        sizes[image_id] = (_number(path, image, "width", what), _number(path, image, "height", what))
    column = {cat_id: i for i, (cat_id, _) in enumerate(categories)}
    objects: dict[int, list[AnnotatedObject]] = {image_id: [] for image_id in image_ids}
    for ann in data["annotations"]:
        image_id = ann.get("image_id") if isinstance(ann, dict) else None
        if image_id not in objects:
            continue
        what = f"annotation id {ann.get('id')}"
        box = ann.get("bbox")
        if not isinstance(box, list) or len(box) != 4 or not all(_is_number(v) for v in box):
            raise DataError(f"{path}: {what}: 'bbox' must be [x, y, width, height], found {box!r}")
        x, y, w, h = box
        objects[image_id].append((column[ann["category_id"]], _number(path, ann, "area", what), x + w / 2, y + h / 2))
    missing = [i for i in image_ids if i not in sizes]
    if missing:
        raise DataError(f"{path}: image id {missing[0]} is not in its images")
    return ObjectTable.from_rows([objects[i] for i in image_ids], [sizes[i] for i in image_ids])


def load_coco(root: Path, reference: bool = False) -> DatasetSplits:
    """Load MS-COCO from ``root`` (module docstring) as train/test splits named ``coco2014`` or ``coco2017``."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{root}: COCO root folder not found")
    year = find_coco_year(root)
    if year is None:
        expected = " or ".join(
            f"{_json_path(root, 'train', y).relative_to(root)} + {_json_path(root, 'val', y).name}"
            for y in YEARS)
        raise DataError(f"{root}: not a COCO folder (expected {expected})")
    notes: list[str] = []
    if year == "2014" and _has_year(root, "2017"):
        emit_note(notes, "coco: both 2014 and 2017 annotations found; using 2014 (the papers' protocol)")

    train_path, val_path = _json_path(root, "train", year), _json_path(root, "val", year)
    train_data = _read_json(train_path)
    train_cats = _categories(train_path, train_data, reference)
    train, train_ids = _load_split(root, "train", year, train_path, train_data, train_cats, notes)
    del train_data  # the real train json is large: free it before reading the val json
    val_data = _read_json(val_path)
    if _categories(val_path, val_data, reference) != train_cats:
        raise DataError(f"{val_path}: categories differ from those in {train_path.name}")
    test, _ = _load_split(root, "val", year, val_path, val_data, train_cats, notes)
    classes = [name for _, name in train_cats]
    return DatasetSplits(name=f"coco{year}", source=f"coco:{root}" + ("?reference" if reference else ""),
                         classes=classes, train=train, test=test, notes=notes,
                         train_objects=lambda: coco_objects(train_path, train_ids, train_cats),
                         complete_splits=ALL_SPLITS)
