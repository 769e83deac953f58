"""The generic CSV dataset format, ``labels.csv`` (+ optional ``classes.txt``), read and written strictly by the rules
of docs/datasets.md ("csv"); every problem raises ``DataError`` with ``file:line: message``."""

from __future__ import annotations

import csv
import difflib
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from models.data.types import DataError, DatasetSplits, LabelledImages

__all__ = ["CLASSES_FILENAME", "CSV_FILENAME", "emit_note", "load_csv", "read_classes_file", "write_csv"]

CSV_FILENAME = "labels.csv"
CLASSES_FILENAME = "classes.txt"
SPLITS = ("train", "val", "test")
LABEL_SEPARATOR = ";"
NEGATIVE_MARK = "-"  # before a class name in the labels field: the label is known to be absent
_HEADER_HINT = "expected a header line such as 'image,labels,split'"


def emit_note(notes: list[str], message: str) -> None:
    """Print ``message`` as one line on stderr and append it to ``notes`` (in place)."""
    print(message, file=sys.stderr, flush=True)
    notes.append(message)


def known_list(names: list[str] | tuple[str, ...], limit: int = 12) -> str:
    """Format class names for an error message: ``"a, b, c"``, shortened with ``...`` past ``limit``."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def unknown_class_message(name: str, known: list[str] | tuple[str, ...]) -> str:
    """Return ``unknown class 'x' (known: ...)`` with a did-you-mean hint when a close name exists."""
    message = f"unknown class {name!r} (known: {known_list(known)})"
    close = difflib.get_close_matches(name, list(known), n=1)
    return message + (f"; did you mean {close[0]!r}?" if close else "")


def _decode(path: Path) -> str:
    """Read ``path`` as UTF-8 (BOM allowed); undecodable bytes -> ``DataError`` with the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read file: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: undecodable bytes (the file must be UTF-8 text): {exc.reason}") from exc


