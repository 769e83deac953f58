"""OpenVINO backend for the exported ``.onnx`` files on the CPU: ``openvino`` in float32 (never bfloat16 silently),
``openvino-bf16`` in bfloat16 where the CPU has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from models.checkpoint import ModelMeta
from models.runtimes.devices import cpu_name, parse_device
from models.runtimes.errors import BackendUnavailableError, import_optional
from models.runtimes.onnxruntime_backend import OnnxRuntimeBackend

INSTALL_HINT = 'pip install "openvino>=2025.0"  (or the package\'s extra: pip install -e ".[openvino]")'


def import_openvino() -> Any:
    """Import and return the ``openvino`` module; ``ModuleNotFoundError`` with the pip command if absent."""
    return import_optional("openvino", INSTALL_HINT)


def cpu_has_bf16() -> bool:
    """Whether OpenVINO finds bfloat16 units on this CPU (without them a bf16 hint runs float32)."""
    return "BF16" in import_openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


class OpenVinoBackend:
    """A model compiled by OpenVINO for the CPU at ``precision``: float32 ``(N,3,S,S)`` -> logits ``(N,C)``."""

    name: ClassVar[str] = "openvino"
    precision: ClassVar[str] = "f32"
    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)

    def __init__(self, compiled: Any, meta: ModelMeta, path: Path) -> None:
        self.compiled = compiled
        self.meta = meta
        self.path = path
        self.request = compiled.create_infer_request()

    @classmethod
    def read_meta(cls, path: str | Path) -> ModelMeta:
        """The model metadata embedded in the ONNX file (as :meth:`OnnxRuntimeBackend.read_meta`)."""
        return OnnxRuntimeBackend.read_meta(path)

    @classmethod
    def load(cls, path: str | Path, threads: int | None = None) -> OpenVinoBackend:
        """Compile ``path`` for the CPU at the class's precision with ``threads`` threads; ``ValueError`` if OpenVINO
        cannot read it."""
        path = Path(path)
        meta = cls.read_meta(path)
        ov = import_openvino()
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": cls.precision}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        try:
            compiled = ov.Core().compile_model(str(path), "CPU", config)
        except Exception as exc:  # OpenVINO raises its own RuntimeError kinds for unreadable or unsupported graphs
            raise ValueError(f"{path}: OpenVINO cannot compile it ({type(exc).__name__}: {exc})") from exc
        return cls(compiled, meta, path)

    @classmethod
    def open(cls, path: str | Path, device: str | None = None,
             threads: int | None = None) -> tuple[OpenVinoBackend, str]:
        """Load ``path`` for ``device`` (the CPU only) with ``threads``; returns the runtime and where it runs."""
        kind, _ = parse_device(device)
        if kind not in ("default", "cpu"):
            raise BackendUnavailableError(f"device {device!r}: the {cls.name} backend runs on the CPU only here; use "
                                          "--device cpu, or --backend onnxruntime for a GPU")
        try:
            import_openvino()
        except ModuleNotFoundError as exc:
            raise BackendUnavailableError(str(exc)) from exc
        if cls.precision == "bf16" and not cpu_has_bf16():
            raise BackendUnavailableError(f"--backend {cls.name}: this CPU ({cpu_name()}) has no bfloat16 units; "
                                          "use --backend openvino (float32)")
        return cls.load(path, threads), f"{cls.name} (CPU, {cls.precision})"

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` preprocessed batch -> float32 logits ``(N, C)``."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        result = self.request.infer({0: batch})
        return np.asarray(result[self.compiled.output(0)], dtype=np.float32)


class OpenVinoBf16Backend(OpenVinoBackend):
    """OpenVINO in bfloat16 on CPUs with bfloat16 units (scores move: the export's bf16 gate checks them)."""

    name: ClassVar[str] = "openvino-bf16"
    precision: ClassVar[str] = "bf16"
