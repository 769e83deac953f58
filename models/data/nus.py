"""NUS-WIDE with its 81 concepts (``--data nus:DIR``) from the official downloads (docs/datasets.md, "nus"); missing and
unlabelled images are dropped with a note."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.data.csv_format import emit_note
from models.data.file_scan import scan_files
from models.data.spec_options import split_spec_options
from models.data.text_files import read_lines
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

__all__ = ["NUS_OPTIONS", "is_nus_dir", "load_nus", "load_nus_spec", "relative_image_path"]

OFFICIAL_CONCEPTS = 81
CONCEPT_FILES = ("Concepts81.txt", "ConceptsList/Concepts81.txt")
IMAGE_LISTS = {"train": "ImageList/TrainImagelist.txt", "test": "ImageList/TestImagelist.txt"}
LABELS_DIR = "Groundtruth/TrainTestLabels"
NUS_OPTIONS = ("images", "keep-unlabelled")
_EXPECTED = ("expected the official NUS-WIDE layout: Concepts81.txt, ImageList/TrainImagelist.txt, "
             f"ImageList/TestImagelist.txt, {LABELS_DIR}/Labels_<concept>_{{Train,Test}}.txt and Flickr/")
_TRUE, _FALSE = ("", "1", "true", "yes"), ("0", "false", "no")


def is_nus_dir(root: Path) -> bool:
    """True when ``root`` holds a concept list and the train image list of the official layout."""
    root = Path(root)
    return any((root / name).is_file() for name in CONCEPT_FILES) and (root / IMAGE_LISTS["train"]).is_file()


def _concepts(root: Path) -> list[str]:
    """The concept names, in order; duplicates or an empty list -> ``DataError``."""
    path = next((root / name for name in CONCEPT_FILES if (root / name).is_file()), None)
    if path is None:
        raise DataError(f"{root}: missing Concepts81.txt ({_EXPECTED})")
    names: list[str] = []
    for lineno, raw in enumerate(read_lines(path), start=1):
        name = raw.strip()
        if name in names:
            raise DataError(f"{path}:{lineno}: concept {name!r} repeated")
        if name:
            names.append(name)
    if not names:
        raise DataError(f"{path}: no concept names")
    return names


def relative_image_path(entry: str) -> str:
    """An image-list entry as a ``/``-separated path under the image folder (``actor\\x.jpg`` ->
    ``actor/x.jpg``; ``C:\\ImageData\\Flickr\\actor\\x.jpg`` -> ``actor/x.jpg``)."""
    parts = [part for part in entry.strip().replace("\\", "/").split("/") if part]
    if "Flickr" in parts:
        parts = parts[len(parts) - parts[::-1].index("Flickr"):]
    elif parts and parts[0].endswith(":"):
        parts = parts[-2:]
    return "/".join(parts)


def _image_list(root: Path, split: str) -> list[str]:
    """The relative image paths of the official ``split`` list, in file order (blank lines skipped)."""
    path = root / IMAGE_LISTS[split]
    if not path.is_file():
        raise DataError(f"{root}: missing {IMAGE_LISTS[split]} ({_EXPECTED})")
    entries = [relative_image_path(line) for line in read_lines(path) if line.strip()]
    if not entries:
        raise DataError(f"{path}: image list is empty")
    return entries


def _label_column(path: Path, root: Path, split: str, count: int) -> np.ndarray:
    """One concept's 0/1 labels for ``count`` images; ``DataError`` naming a bad file."""
    if not path.is_file():
        raise DataError(f"{root}: missing {path.relative_to(root)} ({_EXPECTED})")
    try:
        values = np.array(path.read_bytes().split())
    except OSError as exc:
        raise DataError(f"{path}: cannot read file: {exc.strerror or exc}") from exc
    if len(values) != count:
        which = "short" if len(values) < count else "long"
        raise DataError(f"{path}: {len(values):,} labels but {IMAGE_LISTS[split]} lists {count:,} images "
                        f"(the label file is {which})")
    positive, negative = values == b"1", values == b"0"
    bad = np.flatnonzero(~(positive | negative))
    if bad.size:
        raise DataError(f"{path}: label #{bad[0] + 1} is {values[bad[0]].decode(errors='replace')!r}, expected 0 or 1")
    return positive.astype(np.uint8)


