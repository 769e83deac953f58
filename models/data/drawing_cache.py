"""The read side of a dataset built from drawings: a cache folder per digest with rasters and ``manifest.json``; the
builders in :mod:`models.sources` write them."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.data.spec_options import split_spec_options
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

#: The manifest of a cache folder, and the version of its format (a change rebuilds every cache).
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def read_manifest(folder: Path, digest: str) -> dict[str, Any] | None:
    """The folder's manifest when it is complete, of this format and digest, and its rasters exist; else None."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or manifest.get("digest") != digest:
        return None
    return manifest if all((folder / image["file"]).is_file() for image in manifest.get("images", [])) else None


def split_parts(folder: Path, images: Sequence[dict[str, Any]], classes: Sequence[str],
                splits: Sequence[str] = ALL_SPLITS) -> dict[str, LabelledImages]:
    """The full-label view: each split's manifest ``images`` (``file``, ``split``, ``labels``) below ``folder``."""
    return {split: labelled([(folder / i["file"], i["labels"]) for i in images if i["split"] == split], classes)
            for split in splits}


def folder_view_parts(folder: Path, images: Sequence[dict[str, Any]]) -> tuple[list[str], dict[str, LabelledImages],
                                                                               Counter[str]]:
    """The folder view of manifest ``images``: its classes, the parts per split, and the counts left out per split."""
    classes = sorted({i["folder_class"] for i in images if i["split"] == "train" and i["folder_class"] is not None})
    known = set(classes)
    rows: dict[str, list[tuple[Path, list[str]]]] = {"train": [], "val": [], "test": []}
    left_out: Counter[str] = Counter()
    for image in images:
        path = folder / image["file"]
        if image["split"] == "test":
            labels = [name for name in image["labels"] if name in known]
            if labels:
                rows["test"].append((path, labels))
            else:
                left_out["test"] += 1
        elif image["folder_class"] is None:
            left_out[image["split"]] += 1
        elif image["folder_class"] not in known:
            left_out["unseen"] += 1
        else:
            rows[image["split"]].append((path, [image["folder_class"]]))
    return classes, {split: labelled(part, classes) for split, part in rows.items()}, left_out


def labelled(rows: Sequence[tuple[Path, Sequence[str]]], classes: Sequence[str]) -> LabelledImages:
    """Images and their label names as :class:`LabelledImages` over ``classes``."""
    index = {name: i for i, name in enumerate(classes)}
    labels = np.zeros((len(rows), len(classes)), dtype=np.uint8)
    for row, (_, names) in enumerate(rows):
        labels[row, [index[name] for name in names]] = 1
    return LabelledImages([path for path, _ in rows], labels, list(classes))


#: The options of a drawing dataset's spec, and the view that keeps one folder label per train and val image.
SPEC_OPTIONS = ("view", "min-count")
FOLDER_VIEW = "folders"


def parse_spec(kind: str, argument: str, views: Sequence[str], min_count: int) -> tuple[str, str, int]:
    """``DIR[?view=V][&min-count=N]`` -> (DIR, view, min count), with the defaults."""
    path, options = split_spec_options(argument, SPEC_OPTIONS, kind)
    view = options.get("view", views[0]) or views[0]
    if view not in views:
        raise DataError(f"{kind}:{argument}: unknown view {view!r} (use view={FOLDER_VIEW}, or no view for the full "
                        "labels)")
    text = options.get("min-count", str(min_count))
    if not text.isdigit() or int(text) < 1:
        raise DataError(f"{kind}:{argument}: min-count must be a positive integer, got {text!r}")
    return path.strip(), view, int(text)


def dataset_name(kind: str, argument: str) -> str:
    """The dataset name of a drawing spec without loading: ``kind``, or ``kind-folders`` for the folder view."""
    try:
        _, options = split_spec_options(argument, SPEC_OPTIONS, kind)
    except DataError:
        return kind
    return f"{kind}-{FOLDER_VIEW}" if options.get("view") == FOLDER_VIEW else kind


def view_splits(kind: str, source: str, view: str, full_view: str, min_count: int, default_min_count: int,
                classes: list[str], parts: dict[str, LabelledImages]) -> DatasetSplits:
    """The :class:`DatasetSplits` of one view of a drawing dataset."""
    if not len(parts["train"]):
        raise DataError(f"{kind}: {source}: the {view} view has no training image")
    options = [f"view={view}"] if view != full_view else []
    if int(min_count) != default_min_count:
        options.append(f"min-count={int(min_count)}")
    folders = view == FOLDER_VIEW
    return DatasetSplits(
        name=f"{kind}-{FOLDER_VIEW}" if folders else kind,
        source=f"{kind}:{source}" + (f"?{'&'.join(options)}" if options else ""), classes=classes,
        train=parts["train"], val=parts["val"] if len(parts["val"]) else None,
        test=parts["test"] if len(parts["test"]) else None,
        complete_splits=("test",) if folders else ALL_SPLITS)


