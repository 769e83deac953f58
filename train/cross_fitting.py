"""Out-of-fold scores for every labelled image: heads on fixed features in K folds over the training and validation
images, each image scored by a head that neither saw it nor picked its epoch on it (each scored fold's head trains on
K-2 folds and picks its epoch on the next one). Used by the method chooser and k's estimate."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from models.data.types import LabelledImages
from train.prepared_run import RunData
from train.selection import Rows

__all__ = ["FOLDS", "FOLD_SEED", "Pool", "fold_data", "fold_of", "labelled_pool", "training_pool"]

#: Folds of the pooled training and validation images.
FOLDS = 5
#: Seed of the fold assignment (fixed: every candidate of a choice sees the same folds).
FOLD_SEED = 20261126


@dataclass
class Pool:
    """The training and validation images as one set: paths, observed labels (1, -1, 0), features, folds."""

    images: LabelledImages  # .labels: the observed positives (0/1)
    observed: np.ndarray  # (N, C) int8
    features: Rows
    folds: np.ndarray  # (N,) int: the fold of each row

    def __len__(self) -> int:
        return len(self.images)


def fold_of(count: int, folds: int = FOLDS, seed: int = FOLD_SEED) -> np.ndarray:
    """The fold of each of ``count`` rows: a seeded permutation dealt round-robin."""
    if folds < 3 or count < folds:
        raise ValueError(f"cross-fitting needs at least 3 folds and as many images; got {folds} folds, {count} images")
    order = np.random.default_rng(seed).permutation(count)
    out = np.empty(count, dtype=np.int64)
    out[order] = np.arange(count) % folds
    return out


def labelled_pool(data: RunData, features: dict[str, Rows], folds: int = FOLDS) -> Pool:
    """The training and validation images of ``data`` with their observed labels and features, in folds."""
    if data.splits.has_full_labels("val"):
        raise ValueError("the validation labels are full: score models on them directly instead of cross-fitting")
    pool = training_pool(data, features, folds, held_out_val=True)
    pool.folds = fold_of(len(pool), folds)
    return pool


def training_pool(data: RunData, features: dict[str, Rows], folds: int = FOLDS, held_out_val: bool = False) -> Pool:
    """The training images of ``data`` with their observed labels and features, in folds; ``held_out_val``: the
    validation images after them, held out (fold ``-1 - f``: fold f's head scores them, no head trains on them)."""
    splits, parts = data.splits, ("train", "val") if held_out_val else ("train",)
    observed = splits.train_observed.astype(np.int8)
    if held_out_val:
        val = splits.val_observed if splits.val_observed is not None else splits.val.labels
        observed = np.concatenate([observed, val.astype(np.int8)])
    images = LabelledImages([p for part in parts for p in getattr(splits, part).paths],
                            (observed > 0).astype(np.uint8), list(splits.classes))
    rows = Rows(torch.cat([features[part].values for part in parts]),
                torch.cat([features[part].present for part in parts]))
    held_out = -1 - np.arange(len(observed) - len(splits.train), dtype=np.int64) % folds
    return Pool(images, observed, rows, np.concatenate([fold_of(len(splits.train), folds), held_out]))


def fold_data(data: RunData, pool: Pool, fold: int) -> tuple[RunData, dict[str, Rows]]:
    """The data that scores one fold and its held-out rows (fold ``-1 - fold``): train on the other folds but the
    next, validate on the next."""
    pick = (fold + 1) % (int(pool.folds.max()) + 1)  # the fold whose images pick the epoch: the next one
    train_rows = np.flatnonzero((pool.folds != fold) & (pool.folds != pick) & (pool.folds >= 0))
    val_rows = np.flatnonzero(pool.folds == pick)
    scored_rows = np.flatnonzero((pool.folds == fold) | (pool.folds == -1 - fold))
    splits = dataclasses.replace(
        data.splits, train=pool.images.subset(train_rows), train_observed=pool.observed[train_rows],
        val=pool.images.subset(val_rows), val_observed=pool.observed[val_rows], test=None,
        complete_splits=(), declared_labels="auto")
    features = {split: Rows(pool.features.values[rows], pool.features.present[rows])
                for split, rows in (("train", train_rows), ("val", val_rows), ("scored", scored_rows))}
    return RunData(data.dataset, splits, data.protocol_bytes), features
