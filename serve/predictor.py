"""``Predictor``: one loaded model with the shared preprocessing and thresholds, for Python code and the demo.

The model file goes through the runtime registry (:mod:`models.runtimes`: ``.pt`` -> PyTorch, ``.onnx`` ->
ONNX Runtime, any backend added there later); images go through :mod:`models.preprocess`, the one
preprocessing that training evaluation and ``python -m serve tag`` use; thresholds come from
:func:`serve.thresholds.resolve_thresholds` (the model's calibrated per-class thresholds, else 0.5), optionally
overridden by one global value or per class. So a file gets the same scores and tags here, in the tagger and
in evaluation, whatever the other images of its batch are.

>>> p = Predictor.load("runs/my-run/export/model.onnx")           # doctest: +SKIP
>>> p.predict("cat.jpg").tags                                      # doctest: +SKIP
['cat', 'sofa']
>>> p.scores(["a.jpg", "b.png"]).shape                             # doctest: +SKIP
(2, 20)
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from models.checkpoint import ModelMeta
from models.logits import sigmoid
from models.preprocess import EvalTransform, decode_scaled, read_image, to_rgb
from models.runtimes import (
    RUNTIMES,
    BackendUnavailableError,
    ModelLoadError,
    ModelSpecError,
    Runtime,
    open_runtime,
    parse_device,
    runtime_class,
    supported_suffixes,
)
from serve import DEFAULT_BATCH_SIZE, DEFAULT_MAX_PIXELS
from serve.records import tag_record
from serve.tag_selection import Selection, make_selection
from serve.thresholds import resolve_thresholds

#: What :meth:`Predictor.scores` and :meth:`Predictor.predict` accept as one image: a file path, encoded file
#: bytes, a PIL image, a ``uint8`` array ``(H, W)`` / ``(H, W, 1|3|4)`` (grey / RGB / RGBA), or a ``uint8``
#: tensor ``(3, H, W)`` (RGB, as :func:`models.preprocess.read_image` returns).
ImageInput = str | os.PathLike | bytes | Image.Image | np.ndarray | torch.Tensor



class ImageError(ValueError):
    """An input image could not be used; ``reason`` is a short human explanation, ``source`` names the input."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


# --------------------------------------------------------------------------------------------------------
# Model files


def models_in_folder(folder: Path) -> list[Path]:
    """Loadable model files of a run folder, preferred first: ``best.pt``, then ``export/*`` and top-level files
    with a registered suffix (sorted; ``last.pt`` excluded: it is a resume checkpoint)."""
    from models.files.run_folder import BEST, LAST

    suffixes = set(supported_suffixes())
    found: list[Path] = []
    if (folder / BEST).is_file():
        found.append(folder / BEST)
    for sub in (folder / "export", folder):
        if sub.is_dir():
            for path in sorted(sub.iterdir()):
                if path.is_file() and path.suffix.lower() in suffixes and path.name not in (BEST, LAST):
                    found.append(path)
    return found


def resolve_model_path(target: str | Path | None, backend: str | None = None, runs_dir: Path | None = None) -> Path:
    """A model file from ``target``: a model file, a run folder, a run name under ``runs_dir`` (default
    ``$SPML_RUNS`` or ``./runs``), or ``None`` for the latest run.

    A run resolves to its ``best.pt``, or, when ``backend`` names a runtime that does not read checkpoints, to
    the first of its exported files that runtime reads (``export/model.onnx`` for onnxruntime).
    Raises :class:`ModelSpecError` when nothing fits.
    """
    from models.files.run_folder import default_runs_dir, latest_run

    runs = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    if target is None:
        try:
            folder = latest_run(runs)
        except FileNotFoundError as exc:
            raise ModelSpecError(str(exc)) from None
    else:
        path = Path(target).expanduser()
        if path.is_file():
            return path
        if path.is_dir():
            folder = path
        elif (runs / str(target)).is_dir():
            folder = runs / str(target)
        else:
            raise ModelSpecError(f"model not found: {target} (not a file, a run folder, or a run under {runs})")
    candidates = models_in_folder(folder)
    if backend is not None:
        if backend not in RUNTIMES:
            raise ModelSpecError(f"unknown backend {backend!r}; available: {', '.join(RUNTIMES)}")
        candidates = [p for p in candidates if p.suffix.lower() in RUNTIMES[backend].suffixes]
    if not candidates:
        what = f" that backend {backend} reads" if backend else ""
        raise ModelSpecError(f"no model file{what} in {folder} (expected best.pt or export/model.onnx)")
    return candidates[0]


