"""Export trained checkpoints to verified, self-describing ONNX files (``python -m export``). The public API, imported
lazily (``--help`` loads no torch): :func:`export_onnx`, :func:`export_run`, :func:`export_to_file`, ``convert_fp16``,
:func:`quantize_int8`, :func:`calibrate`, the metadata readers, :class:`ExportError`; imports ``models`` only."""

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
    "quantize_int8": "export.quantize", "calibrate": "export.threshold_calibration"}

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
    "read_sidecar", "sidecar_path"]
