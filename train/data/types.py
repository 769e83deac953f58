"""Plain containers shared by every dataset loader, plus the error they raise on bad input."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """Bad dataset input. The message always names the offending file (and line, where there is one)."""


@dataclass
class LabelledImages:
    """Images with their annotated label matrix.

    ``paths[i]`` is an absolute image path and ``labels[i]`` its 0/1 row over ``classes`` (uint8, shape
    ``(N, C)``). For single-positive sources the matrix simply has one 1 per row.
    """

    paths: list[Path]
    labels: np.ndarray
    classes: list[str]

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.uint8)
        if self.labels.ndim != 2 or self.labels.shape != (len(self.paths), len(self.classes)):
            raise ValueError(
                f"labels must have shape ({len(self.paths)}, {len(self.classes)}), got {self.labels.shape}"
            )

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, indices: np.ndarray | list[int]) -> LabelledImages:
        """Return the rows ``indices`` (in that order) as a new ``LabelledImages``."""
        idx = np.asarray(indices, dtype=np.int64)
        return LabelledImages([self.paths[i] for i in idx], self.labels[idx], list(self.classes))


@dataclass
class DatasetSplits:
    """What a loader returns: the official train pool, an optional explicit val split, an optional test split.

    ``name`` is a short human label ("builtin-tiny", "voc2012", ...); ``source`` is the spec that was loaded
    (it is recorded in checkpoints so export can find the validation images again). ``train_observed``: the
    observed labels the dataset ships (the seeds' ``formatted_train_labels_obs.npy``), used instead of sampling.
    """

    name: str
    source: str
    classes: list[str]
    train: LabelledImages
    test: LabelledImages | None = None
    val: LabelledImages | None = None
    notes: list[str] = field(default_factory=list)
    # observed training labels shipped with the dataset ((N_train, C) 0/1, rows as ``train``), and their file name
    train_observed: np.ndarray | None = None
    observed_source: str = ""
