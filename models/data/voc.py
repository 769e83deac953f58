"""PASCAL VOC (2007 / 2012) as a multi-label dataset (docs/datasets.md, "voc"), row for row the seeds'
``format_pascal.py`` output."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from models.data.csv_format import emit_note, unknown_class_message
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

__all__ = ["VOC_CLASSES", "find_voc_dir", "find_voc_dirs", "load_voc"]

VOC_CLASSES: tuple[str, ...] = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
)  # fmt: skip
_REQUIRED = ("Annotations", "JPEGImages", "ImageSets/Main")
_YEAR_DIR = re.compile(r"^VOC(\d{4})$")


def _is_voc_year_dir(path: Path) -> bool:
    """True when ``path`` holds ``Annotations/``, ``JPEGImages/`` and ``ImageSets/Main/``."""
    return all((path / sub).is_dir() for sub in _REQUIRED)


def find_voc_dirs(root: Path) -> list[Path]:
    """Return the VOC year folders at ``root``: itself, its ``VOC20xx`` children, or those in VOCdevkit/."""
    root = Path(root).expanduser().resolve()
    if _is_voc_year_dir(root):
        return [root]
    for base in (root, root / "VOCdevkit"):
        if base.is_dir():
            found = sorted(p for p in base.iterdir() if _YEAR_DIR.match(p.name) and _is_voc_year_dir(p))
            if found:
                return found
    return []


def find_voc_dir(root: Path) -> Path | None:
    """The VOC year folder found at or under ``root``, or None (also when several years make it ambiguous)."""
    found = find_voc_dirs(Path(root).expanduser().resolve())
    return found[0] if len(found) == 1 else None


def _read_id_list(path: Path) -> list[tuple[str, int]]:
    """Read an ImageSets list file: one image id per line (blank lines ignored); return (id, line) pairs."""
    if not path.is_file():
        raise DataError(f"{path}: image list not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read image list: {exc}") from exc
    ids: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if not parts:
            continue
        if len(parts) != 1:
            raise DataError(f"{path}:{lineno}: expected one image id per line, found {raw.strip()!r}")
        image_id = parts[0]
        if image_id in seen:
            raise DataError(
                f"{path}:{lineno}: duplicate image id {image_id!r} (first on line {seen[image_id]})")
        seen[image_id] = lineno
        ids.append((image_id, lineno))
    if not ids:
        raise DataError(f"{path}: image list is empty")
    return ids


def _parse_annotation(xml_path: Path) -> np.ndarray:
    """Parse one VOC XML file; return its uint8 label row (non-difficult objects only) over VOC_CLASSES."""
    try:
        tree = ET.parse(xml_path)
    except ET.ParseError as exc:
        line = exc.position[0]
        raise DataError(f"{xml_path}:{line}: malformed XML: {exc}") from exc
    except OSError as exc:
        raise DataError(f"{xml_path}: cannot read annotation: {exc.strerror or exc}") from exc
    index = {name: i for i, name in enumerate(VOC_CLASSES)}
    row = np.zeros(len(VOC_CLASSES), dtype=np.uint8)
    for number, obj in enumerate(tree.getroot().findall("object"), start=1):
        name_el = obj.find("name")
        name = (name_el.text or "").strip() if name_el is not None else ""
        if not name:
            raise DataError(f"{xml_path}: object #{number} has no <name>")
        if name not in index:
            raise DataError(f"{xml_path}: object #{number}: {unknown_class_message(name, VOC_CLASSES)}")
        difficult_el = obj.find("difficult")
        difficult_text = (difficult_el.text or "").strip() if difficult_el is not None else ""
        if difficult_text not in ("", "0", "1"):
            raise DataError(
                f"{xml_path}: object #{number} ({name}): <difficult> must be 0 or 1, got {difficult_text!r}"
            )
        if difficult_text != "1":
            row[index[name]] = 1
    return row


def _load_list(year_dir: Path, list_name: str, notes: list[str]) -> LabelledImages:
    """The labelled images of ``ImageSets/Main/<list_name>``, sorted by file name as the seeds sort them."""
    list_path = year_dir / "ImageSets" / "Main" / list_name
    paths: list[Path] = []
    rows: list[np.ndarray] = []
    ids = _read_id_list(list_path)
    for image_id, lineno in sorted(ids, key=lambda entry: f"{entry[0]}.jpg"):
        xml_path = year_dir / "Annotations" / f"{image_id}.xml"
        if not xml_path.is_file():
            raise DataError(f"{list_path}:{lineno}: image {image_id!r}: annotation not found: {xml_path}")
        image_path = year_dir / "JPEGImages" / f"{image_id}.jpg"
        if not image_path.is_file():
            raise DataError(f"{list_path}:{lineno}: image {image_id!r}: JPEG not found: {image_path}")
        row = _parse_annotation(xml_path)
        if row.any():
            paths.append(image_path)
            rows.append(row)
    skipped = len(ids) - len(paths)
    if skipped:
        emit_note(
            notes,
            f"voc: skipped {skipped} of {len(ids)} images in {list_name} with no non-difficult object")
    if not paths:
        raise DataError(f"{list_path}: no image has a non-difficult object")
    return LabelledImages(paths, np.stack(rows), list(VOC_CLASSES))


def load_voc(root: Path | str) -> DatasetSplits:
    """Load PASCAL VOC from ``VOCdevkit/`` or ``VOCdevkit/VOC20xx`` as train/test splits."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{root}: VOC root folder not found")
    found = find_voc_dirs(root)
    if not found:
        raise DataError(
            f"{root}: not a PASCAL VOC folder (expected Annotations/, JPEGImages/ and ImageSets/Main/ "
            "here or in a VOC20xx subfolder such as VOCdevkit/VOC2012)")
    if len(found) > 1:
        raise DataError(
            f"{root}: several VOC years found ({', '.join(p.name for p in found)}); point at one of them")
    year_dir = found[0]
    match = _YEAR_DIR.match(year_dir.name)
    name = f"voc{match.group(1)}" if match else "voc"
    notes: list[str] = []

    main = year_dir / "ImageSets" / "Main"
    test_list = main / "test.txt"
    use_test = False
    if test_list.is_file():
        test_ids = _read_id_list(test_list)
        missing = sum(not (year_dir / "Annotations" / f"{i}.xml").is_file() for i, _ in test_ids)
        if missing == 0:
            use_test = True
        else:
            emit_note(
                notes,
                f"voc: {test_list} lacks annotations for {missing} of {len(test_ids)} images; "
                "using train.txt as train and val.txt as test")
    if use_test:
        train = _load_list(year_dir, "trainval.txt", notes)
        test = _load_list(year_dir, "test.txt", notes)
    else:
        train = _load_list(year_dir, "train.txt", notes)
        test = _load_list(year_dir, "val.txt", notes)
    return DatasetSplits(name=name, source=f"voc:{root}", classes=list(VOC_CLASSES), train=train, test=test,
                         notes=notes, complete_splits=ALL_SPLITS)
