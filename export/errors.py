"""Every error of ``python -m export``: one readable line each; the command exits 1 on any of them."""

from __future__ import annotations


class ExportError(RuntimeError):
    """The export or its verification failed; the message is one readable line."""


class VerificationDataError(ExportError):
    """No images to verify on (dataset unavailable and no folder given)."""


class ParityError(ExportError):
    """ONNX Runtime and PyTorch disagree by more than the tolerance."""


class ConversionError(ExportError):
    """An FP16 / INT8 conversion failed; the message is one readable line."""


class NotFP32Error(ConversionError):
    """The input model is not a canonical FP32 export (already converted, FP16 weights, Q/DQ nodes...)."""


class CalibrationDataError(ConversionError):
    """The INT8 calibration batches are missing, empty, or of the wrong shape / dtype."""


class PrecisionError(ExportError):
    """A converted model broke a precision bound against its FP32 reference; ``failures`` lists the bounds."""

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        super().__init__(message)
        self.failures = list(failures or [])


class KeepFloatError(ConversionError):
    """``--int8-keep-float`` names an unknown node or more nodes than were quantized: a usage error (exit 2)."""
