"""The audit list (``--audit SPEC``): images the user labelled completely, which give k and the export's F1 figures. Any
dataset ``--data`` reads, or a review file or answer log (an image counts when every class is answered)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.registry import load_dataset
from models.data.review_file import final_answers, read_review
from models.data.types import DataError

__all__ = ["AuditList", "load_audit"]


@dataclass
class AuditList:
    """Audited images: ``paths``, their full labels (N, C) in the model's class order, and the spec read."""

    paths: list[Path]
    labels: np.ndarray
    source: str
    partial: int = 0  # images of a review file answered for only some classes (left out)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def mean_positives(self) -> float:
        """The mean number of positives per audited image."""
        return float(self.labels.sum(1).mean())


def is_review_file(path: Path) -> bool:
    """A review file or answer log: a ``.jsonl`` file, or a ``.csv`` whose header names ``label`` and ``answer``."""
    if not path.is_file() or path.suffix.lower() not in (".jsonl", ".csv"):
        return False
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        header = {cell.strip().lower() for cell in fh.readline().split(",")}
    return {"label", "answer"} <= header


def _audit_from_answers(path: Path, classes: list[str]) -> AuditList:
    """The images of a review file whose every class is answered, with those answers as their labels."""
    answers = final_answers(read_review(path))
    by_image: dict[str, dict[str, bool]] = {}
    for (image, label), present in answers.items():
        by_image.setdefault(image, {})[label] = present
    unknown = sorted({label for answered in by_image.values() for label in answered} - set(classes))
    if unknown:
        raise DataError(f"audit list {path}: classes the model does not know: {', '.join(unknown[:5])}")
    done = [image for image, answered in by_image.items() if len(answered) == len(classes)]
    if not done:
        raise DataError(f"audit list {path}: no image has an answer for every one of the model's {len(classes)} "
                        f"classes ({len(by_image)} answered in part)")
    labels = np.array([[by_image[image][name] for name in classes] for image in done], dtype=np.uint8)
    return AuditList([Path(image) for image in done], labels, str(path), len(by_image) - len(done))


def load_audit(spec: str, classes: list[str]) -> AuditList:
    """The audit list ``spec`` with its labels over the model's ``classes``; :class:`DataError` if unknown or empty."""
    if is_review_file(Path(spec).expanduser()):
        return _audit_from_answers(Path(spec).expanduser(), classes)
    splits = load_dataset(spec)
    parts = [part for part in (splits.train, splits.val, splits.test) if part is not None and len(part)]
    unknown = [name for name in splits.classes if name not in classes]
    used = {name for part in parts for j, name in enumerate(splits.classes) if part.labels[:, j].any()}
    if unknown and used & set(unknown):
        shown = ", ".join(sorted(used & set(unknown))[:5])
        raise DataError(f"audit list {spec}: classes the model does not know: {shown} (the model's classes: "
                        f"{', '.join(classes[:8])}{', ...' if len(classes) > 8 else ''})")
    index = {name: i for i, name in enumerate(classes)}
    labels = np.zeros((sum(len(part) for part in parts), len(classes)), dtype=np.uint8)
    row = 0
    for part in parts:
        for j, name in enumerate(splits.classes):
            if name in index:
                labels[row: row + len(part), index[name]] = part.labels[:, j]
        row += len(part)
    if not len(labels):
        raise DataError(f"audit list {spec}: no images")
    return AuditList([p for part in parts for p in part.paths], labels, spec)
