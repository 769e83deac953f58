"""ONNX Runtime backend for exported ``.onnx`` models (metadata read from the file's metadata_props).

``onnxruntime`` is imported only when a model is loaded, so importing this module is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from models.checkpoint import ModelMeta
from models.onnx_metadata import meta_from_props

INSTALL_HINT = "pip install onnxruntime-gpu  (or, CPU only: pip install onnxruntime)"
DEFAULT_PROVIDERS: tuple[str, ...] = ("CPUExecutionProvider",)


def import_onnxruntime() -> Any:
    """Import and return the ``onnxruntime`` module; ``ModuleNotFoundError`` with the pip command if absent."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the onnxruntime runtime needs the onnxruntime package ({exc}); install it with: {INSTALL_HINT}"
        ) from exc
    return onnxruntime


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
    def load(cls, path: str | Path, providers: Sequence[str] = DEFAULT_PROVIDERS) -> OnnxRuntimeBackend:
        """Open ``path`` with the given execution providers (default: CPU only).

        Raises ``FileNotFoundError``, ``ModuleNotFoundError`` (onnxruntime missing) or ``ValueError``
        (not a loadable ONNX model, or no ``spml_meta`` metadata).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model not found: {path}")
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
        except Exception as exc:  # onnxruntime's own exception classes (InvalidProtobuf, Fail, ...)
            raise ValueError(f"{path}: ONNX Runtime cannot load it ({type(exc).__name__}: {exc})") from exc
        meta = meta_from_props(session.get_modelmeta().custom_metadata_map, path)
        return cls(session, meta, path)

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` preprocessed batch -> float32 logits ``(N, C)``."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        (logits,) = self.session.run([self.output_name], {self.input_name: batch})
        return np.asarray(logits, dtype=np.float32)
