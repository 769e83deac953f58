"""Plain containers shared by every dataset loader, plus the error they raise on bad input."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: ``complete_splits`` of a benchmark whose annotation is the ground truth of every split
ALL_SPLITS = ("train", "val", "test")


class DataError(ValueError):
    """Bad dataset input. The message always names the offending file (and line, where there is one)."""


@dataclass
class LabelledImages:
    """Images with their labels: absolute ``paths``, uint8 ``labels`` ``(N, C)`` and known-absent ``negatives``."""

    paths: list[Path]
    labels: np.ndarray
    classes: list[str]
    negatives: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.uint8)
        if self.labels.ndim != 2 or self.labels.shape != (len(self.paths), len(self.classes)):
            raise ValueError(
                f"labels must have shape ({len(self.paths)}, {len(self.classes)}), got {self.labels.shape}")
        if self.negatives is not None:
            self.negatives = np.asarray(self.negatives, dtype=np.uint8)
            if self.negatives.shape != self.labels.shape:
                raise ValueError(f"negatives must have the labels' shape {self.labels.shape}, got "
                                 f"{self.negatives.shape}")
            if bool((self.negatives & self.labels).any()):
                raise ValueError("a label cannot be both present and known to be absent")

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, indices: np.ndarray | list[int]) -> LabelledImages:
        """Return the rows ``indices`` (in that order) as a new ``LabelledImages``."""
        idx = np.asarray(indices, dtype=np.int64)
        negatives = self.negatives[idx] if self.negatives is not None else None
        return LabelledImages([self.paths[i] for i in idx], self.labels[idx], list(self.classes), negatives)


AnnotatedObject = tuple[int, float, float, float]  # class column, area (px), box centre x, y (px)


@dataclass
class ObjectTable:
    """The annotated objects of a list of images, for the label-bias protocols: each object's class column, area and box
    centre, each image's size, in pixels; row ``i``'s objects are ``starts[i]:starts[i + 1]``."""

    starts: np.ndarray  # (N + 1,) int64
    classes: np.ndarray  # (M,) int64
    areas: np.ndarray  # (M,) float64
    centres: np.ndarray  # (M, 2) float64
    sizes: np.ndarray  # (N, 2) float64: width, height

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[AnnotatedObject]], sizes: Sequence[tuple[float, float]]) -> ObjectTable:
        """Build the table from each image's ``(class, area, centre x, centre y)`` objects and its size."""
        flat = [obj for row in rows for obj in row]
        return cls(
            starts=np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int64),
            classes=np.array([o[0] for o in flat], dtype=np.int64),
            areas=np.array([o[1] for o in flat], dtype=np.float64),
            centres=np.array([(o[2], o[3]) for o in flat], dtype=np.float64).reshape(-1, 2),
            sizes=np.asarray(sizes, dtype=np.float64).reshape(-1, 2))

    def __len__(self) -> int:
        return len(self.sizes)

    def row(self, i: int) -> list[AnnotatedObject]:
        """Image ``i``'s objects as Python numbers (exact float64 values)."""
        part = slice(int(self.starts[i]), int(self.starts[i + 1]))
        return list(zip(self.classes[part].tolist(), self.areas[part].tolist(), self.centres[part, 0].tolist(),
                        self.centres[part, 1].tolist(), strict=True))


@dataclass
class DatasetSplits:
    """What a loader returns: the splits, a ``name``, the ``source`` spec, and what the loader declares (shipped
    observed labels, objects, complete splits, family)."""

    name: str
    source: str
    classes: list[str]
    train: LabelledImages
    test: LabelledImages | None = None
    val: LabelledImages | None = None
    notes: list[str] = field(default_factory=list)
    # observed training labels shipped with the dataset ((N_train, C) int8: 1 observed positive, -1 observed
    # negative, 0 unobserved; rows as ``train``), and their file name
    train_observed: np.ndarray | None = None
    observed_source: str = ""
    train_objects: Callable[[], ObjectTable] | None = None
    # The splits whose labels are the complete annotation (a benchmark's ground truth: every positive is there). A
    # user's own data (csv:, folder:) has none: its labels are taken as given, single-positive or partial
    # (models/data/label_regime.py), and its training labels are observed as they are (--observed auto).
    complete_splits: tuple[str, ...] = ()
    # The benchmark family the methods' presets are keyed by (models/data/families.py): declared by the kind's row of
    # the registry (every voc: dataset is "voc") or by the loader (formatted folders); "" for a user's own data.
    family: str = ""
