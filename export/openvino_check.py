"""OpenVINO at export (``--openvino``): each CPU file (FP32, INT8) run by OpenVINO in float32 and, where the CPU has
bfloat16 units, bfloat16, through a gate against the FP32 reference like the precisions', timed beside ONNX Runtime.
A runtime that passes and is :data:`PICK_MARGIN` times as fast goes into the file's ``runtime_pick``, which serve uses
by default on a CPU of the same model; a failed check never fails the export (docs/export.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from export.converted_vs_fp32 import OpenVinoModel, PrecisionReport, check_precision, compare_outputs
from export.errors import PrecisionError
from export.precisions import DEFAULT_INT8_MIN_AGREEMENT, PrecisionBounds
from models.runtimes.devices import cpu_name
from models.runtimes.openvino_backend import OpenVinoBackend, OpenVinoBf16Backend, cpu_has_bf16

#: How much faster than ONNX Runtime a checked runtime must be to become the file's default (timings on a busy CPU
#: vary by several percent).
PICK_MARGIN = 1.10
#: OpenVINO in float32 runs the same graph as ONNX Runtime: parity, as the FP32 export's against PyTorch.
FP32_PARITY = PrecisionBounds(max_prob_diff=1e-4, min_agreement=None, max_map_drop=None)
#: bfloat16 keeps 8 bits of mantissa: decisions may change near the thresholds, bounded like INT8's.
BF16_BOUNDS = PrecisionBounds(max_prob_diff=None, min_agreement=DEFAULT_INT8_MIN_AGREEMENT)


@dataclass
class RuntimeCheck:
    """One file run by one OpenVINO backend: its gate against FP32 and its throughput."""

    backend: str
    report: PrecisionReport | None = None
    images_per_s: float | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        """True when the gate ran and no bound broke."""
        return self.report is not None and self.report.passed


def backends_for(precision: str, bounds: PrecisionBounds | None) -> list[tuple[type[OpenVinoBackend], PrecisionBounds]]:
    """The OpenVINO backends a ``precision`` file is checked with and their bounds (``bounds``: the INT8 file's)."""
    if precision == "int8":
        return [(OpenVinoBackend, bounds or PrecisionBounds.for_precision("int8"))]
    return [(OpenVinoBackend, FP32_PARITY), (OpenVinoBf16Backend, BF16_BOUNDS)] if precision == "fp32" else []


def check_file(path: Path, precision: str, ref_logits: np.ndarray, thresholds: np.ndarray, inputs: np.ndarray,
               labels: np.ndarray, bounds: PrecisionBounds | None, timing: Callable[[OpenVinoModel], float]
               ) -> list[RuntimeCheck]:
    """Run ``path`` (a ``precision`` file) with each OpenVINO backend on the validation ``inputs`` against the FP32
    ``ref_logits`` at FP32's ``thresholds``; ``timing`` measures a passing model's images per second."""
    checks = []
    for backend, limits in backends_for(precision, bounds):
        check = RuntimeCheck(backend.name)
        checks.append(check)
        if backend.precision == "bf16" and not cpu_has_bf16():
            check.note = f"not checked: this CPU ({cpu_name()}) has no bfloat16 units"
            continue
        try:
            model = OpenVinoModel(path, backend)
        except ValueError as exc:
            check.note = f"not checked: {exc}"
            continue
        check.report = PrecisionReport(reference="fp32 (onnxruntime)", candidate=f"{path.name} ({backend.name})",
                                       precision=f"{precision} on {backend.name}", thresholds_source="fp32",
                                       **compare_outputs(ref_logits, model.logits(inputs), thresholds, labels))
        try:
            check_precision(check.report, limits)
        except PrecisionError as exc:
            check.note = f"failed its gate ({'; '.join(exc.failures)}): not used by default"
            continue
        check.images_per_s = timing(model)
    return checks


def pick(ort_images_per_s: float | None, checks: list[RuntimeCheck]) -> dict[str, Any]:
    """The ``runtime_pick`` record of a file: the fastest passing check when it is at least :data:`PICK_MARGIN` times
    ONNX Runtime's rate; ``{}`` (ONNX Runtime) otherwise."""
    timed = [c for c in checks if c.passed and c.images_per_s]
    best = max(timed, key=lambda c: c.images_per_s or 0.0, default=None)
    if best is None or not ort_images_per_s or (best.images_per_s or 0.0) < PICK_MARGIN * ort_images_per_s:
        return {}
    rates = {"onnxruntime": round(ort_images_per_s, 1), **{c.backend: round(c.images_per_s or 0.0, 1) for c in timed}}
    return {"backend": best.backend, "cpu": cpu_name(), "images_per_s": rates}
