"""The label-bias protocols (Arroyo, Perona & Cole 2023; docs/datasets.md): each image's kept positive drawn with a
probability from its objects (``size``, ``location``) or per class (``empirical``), as the reference computes and draws
them, so COCO with seed 1200 gives the reference's files."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models.data.types import DataError, DatasetSplits, ObjectTable

__all__ = ["bias_weights", "location_weights", "read_class_weights", "size_weights"]

WeightsOf = Callable[[int], list[float]]


def size_weights(table: ObjectTable, num_classes: int) -> WeightsOf:
    """Image ``i``'s class weights: each object's area over the image's total area, summed per class."""

    def weights_of(i: int) -> list[float]:
        objects = table.row(i)
        total: float = 0
        for _, area, _, _ in objects:
            total += area
        if not total > 0:
            raise DataError(f"image {i} of the training pool: its objects' areas sum to {total}; the size variant "
                            "needs a positive area")
        weights: list[float] = [0.0] * num_classes
        for cls, area, _, _ in objects:
            weights[cls] += area / total
        return weights

    return weights_of


def location_weights(table: ObjectTable, num_classes: int) -> WeightsOf:
    """Image ``i``'s class weights: ``c / d`` per object, ``d`` the distance of its box centre from the image
    centre (0 -> 0.0005), ``c`` the reference's per-image constant (see the module docstring), summed per class."""

    def weights_of(i: int) -> list[float]:
        objects = table.row(i)
        width, height = table.sizes[i].tolist()
        inverse_sum: float = 0
        for _, _, x, y in objects:
            corner_distance = math.sqrt((x - width) ** 2 + (y - height) ** 2)
            inverse_sum += 1 / (corner_distance if corner_distance != 0 else 1)
        constant = 1 / inverse_sum
        centre_x, centre_y = 0.5 * width, 0.5 * height
        weights: list[float] = [0.0] * num_classes
        for cls, _, x, y in objects:
            distance = math.sqrt((x - centre_x) ** 2 + (y - centre_y) ** 2)
            weights[cls] += constant / (distance if distance != 0 else 0.0005)
        return weights

    return weights_of


def read_class_weights(path: Path, classes: list[str]) -> list[float]:
    """Per-class weights from ``path``: a JSON object ``{"class name": weight}`` or ``class name weight`` lines;
    every class needs one weight >= 0, and an unknown name is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the class weights ({exc})") from exc
    if text.lstrip().startswith("{"):
        try:
            raw = {str(k): v for k, v in json.loads(text).items()}
        except (json.JSONDecodeError, AttributeError) as exc:
            raise DataError(f"{path}: not a JSON object of class weights ({exc})") from exc
    else:
        pairs = [line.rsplit(None, 1) for line in text.splitlines() if line.strip()]
        bad = next((n for n, pair in enumerate(pairs, 1) if len(pair) != 2), None)
        if bad is not None:
            raise DataError(f"{path}:{bad}: expected 'class name weight'")
        raw = dict(pairs)  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(classes))
    missing = [name for name in classes if name not in raw]
    if unknown or missing:
        raise DataError(f"{path}: the class weights must name each of the dataset's {len(classes)} classes once "
                        f"(unknown: {', '.join(unknown[:3]) or 'none'}; missing: {', '.join(missing[:3]) or 'none'})")
    try:
        weights = [float(raw[name]) for name in classes]
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: a class weight is not a number ({exc})") from exc
    if not all(w >= 0 and math.isfinite(w) for w in weights):
        raise DataError(f"{path}: class weights must be finite and >= 0")
    return weights


def _empirical_weights(class_weights: list[float], labels: np.ndarray) -> WeightsOf:
    """Image ``i``'s class weights: the class weight on its positives, 0 elsewhere."""
    return lambda i: [w if labels[i, c] == 1 else 0.0 for c, w in enumerate(class_weights)]


def bias_weights(variant: str, splits: DatasetSplits, weights_file: str = "") -> WeightsOf:
    """The weights function of ``variant`` (``size``, ``location`` or ``empirical``) over ``splits.train``'s rows."""
    if variant == "empirical":
        return _empirical_weights(read_class_weights(Path(weights_file), list(splits.classes)), splits.train.labels)
    if splits.train_objects is None:
        raise DataError(f"--observed single:{variant} draws the kept positive from the images' objects, which "
                        f"dataset {splits.name} does not describe (COCO instance annotations and the built-in data "
                        "do); single:empirical needs only class weights")
    table = splits.train_objects()
    if len(table) != len(splits.train):
        raise DataError(f"dataset {splits.name}: objects for {len(table)} images, but the pool has {len(splits.train)}")
    make = size_weights if variant == "size" else location_weights
    return make(table, len(splits.classes))
