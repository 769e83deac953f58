"""Export trained checkpoints to verified, self-describing ONNX files (``python -m export``).

Public API (imported lazily, so ``python -m export --help`` and usage errors do not load torch):

- :func:`export_onnx` (checkpoint -> ``model.onnx`` + ``model.json``, parity-checked against PyTorch)
  returning an :class:`ExportResult`;
- :func:`read_onnx_meta` (the :class:`~models.checkpoint.ModelMeta` stored in an exported file),
  :func:`read_sidecar`, :func:`sidecar_path`;
- errors: :class:`ExportError` > :class:`VerificationDataError`, :class:`ParityError`;
- the pipeline of ``python -m export`` (:func:`export_run`: every precision, thresholds, card) and its steps on
  files: :func:`export_to_file` (an in-memory network -> ONNX), :func:`convert_fp16`, :func:`quantize_int8`;
  :func:`calibrate` (per-class thresholds from validation scores, the rules of ``--calibrate``).

Layering: ``export`` imports ``models`` only (never ``train`` or ``serve``, nor the dataset builders of
``models.sources``); the stages are peers (tests/test_layering.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from export.defaults import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET
from models.registry import lazy_exports

_LAZY = {
    "META_KEY": "models.onnx_metadata",
    "read_onnx_meta": "export.onnx_files",
    "read_sidecar": "export.onnx_files",
    "sidecar_path": "export.onnx_files",
    "ExportResult": "export.onnx_export",
    "export_onnx": "export.onnx_export",
    "ExportError": "export.errors",
    "ParityError": "export.errors",
    "VerificationDataError": "export.errors",
    "VerifyResult": "export.onnx_vs_pytorch",
    "export_to_file": "export.onnx_export",
    "export_run": "export.pipeline",
    "convert_fp16": "export.quantize",
    "quantize_int8": "export.quantize",
    "calibrate": "export.threshold_calibration",
}

if TYPE_CHECKING:
    from export.errors import ExportError, ParityError, VerificationDataError
    from export.onnx_export import ExportResult, export_onnx
    from export.onnx_files import read_onnx_meta, read_sidecar, sidecar_path
    from export.onnx_vs_pytorch import VerifyResult
    from models.onnx_metadata import META_KEY


__getattr__ = lazy_exports("export", _LAZY)


__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_OPSET",
    "DEFAULT_VERIFY_IMAGES",
    "MAX_OPSET",
    "META_KEY",
    "MIN_OPSET",
    "ExportError",
    "ExportResult",
    "ParityError",
    "VerificationDataError",
    "VerifyResult",
    "calibrate",
    "convert_fp16",
    "export_onnx",
    "export_run",
    "export_to_file",
    "quantize_int8",
    "read_onnx_meta",
    "read_sidecar",
    "sidecar_path",
]
