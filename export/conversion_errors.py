"""The errors of the FP16 / INT8 conversions (:mod:`export.quantize`), each with a one-line message."""

from __future__ import annotations

from export.verify import ExportError


class ConversionError(ExportError):
    """An FP16 / INT8 conversion failed; the message is one readable line."""


class NotFP32Error(ConversionError):
    """The input model is not a canonical FP32 export (already converted, FP16 weights, Q/DQ nodes...)."""


class CalibrationDataError(ConversionError):
    """The calibration batches are missing, empty, or of the wrong shape / dtype."""
