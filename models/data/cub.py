"""CUB-200-2011 with its 312 binary attributes as the labels (``--data cub:DIR``; docs/datasets.md, "cub"): a line is
read by its first three fields, certainty ignored."""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

import numpy as np
from tqdm import tqdm

from models.data.csv_format import emit_note
from models.data.file_scan import scan_files
from models.data.text_files import iter_lines, read_table
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

__all__ = ["CUB_FOLDER", "find_cub_dir", "load_cub"]

CUB_FOLDER = "CUB_200_2011"
OFFICIAL_IMAGES = 11_788
OFFICIAL_ATTRIBUTES = 312
LABELS_FILE = "attributes/image_attribute_labels.txt"
_REQUIRED = ("images.txt", "train_test_split.txt", LABELS_FILE)
_EXPECTED = (f"expected the official {CUB_FOLDER} release: images.txt, train_test_split.txt, {LABELS_FILE}, "
             f"images/, and attributes.txt in it or beside it")


def find_cub_dir(root: Path) -> Path | None:
    """The ``CUB_200_2011`` folder at ``root`` (itself or its child), or None."""
    root = Path(root).expanduser().resolve()
    return next((d for d in (root, root / CUB_FOLDER) if (d / "images.txt").is_file()), None)


def _attribute_names_file(cub_dir: Path) -> Path:
    """``attributes.txt``: inside the folder, in ``attributes/``, or beside the folder (the archive's place)."""
    candidates = (cub_dir / "attributes.txt", cub_dir / "attributes" / "attributes.txt",
                  cub_dir.parent / "attributes.txt")
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        raise DataError(f"{cub_dir}: missing attributes.txt (looked in {cub_dir}, {cub_dir / 'attributes'} and "
                        f"{cub_dir.parent}; it ships beside {CUB_FOLDER}/ in the official archive)")
    return found


def _id_table(path: Path, value_name: str) -> dict[int, tuple[str, int]]:
    """Read ``id value`` lines into ``{id: (value, line)}``; a non-integer or repeated id -> ``DataError``."""
    table: dict[int, tuple[str, int]] = {}
    for lineno, (raw_id, value) in read_table(path, ("id", value_name)):
        try:
            key = int(raw_id)
        except ValueError:
            raise DataError(f"{path}:{lineno}: id must be an integer, found {raw_id!r}") from None
        if key in table:
            raise DataError(f"{path}:{lineno}: id {key} repeated (first on line {table[key][1]})")
        table[key] = (value, lineno)
    if not table:
        raise DataError(f"{path}: file is empty")
    return table


