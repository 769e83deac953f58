"""Checkpoints: one ``torch.save`` dict readable with ``weights_only=True``: ``format``, ``meta`` (:class:`ModelMeta` as
JSON), ``model`` and optionally ``training``. :class:`ModelMeta` and :func:`read_checkpoint_meta` need no torch."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.files.atomic_writes import atomic_path

if TYPE_CHECKING:
    import torch

FORMAT = "spml-checkpoint"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def package_version() -> str:
    """The installed version of this package (``"unknown"`` when run from a bare source tree)."""
    try:
        return importlib_metadata.version("spml")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class ModelMeta:
    """Everything needed to rebuild, preprocess for and interpret a trained model."""

    classes: list[str]
    arch: str
    image_size: int
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    # resize to image_size x image_size, aspect ratio not kept (as the papers do); antialiased, after decoding
    # (large JPEGs at reduced scale, never below 2 x image_size per side: models.preprocess)
    resize: str = "squash"
    interpolation: str = "bilinear"  # bilinear or bicubic (the backbone's pretrained configuration)
    crop: float = 1.0  # < 1: resize to image_size / crop, keep the centre (timm's crop_pct); 1: the whole image
    weights: str = ""  # what the backbone started from: none, imagenet (source), a file
    lgconv: bool = False
    # classifier head: {"kind": "linear"} (+ "boostlu": alpha when the head runs per position with BoostLU) or
    # {"kind": "lem", heads, encoder_layers, ...} (models.network.HEADS)
    head: dict[str, Any] = field(default_factory=lambda: {"kind": "linear"})
    output: str = "logits"  # the network outputs logits; probabilities = sigmoid(logits)
    method: str = ""
    method_hparams: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # name, source, fingerprint, observed, split seed...
    metrics: dict[str, Any] = field(default_factory=dict)
    thresholds: list[float] | None = None  # per-class decision thresholds on probabilities (None: 0.5)
    calibration: dict[str, Any] = field(default_factory=dict)  # how the thresholds were chosen (export)
    epoch: int = 0
    package_version: str = field(default_factory=package_version)
    # Numeric precision of the artifact this meta describes: "fp32" for checkpoints and the canonical ONNX
    # export, "fp16" / "int8" for converted ONNX files (export.quantize). ``quantization`` describes how the
    # conversion was done (tool, target runtime, activation/weight types, symmetry, calibration, float nodes).
    precision: str = "fp32"
    quantization: dict[str, Any] = field(default_factory=dict)
    # A CPU runtime the export measured faster than ONNX Runtime on this file and checked against FP32:
    # {"backend", "cpu", "images_per_s": {runtime: img/s}}; ``python -m serve`` uses it on a CPU of the same model
    runtime_pick: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialise to a JSON string."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelMeta:
        """Parse a JSON string written by :meth:`to_json`; unknown keys (from newer versions) are ignored."""
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known}
        for key in ("mean", "std"):
            if key in kwargs:
                kwargs[key] = tuple(float(x) for x in kwargs[key])
        return cls(**kwargs)


def save_checkpoint(path: Path, model_state: dict[str, torch.Tensor], meta: ModelMeta,
                    training: dict[str, Any] | None = None) -> None:
    """Write weights + metadata (+ optional resume state) to ``path`` atomically."""
    import torch

    payload: dict[str, Any] = {"format": FORMAT, "meta": meta.to_json(), "model": model_state}
    if training is not None:
        payload["training"] = training
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


@dataclass
class Checkpoint:
    """A loaded checkpoint: metadata, weights, and the resume state when present."""

    meta: ModelMeta
    model: dict[str, torch.Tensor]
    training: dict[str, Any] | None
    path: Path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load a :func:`save_checkpoint` file with ``weights_only=True``; ``ValueError`` for other files."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    import torch

    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # pickle refusing a global, truncated file, not a zip...
        raise ValueError(f"{path}: not a loadable checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not an spml checkpoint (no '{FORMAT}' format marker)")
    return Checkpoint(meta=ModelMeta.from_json(payload["meta"]), model=payload["model"],
                      training=payload.get("training"), path=path)


class _Opaque(dict):
    """The code-free stand-in :func:`read_checkpoint_meta` builds for every non-plain object of the pickle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _MetaUnpickler(pickle.Unpickler):
    """Unpickles a checkpoint's structure importing nothing: classes are :class:`_Opaque`, storages ``None``."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> None:
        return None


def read_checkpoint_meta(path: Path) -> ModelMeta:
    """The :class:`ModelMeta` of a checkpoint, read without torch or the weights (no code runs)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
            payload = _MetaUnpickler(io.BytesIO(archive.read(name))).load()
    except (OSError, StopIteration, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(f"{path}: not a loadable checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or not isinstance(payload.get("meta"), str):
        raise ValueError(f"{path}: not an spml checkpoint (no '{FORMAT}' format marker)")
    return ModelMeta.from_json(payload["meta"])
