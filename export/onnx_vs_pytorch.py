"""The FP32 check: an exported ONNX model against its PyTorch model on the same preprocessed real images (max absolute
logit difference within ``atol``; batches of 1 and 3 prove the batch axis dynamic)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.errors import ExportError, VerificationDataError
from export.validation_data import VerifyImages, load_inputs
from models.checkpoint import ModelMeta
from models.runtimes.onnxruntime_backend import OnnxRuntimeBackend

DYNAMIC_BATCH_SIZES = (1, 3)


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_parity` (all numbers are over the images actually decoded)."""

    source: str
    images_used: int
    images_skipped: list[str]  # "path: reason"
    max_abs_diff: float
    mean_abs_diff: float
    atol: float
    batch_sizes_checked: list[int]
    passed: bool
    seconds: float
    per_batch_size_max_diff: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (for the sidecar)."""
        return asdict(self)


def ort_cpu_runtime(path: str | Path) -> OnnxRuntimeBackend:
    """The serving layer's ONNX Runtime backend on ``CPUExecutionProvider`` (``ExportError`` if unavailable)."""
    try:
        return OnnxRuntimeBackend.load(path, providers=("CPUExecutionProvider",))
    except (ModuleNotFoundError, ValueError) as exc:
        raise ExportError(str(exc)) from exc


def _torch_logits(model: torch.nn.Module, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            outs.append(model(torch.from_numpy(inputs[start : start + batch_size])).float().numpy())
    return np.concatenate(outs)


def _ort_logits(runtime: OnnxRuntimeBackend, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        logits = runtime.predict_logits(batch)
        if logits.shape[0] != batch.shape[0]:
            raise ExportError(f"ONNX Runtime returned {logits.shape[0]} rows for a batch of {batch.shape[0]}")
        outs.append(np.asarray(logits, dtype=np.float32))
    return np.concatenate(outs)


def verify_parity(onnx_path: str | Path, model: torch.nn.Module, images: VerifyImages, meta: ModelMeta,
                  atol: float = 1e-4, batch_size: int = 16) -> VerifyResult:
    """Compare ONNX Runtime's (CPU) and eval-mode PyTorch's logits on ``images``; returns a :class:`VerifyResult`.
    Raises ``VerificationDataError`` (no image decoded) or ``ExportError`` (ORT failed)."""
    start = time.perf_counter()
    inputs, skipped = load_inputs(images.paths, meta)
    if len(inputs) == 0:
        raise VerificationDataError(
            f"none of the {len(images.paths)} images from {images.source} could be read "
            f"(first: {skipped[0] if skipped else '-'}); pass --images FOLDER with readable images")
    model = model.eval()
    try:
        session = ort_cpu_runtime(onnx_path)
        ort_out = _ort_logits(session, inputs, batch_size)
        ref = _torch_logits(model, inputs, batch_size)
        per_size: dict[str, float] = {}
        if ort_out.shape != ref.shape:
            raise ExportError(f"output shape mismatch: ONNX Runtime {ort_out.shape} vs PyTorch {ref.shape}")
        diff = np.abs(ort_out.astype(np.float64) - ref.astype(np.float64))
        per_size[str(min(batch_size, len(inputs)))] = float(diff.max())
        max_diff = float(diff.max())
        for size in DYNAMIC_BATCH_SIZES:
            idx = np.arange(size) % len(inputs)  # repeat images when fewer than `size` are available
            small = _ort_logits(session, inputs[idx], size)
            if small.shape != (size, ref.shape[1]):
                raise ExportError(f"batch of {size}: ONNX Runtime returned shape {small.shape}")
            d = float(np.abs(small.astype(np.float64) - ref[idx].astype(np.float64)).max())
            per_size[str(size)] = d
            max_diff = max(max_diff, d)
    except ExportError:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ExportError(f"running the exported model failed ({type(exc).__name__}: {exc})") from exc
    passed = bool(np.isfinite(max_diff) and max_diff <= atol)
    return VerifyResult(source=images.source, images_used=len(inputs), images_skipped=skipped, max_abs_diff=max_diff,
                        mean_abs_diff=float(diff.mean()), atol=float(atol),
                        batch_sizes_checked=sorted({min(batch_size, len(inputs)), *DYNAMIC_BATCH_SIZES}),
                        passed=passed, seconds=time.perf_counter() - start, per_batch_size_max_diff=per_size)