# --------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Prediction:
    """One image's result: ``scores`` (every class, model order), the ``thresholds`` used, and ``tags``: the classes
    the selection chooses (by default those whose score reaches their threshold), highest score first (the same
    rule as ``python -m serve tag``)."""

    scores: dict[str, float]
    thresholds: dict[str, float]
    tags: list[str]

    @classmethod
    def from_probabilities(
        cls, classes: Sequence[str], probs: np.ndarray, thresholds: np.ndarray, selection: Selection | None = None
    ) -> Prediction:
        """Build from a probability row ``(C,)`` and thresholds ``(C,)`` (no model involved); ``selection``: a
        :class:`serve.tag_selection.Selection` (default: the thresholds mode)."""
        probs = np.asarray(probs, dtype=np.float32).reshape(-1)
        thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        if not len(classes) == probs.size == thresholds.size:
            raise ValueError(f"{len(classes)} classes, {probs.size} scores, {thresholds.size} thresholds")
        tags = tag_record("", probs, list(classes), thresholds, selection)["tags"]
        return cls(
            scores={c: float(p) for c, p in zip(classes, probs, strict=True)},
            thresholds={c: float(t) for c, t in zip(classes, thresholds, strict=True)},
            tags=tags,
        )

    def with_thresholds(self, thresholds: Sequence[float] | np.ndarray) -> Prediction:
        """The same scores re-filtered with other thresholds ``(C,)`` in class order."""
        classes = list(self.scores)
        probs = np.array([self.scores[c] for c in classes], dtype=np.float32)
        return Prediction.from_probabilities(classes, probs, np.asarray(thresholds))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"scores": {...}, "thresholds": {...}, "tags": [...]}``."""
        return {"scores": dict(self.scores), "thresholds": dict(self.thresholds), "tags": list(self.tags)}


# --------------------------------------------------------------------------------------------------------
# Images


def _describe(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return str(image)
    if isinstance(image, Image.Image):
        return f"PIL image {image.mode} {image.size[0]}x{image.size[1]}"
    if isinstance(image, (np.ndarray, torch.Tensor)):
        return f"{type(image).__name__} {tuple(image.shape)} {image.dtype}"
    return type(image).__name__


def _check_pixels(source: str, width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageError(
            source,
            f"image too large: {width}x{height} = {width * height:,} pixels, the limit is {max_pixels:,} "
            "(refused as a possible decompression bomb)",
        )


def _decode_error(source: str, exc: BaseException) -> ImageError:
    """A readable :class:`ImageError` for an exception raised while opening / decoding an image."""
    if isinstance(exc, ImageError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return ImageError(source, "file not found")
    if isinstance(exc, IsADirectoryError):
        return ImageError(source, "is a folder, not an image file")
    if isinstance(exc, UnidentifiedImageError):
        return ImageError(source, "not an image (or a format Pillow cannot read)")
    if isinstance(exc, Image.DecompressionBombError):
        return ImageError(source, f"image too large, refused as a possible decompression bomb ({exc})")
    if isinstance(exc, MemoryError):
        return ImageError(source, "image too large to decode in memory")
    text = str(exc).strip()
    if "truncated" in text.lower():
        return ImageError(source, f"truncated image: the file ends before the image data does ({text})")
    return ImageError(source, f"corrupt or unsupported image data ({type(exc).__name__}: {text})")


def _rgb_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> ``uint8 (3, H, W)`` through :func:`models.preprocess.to_rgb`, as :func:`read_image` does."""
    return torch.from_numpy(np.asarray(to_rgb(image)).copy()).permute(2, 0, 1).contiguous()


def load_rgb(
    image: ImageInput, max_pixels: int | None = DEFAULT_MAX_PIXELS, decode_side: int | None = None
) -> torch.Tensor:
    """Any :data:`ImageInput` -> ``uint8`` RGB tensor ``(3, H, W)`` with EXIF orientation applied and alpha
    composited onto white (:func:`models.preprocess.read_image` / :func:`~models.preprocess.to_rgb`).

    ``max_pixels`` (:data:`serve.DEFAULT_MAX_PIXELS`; ``None`` turns the check off) bounds width x height, checked
    from the file header before decoding. ``decode_side``: encoded JPEGs (paths, bytes) may be decoded at reduced
    scale down to this many pixels per side, as :class:`~models.preprocess.EvalTransform` does (its
    ``decode_side``). Raises :class:`ImageError` with a readable reason, or ``TypeError`` for other inputs.
    """
    source = _describe(image)
    try:
        if isinstance(image, (str, os.PathLike)):
            with Image.open(image) as header:  # header only: refuse huge images before decoding them
                _check_pixels(source, *header.size, max_pixels)
            return read_image(image, decode_side)
        if isinstance(image, (bytes, bytearray, memoryview)):
            with Image.open(io.BytesIO(bytes(image))) as img:
                _check_pixels(source, *img.size, max_pixels)
                return _rgb_tensor(decode_scaled(img, decode_side))
        if isinstance(image, Image.Image):
            _check_pixels(source, *image.size, max_pixels)
            return _rgb_tensor(image)
        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
                raise TypeError(f"tensor images must be uint8 (3, H, W) RGB, got {source}")
            _check_pixels(source, int(image.shape[2]), int(image.shape[1]), max_pixels)
            return image.contiguous()
        if isinstance(image, np.ndarray):
            ok_shape = image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3, 4))
            if image.dtype != np.uint8 or not ok_shape:
                raise TypeError(f"array images must be uint8 (H, W) or (H, W, 1|3|4), got {source}")
            _check_pixels(source, image.shape[1], image.shape[0], max_pixels)
            arr = image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image
            return _rgb_tensor(Image.fromarray(np.ascontiguousarray(arr)))
    except TypeError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, struct.error, DecompressionBombError...
        raise _decode_error(source, exc) from None
    raise TypeError(f"unsupported image input {source}: pass a path, bytes, a PIL image or a uint8 array")


