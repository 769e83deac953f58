"""The one table of inference runtimes (:data:`RUNTIMES`), picked from the model file's suffix; each imports its heavy
dependency in ``load`` only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from models.checkpoint import ModelMeta
from models.registry import Row, Table, UnknownName
from models.runtimes.devices import cpu_name, parse_device
from models.runtimes.errors import BackendUnavailableError, ModelLoadError, ModelSpecError
from models.runtimes.onnxruntime_backend import OnnxRuntimeBackend
from models.runtimes.openvino_backend import OpenVinoBackend, OpenVinoBf16Backend
from models.runtimes.tensorrt_backend import TensorRTBackend
from models.runtimes.torch_backend import TorchBackend


class Runtime(Protocol):
    """What the tagger (and the demo) need from a loaded model."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    meta: ModelMeta

    @classmethod
    def open(cls, path: str | Path, device: str | None = None, threads: int | None = None) -> tuple[Runtime, str]:
        """Load ``path`` for ``device`` with ``threads`` CPU threads; (runtime, where it runs)."""
        ...

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` -> float32 logits ``(N, C)``."""
        ...


#: The runtimes (``--backend``): name, help, class.
RUNTIMES: Table[type] = Table("backend", [
    Row(OnnxRuntimeBackend.name, "ONNX Runtime: .onnx files, on the CPU or CUDA", OnnxRuntimeBackend),
    Row(TorchBackend.name, "PyTorch: run checkpoints (.pt, .pth)", TorchBackend),
    Row(TensorRTBackend.name, "TensorRT: .engine files built by python -m export --trt (a GPU)", TensorRTBackend),
    Row(OpenVinoBackend.name, "OpenVINO: the same .onnx files on the CPU, in float32 (the openvino extra)",
        OpenVinoBackend),
    Row(OpenVinoBf16Backend.name, "OpenVINO in bfloat16, on CPUs with bfloat16 units", OpenVinoBf16Backend),
])

#: Model file suffixes of runtimes that may not be installed, for a more helpful "unsupported" message.
_KNOWN_SUFFIXES = {".engine": "TensorRT engine", ".plan": "TensorRT engine", ".trt": "TensorRT engine"}


def supported_suffixes() -> list[str]:
    """All model file suffixes some runtime accepts, e.g. ``['.onnx', '.pt', '.pth']``."""
    return [s for cls in RUNTIMES.values() for s in cls.suffixes]


def runtime_for(path: str | Path) -> type:
    """The runtime class for a model file, chosen by its suffix (``ValueError`` for unknown suffixes)."""
    suffix = Path(path).suffix.lower()
    for cls in RUNTIMES.values():
        if suffix in cls.suffixes:
            return cls
    raise ValueError(f"unsupported model file {path}: expected one of {', '.join(supported_suffixes())}")


def runtime_named(backend: str) -> type:
    """The runtime class registered as ``backend``; :class:`ModelSpecError` (the one unknown-name message)."""
    try:
        return RUNTIMES[backend]
    except UnknownName as exc:
        raise ModelSpecError(str(exc)) from None


def runtime_class(path: Path, backend: str | None) -> type:
    """The registry class that loads ``path`` (``backend`` forces one); :class:`ModelSpecError` otherwise."""
    suffix = path.suffix.lower()
    if backend is not None:
        cls = runtime_named(backend)
        if suffix not in cls.suffixes:
            raise ModelSpecError(f"backend {backend} cannot load {path.name}: it reads {', '.join(cls.suffixes)} files")
        return cls
    try:
        return runtime_for(path)
    except ValueError:
        kind = _KNOWN_SUFFIXES.get(suffix)
        if kind:
            raise ModelSpecError(f"{path} is a {kind}, but no installed runtime reads {suffix} files (runtimes: "
                                 f"{', '.join(RUNTIMES)}; they read {', '.join(supported_suffixes())})") from None
        raise ModelSpecError(f"unsupported model file {path}: expected one of {', '.join(supported_suffixes())} "
                             "(or a run folder / run name)") from None


def read_model_meta(path: str | Path, backend: str | None = None) -> ModelMeta:
    """The metadata of model file ``path`` without loading the model or importing torch; :class:`ModelSpecError` for a
    bad path or backend, :class:`ModelLoadError` when it holds no metadata of this package."""
    path = Path(path)
    if not path.is_file():
        raise ModelSpecError(f"model not found: {path}")
    cls = runtime_class(path, backend)
    try:
        meta: ModelMeta = cls.read_meta(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot read the metadata of {path}: {exc}") from exc
    if meta.output != "logits":
        raise ModelLoadError(f"{path}: model output is {meta.output!r}; the tagger expects logits")
    return meta


def open_runtime(path: Path, backend: str | None = None, device: str | None = None,
                 threads: int | None = None) -> tuple[Runtime, str]:
    """Load model file ``path`` with its runtime (or ``backend``) for ``device`` and ``threads``; returns the runtime
    and where it runs. :class:`BackendUnavailableError` when the runtime or GPU provider is missing."""
    cls = runtime_class(path, backend)
    picked = _export_pick(path, cls, device) if backend is None else None
    if picked is not None:
        pick_cls, rates = picked
        try:
            runtime, where = pick_cls.open(path, device, threads)
        except (BackendUnavailableError, ValueError):
            pass  # the pick does not run here after all: the suffix's runtime does
        else:
            return runtime, (f"{where}; the export measured it faster on this CPU ({rates[pick_cls.name]:.0f} "
                             f"against onnxruntime's {rates.get('onnxruntime', 0):.0f} img/s; --backend onnxruntime "
                             "to override)")
    return cls.open(path, device, threads)


def _export_pick(path: Path, cls: type, device: str | None) -> tuple[type, dict[str, float]] | None:
    """The runtime the export picked for ``path`` on this CPU model (:attr:`ModelMeta.runtime_pick`), when ``cls``
    is ONNX Runtime on the CPU and the pick is installed; None otherwise."""
    if cls is not OnnxRuntimeBackend or parse_device(device)[0] not in ("default", "cpu"):
        return None
    try:
        pick = cls.read_meta(path).runtime_pick
    except (OSError, ValueError):
        return None
    chosen = RUNTIMES.get(pick.get("backend", ""))
    if not (isinstance(chosen, type) and issubclass(chosen, OpenVinoBackend)) or pick.get("cpu") != cpu_name():
        return None
    return (chosen, pick.get("images_per_s", {})) if importlib.util.find_spec("openvino") else None


__all__ = [
    "RUNTIMES", "BackendUnavailableError", "ModelLoadError", "ModelSpecError", "OnnxRuntimeBackend", "OpenVinoBackend",
    "OpenVinoBf16Backend", "Runtime",
    "TensorRTBackend", "TorchBackend", "open_runtime", "parse_device", "read_model_meta",
    "runtime_class", "runtime_for", "runtime_named"]
