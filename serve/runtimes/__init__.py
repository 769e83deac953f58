"""The one registry of inference runtimes: name -> class, picked from the model file's suffix.

Every runtime class has ``name``, ``suffixes``, a classmethod ``load(path)``, the attribute
``meta: ModelMeta`` and ``predict_logits(batch float32 (N,3,S,S)) -> float32 (N,C)``. Heavy optional
dependencies (onnxruntime, TensorRT) are imported inside ``load`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from models.checkpoint import ModelMeta
from serve.runtimes.onnxruntime_backend import OnnxRuntimeBackend
from serve.runtimes.tensorrt_backend import TensorRTBackend
from serve.runtimes.torch_backend import TorchBackend


class Runtime(Protocol):
    """What the tagger (and the demo) need from a loaded model."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    meta: ModelMeta

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` -> float32 logits ``(N, C)``."""
        ...


RUNTIMES: dict[str, type] = {
    OnnxRuntimeBackend.name: OnnxRuntimeBackend,
    TorchBackend.name: TorchBackend,
    TensorRTBackend.name: TensorRTBackend,
}


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


def load_runtime(path: str | Path, runtime: str | None = None) -> Runtime:
    """Load ``path`` with the runtime named ``runtime`` (default: chosen from the suffix)."""
    if runtime is None:
        cls = runtime_for(path)
    elif runtime in RUNTIMES:
        cls = RUNTIMES[runtime]
    else:
        raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")
    return cls.load(path)


__all__ = [
    "RUNTIMES",
    "OnnxRuntimeBackend",
    "Runtime",
    "TensorRTBackend",
    "TorchBackend",
    "load_runtime",
    "runtime_for",
]
