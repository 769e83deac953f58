"""Per-class thresholds, resolved in one place: calibrated (else 0.5), global, per-class overrides."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.checkpoint import ModelMeta
from serve import DEFAULT_THRESHOLD


def read_thresholds_file(path: str | Path) -> dict[str, float]:
    """Per-class thresholds from a JSON object or ``class<TAB|,>threshold`` lines (``ValueError`` / ``OSError``)."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        return {str(k): _threshold_value(path, str(k), v) for k, v in doc.items()}
    out: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sep = "\t" if "\t" in line else ","
        name, found, value = line.rpartition(sep)
        if not found or not name.strip():
            raise ValueError(f"{path}:{number}: expected 'class<TAB>threshold' or 'class,threshold', got {line!r}")
        out[name.strip()] = _threshold_value(path, name.strip(), value.strip())
    return out


def _threshold_value(path: str | Path, name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: threshold of {name!r} is not a number: {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{path}: threshold of {name!r} must be in [0, 1], got {number}")
    return number


def thresholds_source(meta: ModelMeta, threshold: float | None, per_class: Mapping[str, float] | None) -> str:
    """Human description of where the thresholds come from, for the start-up line."""
    if threshold is not None:
        base = f"global {threshold:g}"
    elif meta.thresholds is not None:
        base = "the model's calibrated per-class thresholds"
    else:
        base = f"{DEFAULT_THRESHOLD:g} (the model has no calibrated thresholds)"
    return base + (f", {len(per_class)} class(es) overridden from file" if per_class else "")


def resolve_thresholds(
    meta: ModelMeta, threshold: float | None = None, per_class: Mapping[str, float] | None = None
) -> np.ndarray:
    """Per-class thresholds ``(C,)``: ``threshold`` if given, else the model's, else 0.5; then the ``per_class``
    overrides. Raises ``ValueError`` for values outside [0, 1], unknown classes or a bad threshold count."""
    n = len(meta.classes)
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        out = np.full(n, float(threshold))
    elif meta.thresholds is not None:
        if len(meta.thresholds) != n:
            raise ValueError(f"model metadata has {len(meta.thresholds)} thresholds for {n} classes")
        out = np.array(meta.thresholds, dtype=np.float64)
    else:
        out = np.full(n, DEFAULT_THRESHOLD)
    if per_class:
        index = {name: i for i, name in enumerate(meta.classes)}
        unknown = sorted(set(per_class) - set(index))
        if unknown:
            raise ValueError(f"unknown class(es) in per-class thresholds: {', '.join(unknown)}")
        for name, value in per_class.items():
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"threshold for {name!r} must be in [0, 1], got {value}")
            out[index[name]] = float(value)
    return out
