"""ONNX Runtime backend for exported ``.onnx`` models."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from models.checkpoint import ModelMeta
from models.onnx_metadata import meta_from_props
from models.runtimes.devices import ort_providers, provider_name
from models.runtimes.errors import BackendUnavailableError, import_optional

INSTALL_HINT = "pip install onnxruntime-gpu  (or, CPU only: pip install onnxruntime)"
DEFAULT_PROVIDERS: tuple[str, ...] = ("CPUExecutionProvider",)


def import_onnxruntime() -> Any:
    """Import and return the ``onnxruntime`` module; ``ModuleNotFoundError`` with the pip command if absent."""
    return import_optional("onnxruntime", INSTALL_HINT)


class OnnxRuntimeBackend:
    """An ``InferenceSession`` over an exported model: float32 ``(N,3,S,S)`` -> logits ``(N,C)``."""

    name: ClassVar[str] = "onnxruntime"
    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)

    def __init__(self, session: Any, meta: ModelMeta, path: Path) -> None:
        self.session = session
        self.meta = meta
        self.path = path
        self.input_name: str = session.get_inputs()[0].name
        self.output_name: str = session.get_outputs()[0].name

    @classmethod
    def read_meta(cls, path: str | Path) -> ModelMeta:
        """The model metadata embedded in ``path`` (its ``metadata_props``), read with ``onnx`` without building a
        session (the weights are parsed, not used). Raises ``FileNotFoundError`` or ``ValueError``."""
        import onnx

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model not found: {path}")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError and others for files that are not ONNX models
            raise ValueError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from exc
        return meta_from_props({p.key: p.value for p in model.metadata_props}, path)

    @classmethod
    def load(
        cls, path: str | Path, providers: Sequence[str] = DEFAULT_PROVIDERS, threads: int | None = None,
        spinning: bool = True,
    ) -> OnnxRuntimeBackend:
        """Open ``path`` with ``providers`` (default: CPU); ``ValueError`` for a file that is no model of this package.
        ``spinning=False`` lets idle intra-op threads sleep."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model not found: {path}")
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # ONNX Runtime's CPU memory arena stays on (its default): it keeps the largest batch's activations for the
        # session's lifetime, so a run of equal batches allocates once; memory stays bounded by the largest batch.
        # Speed and memory with and without it: docs/tagging-at-scale.md, "Memory and speed".
        if threads is not None:
            options.intra_op_num_threads = threads
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
        except Exception as exc:  # onnxruntime's own exception classes (InvalidProtobuf, Fail, ...)
            raise ValueError(f"{path}: ONNX Runtime cannot load it ({type(exc).__name__}: {exc})") from exc
        meta = meta_from_props(session.get_modelmeta().custom_metadata_map, path)
        return cls(session, meta, path)

    @classmethod
    def open(cls, path: str | Path, device: str | None = None,
             threads: int | None = None) -> tuple[OnnxRuntimeBackend, str]:
        """Load ``path`` for ``device`` with ``threads``; returns the runtime and where it runs.
        :class:`BackendUnavailableError` where ONNX Runtime would silently fall back to the CPU."""
        ort = import_onnxruntime()
        providers = ort_providers(device, ort.get_available_providers())
        runtime = cls.load(path, providers=providers, threads=threads)
        active = list(runtime.session.get_providers())
        missing = [provider_name(p) for p in providers if provider_name(p) not in active]
        if missing:
            raise BackendUnavailableError(f"device {device!r}: ONNX Runtime could not start {', '.join(missing)} "
                                          f"(active: {', '.join(active)}); check that the CUDA, cuDNN (and TensorRT) "
                                          "libraries matching onnxruntime-gpu are installed, or use --device cpu")
        return runtime, f"onnxruntime ({', '.join(active)})"

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` preprocessed batch -> float32 logits ``(N, C)``."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        (logits,) = self.session.run([self.output_name], {self.input_name: batch})
        return np.asarray(logits, dtype=np.float32)
