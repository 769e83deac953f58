"""``Predictor``: one loaded model (any runtime of :mod:`models.runtimes`) with the preprocessing of
:mod:`serve.images` and the thresholds of :mod:`serve.outputs.thresholds`, for Python code and the demo; a file
gets the same scores and tags here, in the tagger and in evaluation, whatever the other images of its batch are.

>>> p = Predictor.load("runs/my-run/export/model.onnx")           # doctest: +SKIP
>>> p.predict("cat.jpg").tags                                      # doctest: +SKIP
['cat', 'sofa']
>>> p.scores(["a.jpg", "b.png"]).shape                             # doctest: +SKIP
(2, 20)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from models.checkpoint import ModelMeta
from models.logits import sigmoid
from models.preprocess import EvalTransform
from models.runtimes import BackendUnavailableError, ModelLoadError, Runtime, open_runtime, parse_device, runtime_class
from serve import DEFAULT_BATCH_SIZE, DEFAULT_MAX_PIXELS
from serve.images import ImageInput, ImagePreprocessor
from serve.model_files import resolve_model_path
from serve.outputs.records import tag_record
from serve.outputs.selection_modes import Selection, make_selection
from serve.outputs.thresholds import resolve_thresholds


@dataclass(frozen=True)
class Prediction:
    """One image's result: every class's ``scores``, the ``thresholds`` and the selected ``tags``."""

    scores: dict[str, float]
    thresholds: dict[str, float]
    tags: list[str]

    @classmethod
    def from_probabilities(
        cls, classes: Sequence[str], probs: np.ndarray, thresholds: np.ndarray, selection: Selection | None = None
    ) -> Prediction:
        """Build from a probability row and thresholds ``(C,)``; ``selection`` defaults to the thresholds mode."""
        probs = np.asarray(probs, dtype=np.float32).reshape(-1)
        thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        if not len(classes) == probs.size == thresholds.size:
            raise ValueError(f"{len(classes)} classes, {probs.size} scores, {thresholds.size} thresholds")
        tags = tag_record("", probs, list(classes), thresholds, selection)["tags"]
        return cls(
            scores={c: float(p) for c, p in zip(classes, probs, strict=True)},
            thresholds={c: float(t) for c, t in zip(classes, thresholds, strict=True)},
            tags=tags)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"scores": {...}, "thresholds": {...}, "tags": [...]}``."""
        return {"scores": dict(self.scores), "thresholds": dict(self.thresholds), "tags": list(self.tags)}


class Predictor:
    """A loaded model plus its preprocessing and thresholds; thread-safe for concurrent ``scores`` calls."""

    def __init__(self, runtime: Runtime, *, path: Path | None = None, device_description: str = "",
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        meta = runtime.meta
        if meta.output != "logits":
            raise ModelLoadError(f"model output is {meta.output!r}; the predictor expects logits")
        self.runtime = runtime
        self.meta: ModelMeta = meta
        self.classes: list[str] = list(meta.classes)
        self.path = path
        self.backend: str = type(runtime).name
        self.device_description = device_description or self.backend
        self.max_pixels = max_pixels
        self.transform = EvalTransform.for_meta(meta)
        self._lock = threading.Lock()
        self._calls = 0

    @classmethod
    def load(cls, path: str | Path | None, backend: str | None = None, device: str | None = None, *,
             runs_dir: Path | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS,
             threads: int | None = None) -> Predictor:
        """Load a model file, a run folder, a run name under ``runs_dir``, or the latest run (``path=None``);
        ``backend`` and ``device`` pick the runtime, ``max_pixels`` bounds images (None: off). Raises
        :class:`ModelSpecError`, :class:`BackendUnavailableError` or :class:`ModelLoadError`."""
        parse_device(device)
        model_path = resolve_model_path(path, backend, runs_dir)
        runtime_class(model_path, backend)  # a bad request is a ModelSpecError, never a ModelLoadError
        try:
            runtime, description = open_runtime(model_path, backend, device, threads)
        except ModelLoadError:
            raise
        except ImportError as exc:  # ModuleNotFoundError from the backend names the package and the pip command
            raise BackendUnavailableError(f"cannot load {model_path}: {exc}") from None
        except (ValueError, OSError, RuntimeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot load {model_path}: {exc}") from exc
        return cls(runtime, path=model_path, device_description=description, max_pixels=max_pixels)

    @property
    def model_calls(self) -> int:
        """How many times the runtime has been run (one per batch), for monitoring and tests."""
        return self._calls

    def thresholds(self, threshold: float | None = None, per_class: Mapping[str, float] | None = None) -> np.ndarray:
        """Per-class thresholds ``(C,)``: see :func:`resolve_thresholds`."""
        return resolve_thresholds(self.meta, threshold, per_class)

    def preprocess(self, image: ImageInput) -> np.ndarray:
        """One image -> model input ``float32 (3, S, S)`` (raises :class:`ImageError` / ``TypeError``)."""
        return ImagePreprocessor(self.transform, self.max_pixels)(image)

    def scores_from_inputs(self, batch: np.ndarray) -> np.ndarray:
        """Preprocessed ``float32 (N, 3, S, S)`` -> sigmoid probabilities ``float32 (N, C)`` (one runtime call)."""
        batch = np.asarray(batch, dtype=np.float32)
        if batch.shape[0] == 0:
            return np.zeros((0, len(self.classes)), np.float32)
        with self._lock:
            self._calls += 1
        logits = self.runtime.predict_logits(batch)
        if logits.shape != (batch.shape[0], len(self.classes)):
            raise ValueError(f"model returned shape {logits.shape}, expected ({batch.shape[0]}, {len(self.classes)})")
        return sigmoid(logits).astype(np.float32)

    def scores(self, images: Sequence[ImageInput] | ImageInput, batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        """Sigmoid probabilities ``float32 (N, C)`` of images, in chunks of ``batch_size``, each independent of the
        others. Raises :class:`ImageError` for the first image that cannot be read."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if isinstance(images, (str, os.PathLike, bytes, Image.Image, np.ndarray, torch.Tensor)):
            images = [images]
        inputs = [self.preprocess(img) for img in images]
        if not inputs:
            return np.zeros((0, len(self.classes)), np.float32)
        starts = range(0, len(inputs), batch_size)
        chunks = [self.scores_from_inputs(np.stack(inputs[i : i + batch_size])) for i in starts]
        return np.concatenate(chunks)

    def predict(self, image: ImageInput, threshold: float | None = None, per_class: Mapping[str, float] | None = None,
                selection: Selection | str | None = None) -> Prediction:
        """Score one image and choose its tags by ``selection`` (a Selection or its text; default: thresholds)."""
        thresholds = self.thresholds(threshold, per_class)
        mode = make_selection(selection) if isinstance(selection, str) else selection
        return Prediction.from_probabilities(self.classes, self.scores([image])[0], thresholds, mode)

    def describe(self) -> dict[str, Any]:
        """Model facts for display: file, backend/device, architecture, input size, classes, threshold source."""
        return {
            "path": str(self.path) if self.path is not None else None,
            "backend": self.backend,
            "device": self.device_description,
            "arch": self.meta.arch,
            "image_size": self.meta.image_size,
            "classes": len(self.classes),
            "method": self.meta.method,
            "boostlu": self.meta.head.get("boostlu"),  # the head's BoostLU factor (None: plain linear head)
            "calibrated_thresholds": self.meta.thresholds is not None,
            "dataset": (self.meta.data or {}).get("source")}

    def __repr__(self) -> str:
        return f"Predictor({self.path}, {self.device_description}, {len(self.classes)} classes)"
