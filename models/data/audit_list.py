"""The audit list: a few images the user labelled completely (``--audit SPEC`` of ``python -m train`` and
``python -m export``).

With single-positive validation labels nothing measures F1 or says how many positives an image has. A small
list of fully labelled images answers both: its mean number of positives per image is k, the expected number of
tags per image of the positive-only calibration (20 images put it within 25% of the truth 99% of the time on the
built-in data; training uses it as EPR/ROLE's k, :mod:`models.evaluation.expected_positives`), and the export reports
its F1 figures on it ("against the audit list").

The list is any dataset the ``--data`` option of ``python -m train`` reads (a ``labels.csv`` with one row per
image and all its labels, a folder of class folders where an image sits in each of its classes' folders, ...);
every split of it is used. Its class names must be among the model's; classes it never names are taken as absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.registry import load_dataset
from models.data.types import DataError

__all__ = ["AuditList", "load_audit"]


@dataclass
class AuditList:
    """Audited images: ``paths``, their full labels (N, C) in the model's class order, and the spec read."""

    paths: list[Path]
    labels: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def mean_positives(self) -> float:
        """The mean number of positives per audited image."""
        return float(self.labels.sum(1).mean())


def load_audit(spec: str, classes: list[str]) -> AuditList:
    """Read the audit list named by ``spec`` (any dataset spec) with its labels over the model's ``classes``.
    A class the model does not know, or an empty list, raises :class:`DataError`."""
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
