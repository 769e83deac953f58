"""Check a converted (FP16 / INT8) ONNX model against its FP32 reference on the same inputs: probability differences,
identical decisions and, with labels, the mAP drop; :func:`check_precision` raises on a broken bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError, PrecisionError
from export.precisions import PrecisionBounds
from models.evaluation.metrics import mean_average_precision
from models.logits import sigmoid
from models.runtimes.openvino_backend import OpenVinoBackend


@dataclass
class PrecisionReport:
    """A converted model against FP32: :func:`compare_outputs`'s figures (mAP fields None without labels)."""

    reference: str
    candidate: str
    precision: str
    images: int
    classes: int
    max_prob_diff: float
    mean_prob_diff: float
    max_logit_diff: float
    decision_agreement: float  # fraction of (image, class) decisions that are identical
    decisions_changed: int
    image_agreement: float  # fraction of images whose whole tag set is identical
    thresholds_source: str
    map_reference: float | None = None
    map_candidate: float | None = None
    map_drop: float | None = None  # reference - candidate, in mAP points
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when :func:`check_precision` found no broken bound (or was not run)."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (for a sidecar)."""
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        """One human-readable line."""
        text = (
            f"{self.precision} vs fp32 on {self.images} images: max |dprob| {self.max_prob_diff:.3g}, "
            f"decisions identical {100 * self.decision_agreement:.2f}% ({self.decisions_changed} changed, "
            f"thresholds: {self.thresholds_source})")
        if self.map_drop is not None:
            text += f", mAP {self.map_reference:.2f} -> {self.map_candidate:.2f} (drop {self.map_drop:+.2f})"
        return text


class CpuModel:
    """An ONNX file open in a CPU runtime: logits and throughput (ONNX Runtime here; :class:`OpenVinoModel`)."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        self.run: Callable[[np.ndarray], np.ndarray] = lambda batch: session.run(None, {name: batch})[0]

    def logits(self, inputs: np.ndarray, batch_size: int = 32) -> np.ndarray:
        """float32 logits ``(N, C)`` of ``inputs``."""
        outs = [self.run(inputs[s:s + batch_size]) for s in range(0, len(inputs), batch_size)]
        return np.concatenate(outs).astype(np.float32, copy=False)

    def images_per_second(self, inputs: np.ndarray, batch_size: int = 32, seconds: float = 2.0) -> float:
        """Images/s over repeated batches of ``batch_size`` (one warm-up run first)."""
        batch = np.ascontiguousarray(inputs[np.arange(batch_size) % len(inputs)])
        self.run(batch)
        done, start = 0, time.perf_counter()
        while done == 0 or time.perf_counter() - start < seconds:
            self.run(batch)
            done += batch_size
        return done / (time.perf_counter() - start)


class OpenVinoModel(CpuModel):
    """An ONNX file compiled by OpenVINO for the CPU through ``backend`` (a class of
    :mod:`models.runtimes.openvino_backend`, which sets the precision)."""

    def __init__(self, path: str | Path, backend: type[OpenVinoBackend]) -> None:
        self.run = backend.load(path).predict_logits


def compare_outputs(reference_logits: np.ndarray, candidate_logits: np.ndarray, thresholds: np.ndarray,
                    labels: np.ndarray | None = None) -> dict[str, Any]:
    """Metrics of :class:`PrecisionReport` from two logit arrays ``(N, C)`` (and optional 0/1 labels)."""
    ref = np.asarray(reference_logits, dtype=np.float64)
    cand = np.asarray(candidate_logits, dtype=np.float64)
    if ref.shape != cand.shape or ref.ndim != 2 or len(ref) == 0:
        raise ExportError(f"cannot compare outputs of shapes {ref.shape} and {cand.shape}")
    if not np.isfinite(cand).all():
        raise PrecisionError("the converted model produced NaN or infinite logits")
    p_ref, p_cand = sigmoid(ref), sigmoid(cand)
    d_ref, d_cand = p_ref >= thresholds, p_cand >= thresholds
    same = d_ref == d_cand
    out: dict[str, Any] = {
        "images": int(ref.shape[0]),
        "classes": int(ref.shape[1]),
        "max_prob_diff": float(np.abs(p_ref - p_cand).max()),
        "mean_prob_diff": float(np.abs(p_ref - p_cand).mean()),
        "max_logit_diff": float(np.abs(ref - cand).max()),
        "decision_agreement": float(same.mean()),
        "decisions_changed": int((~same).sum()), "image_agreement": float(same.all(axis=1).mean())}
    if labels is not None:
        labels = np.asarray(labels)
        if labels.shape != ref.shape:
            raise ExportError(f"labels have shape {labels.shape}, expected {ref.shape}")
        m_ref = mean_average_precision(ref, labels)
        m_cand = mean_average_precision(cand, labels)
        out.update(map_reference=m_ref, map_candidate=m_cand, map_drop=m_ref - m_cand)
    return out


def check_precision(report: PrecisionReport, bounds: PrecisionBounds | None = None) -> PrecisionReport:
    """Fill ``report.failures`` from ``bounds`` (default: the report's precision's); raises :class:`PrecisionError`
    listing every broken bound, else returns the report."""
    bounds = bounds or PrecisionBounds.for_precision(report.precision)
    failures = []
    if bounds.max_prob_diff is not None and not report.max_prob_diff <= bounds.max_prob_diff:
        failures.append(f"max |probability difference| {report.max_prob_diff:.3g} > {bounds.max_prob_diff:g}")
    if bounds.min_agreement is not None and not report.decision_agreement >= bounds.min_agreement:
        failures.append(
            f"identical decisions {100 * report.decision_agreement:.2f}% < {100 * bounds.min_agreement:.2f}% "
            f"({report.decisions_changed} of {report.images * report.classes} changed)")
    if bounds.max_map_drop is not None and report.map_drop is not None and not report.map_drop <= bounds.max_map_drop:
        failures.append(
            f"mAP drop {report.map_drop:.2f} points ({report.map_reference:.2f} -> {report.map_candidate:.2f}) "
            f"> {bounds.max_map_drop:g}")
    report.failures = failures
    if failures:
        raise PrecisionError(
            f"{report.precision} model {report.candidate} fails against {report.reference} on {report.images} "
            f"images: " + "; ".join(failures), failures)
    return report