@dataclass(frozen=True)
class ImagePreprocessor:
    """Any :data:`ImageInput` -> model input ``float32 (3, S, S)``: :func:`load_rgb` (pixel-count check, EXIF,
    alpha) then the model's :class:`~models.preprocess.EvalTransform`. Picklable, for decode workers.

    The two halves can run apart, with the same values: :meth:`decode` (file -> resized ``uint8 (3, S, S)``, the
    costly part, 4x smaller to keep or send than floats) and :meth:`normalize` (a ``uint8`` batch -> floats)."""

    transform: EvalTransform
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    @classmethod
    def for_model(cls, meta: ModelMeta, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ImagePreprocessor:
        """The preprocessing of a model with metadata ``meta``."""
        return cls(EvalTransform.for_meta(meta), max_pixels)

    def decode(self, image: ImageInput) -> np.ndarray:
        """Decode one image and resize it to the model input: ``uint8 (3, S, S)`` (raises :class:`ImageError` /
        ``TypeError``)."""
        rgb = load_rgb(image, self.max_pixels, self.transform.decode_side)
        return self.transform.resize(rgb).numpy()

    def normalize(self, images: np.ndarray) -> np.ndarray:
        """Decoded ``uint8 (..., 3, S, S)`` -> model input ``float32`` (the model's mean and std)."""
        tensor = torch.from_numpy(np.ascontiguousarray(images))
        return self.transform.normalize(tensor).numpy()

    def __call__(self, image: ImageInput) -> np.ndarray:
        """Preprocess one image (raises :class:`ImageError` / ``TypeError``): :meth:`decode` then :meth:`normalize`,
        the values of :class:`~models.preprocess.EvalTransform`."""
        return self.normalize(self.decode(image))


# --------------------------------------------------------------------------------------------------------
# The predictor


class Predictor:
    """A loaded model plus its preprocessing and thresholds; thread-safe for concurrent ``scores`` calls."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        path: Path | None = None,
        device_description: str = "",
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
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
    def load(
        cls,
        path: str | Path | None,
        backend: str | None = None,
        device: str | None = None,
        *,
        runs_dir: Path | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        threads: int | None = None,
    ) -> Predictor:
        """Load a model file (``.pt`` checkpoint, ``.onnx`` export, any registered suffix), a run folder, a run name
        under ``runs_dir``, or the latest run (``path=None``).

        ``backend`` forces a runtime of :data:`models.runtimes.RUNTIMES`; ``device`` is ``cpu``, ``cuda[:N]`` or
        ``tensorrt[:N]`` (``None``: PyTorch uses CUDA when available, ONNX Runtime uses CPU). ``max_pixels``: the
        decompression-bomb limit of :meth:`scores` and :meth:`predict` (:data:`serve.DEFAULT_MAX_PIXELS`; ``None``
        turns it off). ``threads``: CPU threads of the runtime (default: its own choice). Raises
        :class:`ModelSpecError` (bad request), :class:`BackendUnavailableError` (runtime or GPU provider missing)
        or :class:`ModelLoadError` (the file does not load).
        """
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
        """Sigmoid probabilities ``float32 (N, C)`` of a list of images (one image counts as a list of one),
        in chunks of ``batch_size``. An image's scores do not depend on the rest of the list.

        Raises :class:`ImageError` for the first image that cannot be read.
        """
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

    def predict(
        self,
        image: ImageInput,
        threshold: float | None = None,
        per_class: Mapping[str, float] | None = None,
        selection: Selection | str | None = None,
    ) -> Prediction:
        """Score one image and choose its tags: ``selection`` (a :class:`serve.tag_selection.Selection` or its
        text, ``"mcut"``, ``"top-k:5"``; default: the thresholds, see :meth:`thresholds`)."""
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
            "dataset": (self.meta.data or {}).get("source"),
        }

    def __repr__(self) -> str:
        return f"Predictor({self.path}, {self.device_description}, {len(self.classes)} classes)"