def _read_attribute_rows(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The first three fields of each line as int arrays, with 1-based line numbers."""
    images, attributes, present, lines = array("i"), array("i"), array("b"), array("i")
    lines_in_file = tqdm(iter_lines(path), desc="cub attributes", unit="line", file=sys.stderr, leave=False,
                         disable=None, mininterval=0.5)  # the bar shows when stderr is a terminal
    for lineno, raw in enumerate(lines_in_file, start=1):
        parts = raw.split(None, 3)
        if not parts:
            continue
        try:
            image_id, attribute_id, is_present = int(parts[0]), int(parts[1]), int(parts[2])
        except (ValueError, IndexError):
            raise DataError(f"{path}:{lineno}: expected 'image_id attribute_id is_present ...', "
                            f"found {raw.strip()!r}") from None
        if is_present not in (0, 1):
            raise DataError(f"{path}:{lineno}: is_present must be 0 or 1, found {parts[2]!r}")
        images.append(image_id)
        attributes.append(attribute_id)
        present.append(is_present)
        lines.append(lineno)
    return (np.frombuffer(images, dtype=np.int32), np.frombuffer(attributes, dtype=np.int32),
            np.frombuffer(present, dtype=np.int8), np.frombuffer(lines, dtype=np.int32))


def _positions(values: np.ndarray, known_ids: list[int]) -> np.ndarray:
    """The index of each of ``values`` in ``known_ids`` (ids are integers), -1 for an id not in it."""
    known = np.asarray(known_ids, dtype=np.int64)
    low, high = min(int(known.min()), 0), int(known.max())
    table = np.full(high - low + 1, -1, dtype=np.int64)
    table[known - low] = np.arange(len(known))
    values = values.astype(np.int64)
    inside = (values >= low) & (values <= high)
    return np.where(inside, table[np.clip(values, low, high) - low], -1)


def _label_matrix(path: Path, image_ids: list[int], attribute_ids: list[int]) -> np.ndarray:
    """The (images, attributes) 0/1 matrix, one row per pair required (the first bad line reported)."""
    images, attributes, present, lines = _read_attribute_rows(path)
    rows, cols = _positions(images, image_ids), _positions(attributes, attribute_ids)
    for where, ids, what in ((rows, images, "image id"), (cols, attributes, "attribute id")):
        unknown = np.flatnonzero(where < 0)
        if unknown.size:
            k = unknown[0]
            raise DataError(f"{path}:{lines[k]}: unknown {what} {ids[k]} (not in "
                            f"{'images.txt' if what == 'image id' else 'attributes.txt'})")
    n_images, n_attributes = len(image_ids), len(attribute_ids)
    cell = rows * n_attributes + cols
    _, first_index, counts = np.unique(cell, return_index=True, return_counts=True)
    if np.any(counts > 1):
        seen = np.zeros(len(cell), dtype=bool)
        seen[first_index] = True
        again = int(np.flatnonzero(~seen)[0])
        first = int(np.flatnonzero(cell == cell[again])[0])
        raise DataError(f"{path}:{lines[again]}: image {images[again]} attribute {attributes[again]} appears "
                        f"twice (first on line {lines[first]}); expected one row per image and attribute")
    if len(cell) < n_images * n_attributes:
        covered = np.zeros(n_images * n_attributes, dtype=bool)
        covered[cell] = True
        gap = int(np.flatnonzero(~covered)[0])
        raise DataError(f"{path}: no row for image {image_ids[gap // n_attributes]} attribute "
                        f"{attribute_ids[gap % n_attributes]} (found {len(cell):,} rows; every image needs one "
                        f"row per attribute: {n_images:,} x {n_attributes} = {n_images * n_attributes:,})")
    labels = np.zeros((n_images, n_attributes), dtype=np.uint8)
    labels[rows, cols] = present
    return labels


def load_cub(root: Path | str) -> DatasetSplits:
    """Load CUB-200-2011 as train/test splits over the 312 attributes; source ``cub:<absolute folder>``."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{root}: CUB folder not found ({_EXPECTED})")
    cub_dir = find_cub_dir(root) or (root / CUB_FOLDER if (root / CUB_FOLDER).is_dir() else root)
    for name in (*_REQUIRED, "images"):
        if not (cub_dir / name).exists():
            raise DataError(f"{cub_dir}: missing {name} ({_EXPECTED})")
    names_file = _attribute_names_file(cub_dir)
    notes: list[str] = []

    images = _id_table(cub_dir / "images.txt", "path")
    split_path = cub_dir / "train_test_split.txt"
    is_train = _id_table(split_path, "is_train")
    for image_id, (_, lineno) in images.items():
        if image_id not in is_train:
            raise DataError(f"{split_path}: no line for image {image_id} (images.txt line {lineno})")
    for image_id, (flag, lineno) in is_train.items():
        if image_id not in images:
            raise DataError(f"{split_path}:{lineno}: unknown image id {image_id} (not in images.txt)")
        if flag not in ("0", "1"):
            raise DataError(f"{split_path}:{lineno}: is_train must be 0 or 1, found {flag!r}")
    attributes = _id_table(names_file, "name")
    image_ids, attribute_ids = sorted(images), sorted(attributes)
    labels = _label_matrix(cub_dir / LABELS_FILE, image_ids, attribute_ids)

    image_dir = cub_dir / "images"
    on_disk = scan_files(image_dir, desc="cub images")
    missing = [i for i in image_ids if images[i][0].replace("\\", "/") not in on_disk]
    if missing:
        path, lineno = images[missing[0]]
        raise DataError(f"{cub_dir / 'images.txt'}:{lineno}: image not found: {image_dir / path} "
                        f"({len(missing):,} of {len(image_ids):,} listed images are missing under {image_dir})")
    if (len(image_ids), len(attribute_ids)) != (OFFICIAL_IMAGES, OFFICIAL_ATTRIBUTES):
        emit_note(notes, f"cub: {len(image_ids):,} images x {len(attribute_ids)} attributes (the official release "
                         f"has {OFFICIAL_IMAGES:,} x {OFFICIAL_ATTRIBUTES})")
    classes = [attributes[a][0] for a in attribute_ids]
    first_of: dict[str, int] = {}
    for attribute_id, name in zip(attribute_ids, classes, strict=True):
        if name in first_of:
            raise DataError(f"{names_file}:{attributes[attribute_id][1]}: attribute name {name!r} repeated (first "
                            f"on line {attributes[first_of[name]][1]})")
        first_of[name] = attribute_id
    paths = [image_dir / images[i][0] for i in image_ids]
    train_rows = [row for row, i in enumerate(image_ids) if is_train[i][0] == "1"]
    test_rows = [row for row, i in enumerate(image_ids) if is_train[i][0] == "0"]
    if not train_rows:
        raise DataError(f"{split_path}: no image has is_train = 1")
    everything = LabelledImages(paths, labels, classes)
    return DatasetSplits(name="cub", source=f"cub:{cub_dir}", classes=classes, train=everything.subset(train_rows),
                         test=everything.subset(test_rows) if test_rows else None, notes=notes,
                         complete_splits=ALL_SPLITS)