def read_classes_file(path: Path) -> list[str]:
    """A class list, one name per line; duplicates, names with ``;`` or an empty file raise ``DataError``."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise DataError(f"{path}: class file not found")
    names: list[str] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(_decode(path).splitlines(), start=1):
        name = raw.strip()
        if not name:
            continue
        if LABEL_SEPARATOR in name:
            raise DataError(f"{path}:{lineno}: class name {name!r} contains the label separator ';'")
        if name.startswith(NEGATIVE_MARK):
            raise DataError(f"{path}:{lineno}: class name {name!r} begins with '-', which marks a known negative "
                            "in labels.csv")
        if name in first_line:
            raise DataError(f"{path}:{lineno}: duplicate class {name!r} (first on line {first_line[name]})")
        first_line[name] = lineno
        names.append(name)
    if not names:
        raise DataError(f"{path}: class file lists no classes")
    return names


@dataclass
class _Entry:
    """One image while reading: its split, first line, and its present and absent label names."""

    split: str
    line: int
    labels: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)


def _parse_labels(field_text: str, where: str) -> tuple[list[str], list[str]]:
    """Split a ``labels`` field into present names and known negatives (``-name``); ``DataError`` if empty."""
    if not field_text.strip():
        raise DataError(f"{where}: empty labels field (give at least one class name)")
    names = [part.strip() for part in field_text.split(LABEL_SEPARATOR)]
    for position, name in enumerate(names, start=1):
        if not name or name == NEGATIVE_MARK:
            raise DataError(
                f"{where}: empty class name between ';' separators (name #{position} in {field_text!r})"
            )
    present = [name for name in names if not name.startswith(NEGATIVE_MARK)]
    absent = [name[1:].strip() for name in names if name.startswith(NEGATIVE_MARK)]
    both = sorted(set(present) & set(absent))
    if both:
        raise DataError(f"{where}: {both[0]!r} is given as present and as absent ('-{both[0]}')")
    return present, absent


def _read_rows(csv_path: Path) -> tuple[dict[str, int], int, list[tuple[int, list[str]]]]:
    """Parse the CSV: return (column index by name, header line, [(line, fields)]) for non-blank rows."""
    text = _decode(csv_path)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    header_line = 0
    rows: list[tuple[int, list[str]]] = []
    previous_end = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataError(f"{csv_path}:{reader.line_num}: malformed CSV: {exc}") from exc
        start = previous_end + 1
        previous_end = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        if header is None:
            header, header_line = row, start
        else:
            rows.append((start, row))
    if header is None:
        raise DataError(f"{csv_path}: empty file ({_HEADER_HINT})")

    columns: dict[str, int] = {}
    for index, raw in enumerate(header):
        name = raw.strip().lower()
        if name in ("image", "labels", "split") and name in columns:
            raise DataError(f"{csv_path}:{header_line}: duplicate column {name!r} in the header")
        columns.setdefault(name, index)
    for required in ("image", "labels"):
        if required not in columns:
            raise DataError(
                f"{csv_path}:{header_line}: missing required column {required!r} in the header "
                f"(found: {', '.join(repr(h) for h in header)}; {_HEADER_HINT})")
    for line, row in rows:
        if len(row) != len(header):
            raise DataError(
                f"{csv_path}:{line}: expected {len(header)} fields (as in the header), found {len(row)}")
    return columns, header_line, rows


def load_csv(csv_path: Path, classes_file: Path | None = None, images_root: Path | None = None) -> DatasetSplits:
    """Load a dataset in the CSV format from ``csv_path``, named after its folder."""
    csv_path = Path(csv_path).expanduser().resolve()
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: CSV file not found")
    root = csv_path.parent if images_root is None else Path(images_root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"{root}: images root is not a folder (given for {csv_path})")
    notes: list[str] = []

    class_path: Path | None
    if classes_file is not None:
        class_path = Path(classes_file).expanduser().resolve()
    else:
        default = csv_path.parent / CLASSES_FILENAME
        class_path = default if default.is_file() else None
    fixed_classes = read_classes_file(class_path) if class_path is not None else None
    fixed_index = {name: i for i, name in enumerate(fixed_classes or [])}

    columns, _, rows = _read_rows(csv_path)
    if not rows:
        raise DataError(f"{csv_path}: no data rows after the header")
    col_image, col_labels, col_split = columns["image"], columns["labels"], columns.get("split")

    entries: dict[Path, _Entry] = {}
    merged_rows = 0
    merged_images: set[Path] = set()
    for line, row in rows:
        where = f"{csv_path}:{line}"
        image_text = row[col_image].strip()
        if not image_text:
            raise DataError(f"{where}: empty image field")
        split = row[col_split].strip().lower() if col_split is not None else ""
        split = split or "train"
        if split not in SPLITS:
            raise DataError(f"{where}: unknown split {row[col_split].strip()!r} (use train, val or test)")
        names, absent = _parse_labels(row[col_labels], where)
        if fixed_classes is not None:
            for name in [*names, *absent]:
                if name not in fixed_index:
                    raise DataError(f"{where}: {unknown_class_message(name, fixed_classes)}")

        image = Path(image_text).expanduser()
        image = (image if image.is_absolute() else root / image).resolve()
        entry = entries.get(image)
        if entry is None:
            if not image.is_file():
                raise DataError(f"{where}: image not found: {image}")
            entry = entries[image] = _Entry(split=split, line=line)
        else:
            if entry.split != split:
                raise DataError(
                    f"{where}: image {image_text!r} has split {split!r} but line {entry.line} "
                    f"gave it split {entry.split!r}")
            merged_rows += 1
            merged_images.add(image)
        entry.labels.extend(names)
        entry.negatives.extend(absent)
        clash = sorted(set(entry.labels) & set(entry.negatives))
        if clash:
            raise DataError(f"{where}: {clash[0]!r} is given as present and as absent ('-{clash[0]}') for image "
                            f"{image_text!r}")

    if fixed_classes is not None:
        classes = fixed_classes
        index = fixed_index
    else:
        classes = sorted({name for entry in entries.values() for name in [*entry.labels, *entry.negatives]})
        index = {name: i for i, name in enumerate(classes)}
        emit_note(
            notes,
            f"csv: no class file ({CLASSES_FILENAME} next to {csv_path.name}); using the {len(classes)} "
            "class names seen in the labels, sorted alphabetically")
    if merged_rows:
        emit_note(
            notes,
            f"csv: merged {merged_rows} duplicate rows into {len(merged_images)} images "
            "(same image on several rows: union of their labels)")

    by_split: dict[str, list[tuple[Path, _Entry]]] = {split: [] for split in SPLITS}
    for image, entry in entries.items():
        by_split[entry.split].append((image, entry))

    def build(items: list[tuple[Path, _Entry]]) -> LabelledImages:
        labels = np.zeros((len(items), len(classes)), dtype=np.uint8)
        negatives = np.zeros_like(labels)
        for row_index, (_, entry) in enumerate(items):
            labels[row_index, [index[name] for name in entry.labels]] = 1
            negatives[row_index, [index[name] for name in entry.negatives]] = 1
        return LabelledImages([image for image, _ in items], labels, list(classes),
                              negatives if negatives.any() else None)

    if not by_split["train"]:
        raise DataError(f"{csv_path}: no training images (every row has split 'val' or 'test')")
    trained = {name for _, entry in by_split["train"] for name in entry.labels}
    untrained = [name for name in classes if name not in trained]
    if untrained:
        shown = ", ".join(untrained[:10]) + (f" and {len(untrained) - 10} more" if len(untrained) > 10 else "")
        emit_note(notes, f"csv: warning: {len(untrained)} class(es) have no training image ({shown}): no method can "
                  "learn them, their scores carry no information, and they count in val/test mAP wherever they "
                  "have a positive; give them training images or drop them from the labels")
    return DatasetSplits(name=csv_path.parent.name, source=f"csv:{csv_path}", classes=list(classes),
                         train=build(by_split["train"]), test=build(by_split["test"]) if by_split["test"] else None,
                         val=build(by_split["val"]) if by_split["val"] else None, notes=notes)


def write_csv(folder: Path, splits: dict[str, LabelledImages]) -> Path:
    """Write ``classes.txt`` and ``labels.csv`` for ``splits`` into ``folder``; returns the CSV path."""
    folder = Path(folder).expanduser().resolve()
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise DataError(f"{folder}: unknown split names {unknown} (use train, val, test)")
    if not splits:
        raise DataError(f"{folder}: nothing to write (no splits given)")
    classes = next(iter(splits.values())).classes
    for split, images in splits.items():
        if list(images.classes) != list(classes):
            raise DataError(f"{folder}: split {split!r} has a different class list from the others")
    for name in classes:
        if name != name.strip() or not name or LABEL_SEPARATOR in name or "\n" in name or name[0] == NEGATIVE_MARK:
            raise DataError(f"{folder}: class name {name!r} cannot be written (empty, padded, ';' or a leading -)")
    if len(set(classes)) != len(classes):
        raise DataError(f"{folder}: duplicate class names in {list(classes)}")

    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["image", "labels", "split"])
    for split in SPLITS:
        images = splits.get(split)
        if images is None:
            continue
        absent = images.negatives if images.negatives is not None else np.zeros_like(images.labels)
        for path, row, no in zip(images.paths, images.labels, absent, strict=True):
            names = [classes[i] for i in np.flatnonzero(row)] + [NEGATIVE_MARK + classes[i] for i in np.flatnonzero(no)]
            if not any(row):
                raise DataError(f"{folder}: {split} image {path} has no positive label; cannot write it")
            absolute = Path(path).expanduser().resolve()
            try:
                shown = absolute.relative_to(folder).as_posix()
            except ValueError:
                shown = str(absolute)
            writer.writerow([shown, LABEL_SEPARATOR.join(names), split])
    (folder / CLASSES_FILENAME).write_text("".join(f"{name}\n" for name in classes), encoding="utf-8")
    csv_path = folder / CSV_FILENAME
    csv_path.write_text(buffer.getvalue(), encoding="utf-8")
    return csv_path