def _load_split(root: Path, split: str, entries: list[str], concepts: list[str], image_root: Path,
                on_disk: set[str], keep_unlabelled: bool, notes: list[str]) -> LabelledImages:
    """The on-disk images of one official split with their labels (unlabelled dropped unless kept)."""
    suffix = split.capitalize()
    labels = np.stack([_label_column(root / LABELS_DIR / f"Labels_{concept}_{suffix}.txt", root, split, len(entries))
                       for concept in concepts], axis=1)
    present = np.fromiter((entry in on_disk for entry in entries), dtype=bool, count=len(entries))
    unlabelled = int((present & ~labels.any(axis=1)).sum())
    keep = present if keep_unlabelled else present & labels.any(axis=1)
    if unlabelled:
        action = "kept as all-negative rows" if keep_unlabelled else \
            "dropped (keep them as all-negative rows with nus:DIR?keep-unlabelled)"
        emit_note(notes, f"nus: {unlabelled:,} of {int(present.sum()):,} {split} images have no positive label; "
                         f"{action}")
    rows = np.flatnonzero(keep)
    return LabelledImages([image_root / entries[i] for i in rows], labels[rows], list(concepts))


def load_nus(root: Path, image_root: Path | None = None, keep_unlabelled: bool = False) -> DatasetSplits:
    """Load NUS-WIDE from ``root`` (images under ``image_root``, default ``root/Flickr``)."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{root}: NUS-WIDE folder not found ({_EXPECTED})")
    concepts = _concepts(root)
    entries = {split: _image_list(root, split) for split in IMAGE_LISTS}  # errors before the (long) scan
    images_dir = Path(image_root).expanduser().resolve() if image_root is not None else root / "Flickr"
    if not images_dir.is_dir():
        raise DataError(f"{images_dir}: image folder not found (NUS-WIDE images go under {root / 'Flickr'} or "
                        "the folder given with nus:DIR?images=PATH)")
    notes: list[str] = []
    if len(concepts) != OFFICIAL_CONCEPTS:
        emit_note(notes, f"nus: {len(concepts)} concepts (the official list has {OFFICIAL_CONCEPTS})")
    on_disk = scan_files(images_dir, desc="nus images")
    listed = sum(len(names) for names in entries.values())
    found = sum(name in on_disk for names in entries.values() for name in names)
    emit_note(notes, f"nus: using {found:,} of {listed:,} images; {listed - found:,} missing")
    train, test = (_load_split(root, split, entries[split], concepts, images_dir, on_disk, keep_unlabelled, notes)
                   for split in IMAGE_LISTS)
    if len(train) == 0:
        raise DataError(f"{images_dir}: none of the {len(entries['train']):,} images of {IMAGE_LISTS['train']} "
                        "is usable (missing on disk or without a positive label); give the image folder with "
                        "nus:DIR?images=PATH")
    options = [f"images={images_dir}"] if image_root is not None else []
    options += ["keep-unlabelled"] if keep_unlabelled else []
    return DatasetSplits(name="nus", source=f"nus:{root}" + (f"?{'&'.join(options)}" if options else ""),
                         classes=list(concepts), train=train, test=test if len(test) else None, notes=notes,
                         complete_splits=ALL_SPLITS)


def load_nus_spec(argument: str) -> DatasetSplits:
    """``nus:DIR[?images=PATH][&keep-unlabelled]``: parse the spec options and load NUS-WIDE."""
    path, options = split_spec_options(argument, NUS_OPTIONS, "nus")
    flag = options.get("keep-unlabelled", "0").lower()
    if flag not in _TRUE + _FALSE:
        raise DataError(f"nus:{argument}: keep-unlabelled takes no value (or true/false), found {flag!r}")
    if not path:
        raise DataError(f"nus:{argument}: no folder given (use nus:DIR[?images=PATH][&keep-unlabelled])")
    images = options.get("images")
    if images is not None and not images:
        raise DataError(f"nus:{argument}: images= needs a folder")
    return load_nus(Path(path), Path(images) if images else None, keep_unlabelled=flag in _TRUE)
