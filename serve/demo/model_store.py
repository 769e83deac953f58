"""The demo's models: the picker's choices, loaded on first use into a small LRU, and their descriptions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from serve import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta
    from serve.predictor import Predictor

#: Models kept loaded at once (the least recently used is dropped first).
DEFAULT_MAX_LOADED = 2


class ModelStore:
    """The models the picker offers (key -> file), loaded on first use; at most ``max_loaded`` kept in memory."""

    def __init__(
        self,
        choices: dict[str, Path],
        *,
        backend: str | None = None,
        device: str | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        max_loaded: int = DEFAULT_MAX_LOADED,
        loaded: dict[str, Predictor] | None = None,
    ) -> None:
        self.choices = dict(choices)
        self.backend = backend
        self.device = device
        self.max_pixels = max_pixels
        self.max_loaded = max(1, max_loaded)
        self._loaded: OrderedDict[str, Predictor] = OrderedDict()
        self._metas: dict[str, ModelMeta] = {}
        self._lock = threading.Lock()
        for key, predictor in (loaded or {}).items():
            self.choices.setdefault(key, predictor.path or Path(key))
            self._loaded[key] = predictor
            self._metas[key] = predictor.meta

    def get(self, key: str) -> Predictor:
        """The predictor of ``key`` (loading it if needed); ``KeyError`` for keys the picker does not offer."""
        from serve.predictor import Predictor

        if key not in self.choices:
            raise KeyError(f"unknown model {key!r}")
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            predictor = Predictor.load(self.choices[key], self.backend, self.device, max_pixels=self.max_pixels)
            self._loaded[key] = predictor
            self._metas[key] = predictor.meta
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
            return predictor

    def meta(self, key: str) -> ModelMeta:
        """The metadata of a model that has been loaded at least once (kept after it is unloaded)."""
        if key not in self._metas:
            return self.get(key).meta
        return self._metas[key]


def model_markdown(key: str, predictor: Predictor) -> str:
    """One-paragraph description of a loaded model for the header."""
    info = predictor.describe()
    metrics = predictor.meta.metrics or {}
    val = metrics.get("val") if isinstance(metrics.get("val"), dict) else {}
    parts = [
        f"**{key}**",
        info["device"],
        f"{info['arch']} at {info['image_size']} px",
        *([str(precision)] if (precision := getattr(predictor.meta, "precision", "fp32")) != "fp32" else []),
        f"{info['classes']} classes"]
    if info["method"]:
        parts.append(f"method {info['method']}")
    if info["boostlu"] is not None:
        parts.append(f"BoostLU {info['boostlu']:g}")
    if isinstance(val, dict) and isinstance(val.get("mAP"), (int, float)):
        parts.append(f"val mAP {val['mAP']:.1f}")
    if info["dataset"]:
        parts.append(f"data {info['dataset']}")
    parts.append("calibrated per-class thresholds" if info["calibrated_thresholds"] else "no calibrated thresholds")
    return " · ".join(parts)
