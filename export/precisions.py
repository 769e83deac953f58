"""The export precisions, one registry (:data:`PRECISIONS`), a row per ``--precision``: the artifacts made from the FP32
export, in order, their bounds and the artifact a TensorRT engine is built from. Light (no heavy imports)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.registry import Row, Table

if TYPE_CHECKING:
    import numpy as np

    from export.quantize import ConversionResult

DEFAULT_MAX_PROB_DIFF = 5e-3
DEFAULT_MIN_AGREEMENT = 0.995
DEFAULT_MAX_MAP_DROP = 0.5
DEFAULT_INT8_MIN_AGREEMENT = 0.99


@dataclass(frozen=True)
class PrecisionBounds:
    """Acceptance bounds of a converted model against its FP32 reference; ``None`` disables a bound."""

    max_prob_diff: float | None = DEFAULT_MAX_PROB_DIFF
    min_agreement: float | None = DEFAULT_MIN_AGREEMENT
    max_map_drop: float | None = DEFAULT_MAX_MAP_DROP  # mAP points; only checked when labels are given

    @classmethod
    def for_precision(cls, precision: str) -> PrecisionBounds:
        """The bounds of ``precision``'s row of :data:`PRECISIONS` (the FP16 ones for a name it does not hold)."""
        return PRECISIONS[precision].bounds if precision in PRECISIONS else cls()


@dataclass
class ConversionInputs:
    """What a conversion may need besides the FP32 file: progress output, calibration images (read once), the INT8
    options and ``distilled`` (None, or the function giving the QAT-distilled FP32 file to quantize instead)."""

    say: Callable[[str], None]
    calibration_images: Callable[[], np.ndarray]
    int8_method: str | None = None
    int8_report: bool = False
    int8_keep_float: str | None = None
    distilled: Callable[[str], tuple[Path, dict[str, Any]]] | None = None


@dataclass(frozen=True)
class Conversion:
    """One artifact made from the FP32 export: its name, runtime, ``make(fp32 path, inputs)``, ``engines_only``."""

    artifact: str
    runtime: str
    make: Callable[[Path, ConversionInputs], ConversionResult]
    engines_only: bool = False


@dataclass(frozen=True)
class Precision:
    """A ``--precision``: its ``conversions``, the ``bounds`` they are checked against, and ``engine_source``."""

    name: str
    conversions: tuple[Conversion, ...]
    bounds: PrecisionBounds
    engine_source: str


def _fp16(fp32: Path, inputs: ConversionInputs) -> ConversionResult:
    """FP16 weights and compute, float32 input and output (:func:`export.quantize.convert_fp16`)."""
    from export.quantize import convert_fp16, default_output

    inputs.say("converting to FP16 ...")
    return convert_fp16(fp32, default_output(fp32, "fp16"))


def _int8(target: str) -> Callable[[Path, ConversionInputs], ConversionResult]:
    """The INT8 conversion for ``target`` (``cpu``, ``tensorrt``): :func:`export.quantize.quantize_int8`."""

    def make(fp32: Path, inputs: ConversionInputs) -> ConversionResult:
        """Quantize ``fp32`` for ``target`` on the calibration images, beside it."""
        from export import int8_sensitivity as sens
        from export.quantize import DEFAULT_CALIBRATION_METHOD, default_output, quantize_int8

        source, qat = inputs.distilled(target) if inputs.distilled is not None else (fp32, None)
        record = {"qat": qat} if qat is not None else None
        images = inputs.calibration_images()
        method = inputs.int8_method or DEFAULT_CALIBRATION_METHOD
        weights = ", the distilled weights" if qat is not None else ""
        inputs.say(f"quantizing to INT8 for {target} ({len(images)} calibration images, {method} ranges{weights}) ...")
        dst = default_output(fp32, "int8", target)
        keep = sens.parse_keep_float(inputs.int8_keep_float)
        if keep is not None and keep.worst is not None:
            inputs.say(f"  ranking the nodes by the noise each adds, then quantizing again with the {keep.worst} "
                       "worst in float ...")
            result, _ = sens.quantize_keeping_worst(source, dst, images, keep.worst, target=target, method=method,
                                                    record=record)
        else:
            result = quantize_int8(source, dst, images, target=target, method=method,  # type: ignore[arg-type]
                                   keep_float=keep.names if keep else (), keep_float_spec=keep.spec if keep else None,
                                   record=record)
        if keep is not None:
            inputs.say(f"  kept in float ({keep.spec}): {', '.join(result.quantization['keep_float']['nodes'])}")
        if inputs.int8_report:
            rows = sens.sensitivity_report(source, result.path, images)
            name = "int8-sensitivity.csv" if target == "cpu" else f"int8-sensitivity-{target}.csv"
            csv_path = sens.write_csv(rows, result.path.with_name(name))
            inputs.say(f"  INT8 sensitivity of {result.path.name} ({min(len(images), sens.DEFAULT_REPORT_IMAGES)} "
                       f"calibration images; SQNR against FP32, worst first; all {len(rows)} nodes in {csv_path}):")
            inputs.say(sens.format_report(rows, sens.DEFAULT_REPORT_ROWS))
        return result

    return make


PRECISIONS: Table[Precision] = Table("precision", [
    Row("fp32", "the reference export (always made)", Precision("fp32", (), PrecisionBounds(), engine_source="fp32")),
    Row("fp16", "FP16 weights and compute, checked against FP32 (for GPUs)",
        Precision("fp16", (Conversion("fp16", "onnxruntime", _fp16),), PrecisionBounds(), engine_source="fp16")),
    Row("int8", "INT8 calibrated on training images, checked against FP32 (ONNX Runtime CPU, TensorRT)", Precision(
        "int8",
        (Conversion("int8-cpu", "onnxruntime", _int8("cpu")),
         Conversion("int8-tensorrt", "tensorrt", _int8("tensorrt"), engines_only=True)),
        PrecisionBounds(max_prob_diff=None, min_agreement=DEFAULT_INT8_MIN_AGREEMENT),
        engine_source="int8-tensorrt",
    )),
])


def parse_precisions(text: str) -> list[str]:
    """``"fp32,int8"`` -> ``["fp32", "int8"]`` in :data:`PRECISIONS` order (fp32 first); else ``ValueError``."""
    wanted = {p.strip().lower() for p in text.split(",") if p.strip()}
    if not wanted:
        raise ValueError(f"--precision takes a comma-separated list of {', '.join(PRECISIONS)}; got {text!r}")
    for name in wanted:
        PRECISIONS.row(name)  # an unknown precision: the one message listing them
    return [p for p in PRECISIONS if p in wanted or p == "fp32"]
