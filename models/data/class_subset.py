"""Restrict a CSV dataset to some of its classes: ``python -m models.data.class_subset SRC/labels.csv --keep a,b,c --out
DIR`` (docs/methods-investigation.md uses it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from models.data.csv_format import CSV_FILENAME, load_csv, unknown_class_message, write_csv
from models.data.types import DataError, DatasetSplits, LabelledImages

__all__ = ["keep_classes", "main", "subset_splits"]


def keep_classes(images: LabelledImages, keep: list[str]) -> LabelledImages:
    """``images`` with only the ``keep`` columns and the rows still positive; ``DataError`` for an unknown class."""
    for name in keep:
        if name not in images.classes:
            raise DataError(unknown_class_message(name, images.classes))
    wanted = set(keep)
    columns = [i for i, name in enumerate(images.classes) if name in wanted]
    labels = images.labels[:, columns]
    rows = np.flatnonzero(labels.any(axis=1))
    return LabelledImages([images.paths[i] for i in rows], labels[rows], [images.classes[i] for i in columns])


def subset_splits(data: DatasetSplits, keep: list[str], train_only: bool = False) -> dict[str, LabelledImages]:
    """The splits of ``data`` restricted to ``keep``; ``DataError`` when no training image is left."""
    chosen = {"train": data.train} if train_only else {"train": data.train, "val": data.val, "test": data.test}
    out = {name: keep_classes(images, keep) for name, images in chosen.items() if images is not None}
    if not len(out["train"]):
        raise DataError(f"no training image has one of the classes {', '.join(keep)}")
    return {name: images for name, images in out.items() if len(images)}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2 on bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m models.data.class_subset",
        description="Write a copy of a CSV dataset that keeps only some classes: labels of other classes are "
        "dropped, and so are images left without a label. Images are referenced, not copied.")
    parser.add_argument("csv", type=Path, help="the source labels.csv (e.g. a built-in dataset's folder/labels.csv)")
    parser.add_argument("--keep", required=True, help="comma-separated class names to keep")
    parser.add_argument("--out", type=Path, required=True, help="folder for the new labels.csv and classes.txt")
    parser.add_argument("--train-only", action="store_true", help="leave out the val and test splits (e.g. to "
                        "pretrain on a dataset whose test images a later run evaluates on)")
    args = parser.parse_args(argv)
    keep = list(dict.fromkeys(name.strip() for name in args.keep.split(",") if name.strip()))
    if not keep:
        parser.error("--keep names no class")
    if (args.out / CSV_FILENAME).resolve() == args.csv.resolve():
        parser.error(f"--out {args.out} would overwrite the source {args.csv}; choose another folder")
    try:
        data = load_csv(args.csv)
        splits = subset_splits(data, keep, args.train_only)
        path = write_csv(args.out, splits)
    except DataError as exc:
        parser.error(str(exc))
    counts = ", ".join(f"{name} {len(images)}" for name, images in splits.items())
    print(f"{path}: {len(keep)} of {len(data.classes)} classes; images kept: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
