"""The whole export of a run (:func:`export_run`): FP32 ONNX, FP16 / INT8 ONNX, TensorRT engines, each with thresholds
calibrated on its own validation scores, the summary and the model card (docs/export.md). A converted model that breaks
a bound against FP32 fails the export."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from tqdm import tqdm

from export.converted_vs_fp32 import CpuModel, PrecisionReport, check_precision, compare_outputs
from export.errors import ExportError, PrecisionError, VerificationDataError
from export.model_card import CardFile, write_model_card
from export.onnx_export import ExportResult, export_onnx
from export.onnx_files import file_sha256, onnx_meta, read_sidecar, set_onnx_meta, sidecar_document, sidecar_path
from export.options import ExportOptions
from export.precisions import PRECISIONS, Conversion, ConversionInputs, PrecisionBounds
from export.threshold_calibration import (
    CalibrationMode,
    calibrate,
    calibration_report,
    default_mode,
    parse_mode,
    plot_pr_curves,
    write_report,
)
from export.validation_data import load_inputs, rebuild_splits, split_notes
from models.checkpoint import ModelMeta
from models.data.audit_list import AuditList, load_audit
from models.data.label_regime import NOT_AVAILABLE, LabelRegime, detect_regime
from models.data.protocol import ProtocolSplits
from models.evaluation.expected_positives import CHOOSER_K, ExpectedPositives, estimate_k
from models.evaluation.metrics import per_class_ap
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.logits import sigmoid

if TYPE_CHECKING:
    from export.int8_qat import DistilledExports
    from export.quantize import ConversionResult

THROUGHPUT_BATCH = 32
THROUGHPUT_SECONDS = 2.0


@dataclass
class Artifact:
    """One exported file and what was measured on it."""

    name: str  # "fp32", "fp16", "int8-cpu", "int8-tensorrt", "engine-fp16", ...
    path: Path
    precision: str
    runtime: str  # what it is made for or run with: "onnxruntime", "tensorrt", "openvino", "openvino-bf16"
    size_bytes: int
    val_mAP: float | None = None
    agreement: float | None = None  # identical thresholded decisions vs FP32, at FP32's thresholds
    max_prob_diff: float | None = None
    images_per_s: float | None = None  # its runtime on the CPU at batch THROUGHPUT_BATCH; None for engines
    thresholds: list[float] | None = None
    calibration: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        out = dataclasses.asdict(self)
        out["path"] = str(self.path)
        return out


@dataclass
class ValData:
    """Preprocessed validation images with their labels and the regime of those labels."""

    inputs: np.ndarray
    labels: np.ndarray
    source: str
    regime: LabelRegime

    @property
    def fully_labelled(self) -> bool:
        """Whether the labels are complete (F1 can be measured on them)."""
        return self.regime.full

    @property
    def labels_name(self) -> str:
        """``full val labels`` or ``single-positive val labels`` (what a figure was measured against)."""
        return f"{self.regime.kind} val labels"


@dataclass
class AuditData:
    """The audit list (fully labelled images the user provides), preprocessed."""

    audit: AuditList
    inputs: np.ndarray
    labels: np.ndarray

    @property
    def name(self) -> str:
        return f"the audit list ({len(self.labels)} images)"


@dataclass
class RunExport:
    """Everything :func:`export_run` wrote."""

    folder: Path
    fp32: ExportResult
    artifacts: list[Artifact] = field(default_factory=list)
    summary_path: Path | None = None
    val_labels: str = ""  # what the val mAP column was measured against
    runtime_notes: list[str] = field(default_factory=list)  # the model card's: a faster CPU runtime picked

    def table(self) -> str:
        """The summary table as markdown."""
        against = f" ({self.val_labels})" if self.val_labels else ""
        rows = [f"| artifact | file | size (MB) | val mAP{against} | decisions = FP32 | max |dprob| | "
                "img/s (this CPU) | note |", "|---|---|---|---|---|---|---|---|"]
        for a in self.artifacts:
            rows.append(
                f"| {a.name} | {a.path.name} | {a.size_bytes / 1e6:.1f} | {_fmt(a.val_mAP, '.2f')} | "
                f"{_fmt(None if a.agreement is None else 100 * a.agreement, '.2f', '%')} | "
                f"{_fmt(a.max_prob_diff, '.2g')} | {_fmt(a.images_per_s, '.0f')} | {a.note} |")
        return "\n".join(rows)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def load_val_data(meta: ModelMeta, splits: ProtocolSplits, limit: int | None, log: Callable[[str], None],
                  progress: bool) -> ValData:
    """The model's validation split, preprocessed (at most ``limit`` images), with its labels."""
    paths, labels = list(splits.val.paths), np.asarray(splits.val.labels)
    if limit is not None:
        paths, labels = paths[:limit], labels[:limit]
    if not paths:
        raise VerificationDataError("the validation split is empty: nothing to calibrate thresholds on")
    if list(splits.classes) != list(meta.classes):
        raise VerificationDataError(f"the rebuilt dataset's classes differ from the model's{split_notes(meta, splits)}")
    log(f"reading {len(paths)} validation images ...")
    inputs, keep = _load(paths, meta, progress)
    # single-positive val labels (no image with two positives) cannot give F1: positive-only calibration then
    return ValData(inputs, labels[keep], f"val split of {meta.data.get('source')} ({len(keep)} images)",
                   detect_regime(labels[keep], "val", complete=splits.has_full_labels("val")))


def load_audit_data(spec: str, meta: ModelMeta, log: Callable[[str], None], progress: bool) -> AuditData:
    """The audit list ``spec`` preprocessed for ``meta``'s model (``DataError`` for a bad list)."""
    audit = load_audit(spec, list(meta.classes))
    log(f"reading {len(audit)} audit images ({spec}) ...")
    inputs, keep = _load(audit.paths, meta, progress)
    return AuditData(audit, inputs, audit.labels[keep])


def expected_tags(val: ValData, val_logits: np.ndarray, audit: AuditData | None = None,
                  meta: ModelMeta | None = None) -> ExpectedPositives:
    """K, the expected tags per image for ``rate`` / ``pu-f1``: the audit list's mean, else the run's known k, else
    ``--method auto``'s estimate, else :func:`models.evaluation.expected_positives.estimate_k` on the validation
    scores."""
    if audit is not None:
        return ExpectedPositives(float(audit.labels.sum(1).mean()), "audit", f"{len(audit.labels)} audited images")
    data = meta.data if meta is not None else {}
    for record in (data.get("expected_positives"), data.get("k_estimate")):
        if record and (record.get("source") != "estimated" or record.get("detail", "").startswith(CHOOSER_K)):
            return ExpectedPositives.from_dict(record)
    estimate = estimate_k(val_logits, val.labels)
    return ExpectedPositives(estimate.k, "estimated", f"from the scores of the {val.labels_name}", estimate)


def load_train_sample(meta: ModelMeta, splits: ProtocolSplits, count: int, seed: int, progress: bool) -> np.ndarray:
    """``count`` preprocessed training images of ``splits`` drawn at random (seeded): INT8 calibration data."""
    paths = list(splits.train.paths)
    if not paths:
        raise VerificationDataError("the training split is empty: no INT8 calibration images")
    order = np.random.default_rng(seed).permutation(len(paths))[:count]
    inputs, _ = _load([paths[i] for i in sorted(order)], meta, progress)
    return inputs


def _load(paths: Sequence[Path], meta: ModelMeta, progress: bool) -> tuple[np.ndarray, list[int]]:
    """Preprocess ``paths`` in chunks (with a progress bar); returns the inputs and the indices that decoded."""
    chunks, keep = [], []
    bar = tqdm(total=len(paths), desc="images", unit="img", disable=not progress, leave=False, file=sys.stderr)
    for start in range(0, len(paths), 256):
        part = list(paths[start:start + 256])
        arr, skipped = load_inputs(part, meta)
        bad = {s.split(": ", 1)[0] for s in skipped}
        keep += [start + i for i, p in enumerate(part) if str(p) not in bad]
        chunks.append(arr)
        bar.update(len(part))
    bar.close()
    inputs = np.concatenate(chunks) if chunks else np.zeros((0, 3, meta.image_size, meta.image_size), np.float32)
    if len(inputs) == 0:
        raise VerificationDataError("none of the validation images could be read")
    return inputs, keep


def write_meta(path: Path, changes: dict[str, Any], sidecar_update: dict[str, Any] | None = None) -> ModelMeta:
    """Change fields of the ONNX file's ``spml_meta`` (rewritten atomically) and refresh its sidecar; the new meta."""
    model = onnx.load(str(path))
    meta = dataclasses.replace(onnx_meta(model, path), **changes)
    set_onnx_meta(model, meta)
    with atomic_path(path, suffix=".onnx") as tmp:
        onnx.save(model, str(tmp))
    side = sidecar_path(path)
    doc = read_sidecar(side) if side.is_file() else {}
    doc.update({"sha256": file_sha256(path), "size_bytes": path.stat().st_size, "meta": dataclasses.asdict(meta)})
    doc.update(sidecar_update or {})
    atomic_write_text(side, json.dumps(doc, indent=2) + "\n")
    return meta


def _calibrate_artifact(artifact: Artifact, logits: np.ndarray, val: ValData, mode_text: str, classes: list[str],
                        folder: Path, log: Callable[[str], None], k: ExpectedPositives | None = None,
                        audit: AuditData | None = None, audit_logits: np.ndarray | None = None) -> ModelMeta:
    """Calibrate ``artifact``'s thresholds on its own validation scores; write them, a report and a plot."""
    probs = sigmoid(logits)
    mode = parse_mode(mode_text if mode_text != "auto" else default_mode(val.fully_labelled))
    cal = calibrate(probs, val.labels, mode, expected_positives=k.k if k is not None else None)
    report = calibration_report(probs, val.labels, cal.thresholds, classes, mode=cal.mode, rules=cal.rules,
                                labels_name=val.labels_name)
    stem = f"calibration-{artifact.name}"
    write_report(report, folder / f"{stem}.md", folder / f"{stem}.json")
    plotted = plot_pr_curves(probs, val.labels, cal.thresholds, classes, folder / f"{stem}.png")
    info = {**cal.to_dict(), "data": val.source, "labels": val.labels_name, "report": f"{stem}.md",
            "plot": f"{stem}.png" if plotted else None}
    if mode.kind in ("pu-f1", "rate") and mode.value is None and k is not None:
        info["expected_positives"] = k.to_dict()
    figures: dict[str, Any] | None = report["overall"] if val.fully_labelled else None
    against = val.labels_name
    if figures is None and audit is not None and audit_logits is not None:
        audit_report = calibration_report(sigmoid(audit_logits), audit.labels, cal.thresholds, classes,
                                          mode=cal.mode, rules=cal.rules, labels_name=audit.name)
        write_report(audit_report, folder / f"{stem}-audit.md", folder / f"{stem}-audit.json")
        info["audit_report"] = f"{stem}-audit.md"
        figures, against = audit_report["overall"], audit.name
    meta = write_meta(artifact.path, {"thresholds": [float(t) for t in cal.thresholds], "calibration": info})
    artifact.thresholds, artifact.calibration = meta.thresholds, cal.mode
    line = f"  {artifact.name}: thresholds by {cal.mode} on {val.source} ({val.labels_name}); "
    if figures is None:
        line += f"F1 {NOT_AVAILABLE}"
    else:
        base, summ = figures["at_0.5"], figures["calibrated"]
        line += (f"OF1 {base['OF1']:.2f} / CF1 {base['CF1']:.2f} at 0.5 -> {summ['OF1']:.2f} / {summ['CF1']:.2f} "
                 f"calibrated, against {against}")
    log(f"{line} (report {stem}.md)")
    return meta


def export_run(checkpoint: str | Path, output: str | Path | None = None, *,
               log: Callable[[str], None] | None = None, **options: Any) -> RunExport:
    """Export a checkpoint to every requested artifact; ``options`` as :class:`~export.options.ExportOptions` by name.
    Raises ``ExportError`` (or a subclass), or ``UsageError`` on a bad option."""
    opts = ExportOptions(**options)
    precisions, calibrate_mode, bounds, audit = opts.precisions, opts.calibrate_mode, opts.bounds, opts.audit
    val_images, progress, seed = opts.val_images, opts.progress, opts.seed
    say = log or (lambda _msg: None)
    fp32 = export_onnx(checkpoint, output, images=opts.images, runs_dir=opts.runs_dir, log=say, opset=opts.opset,
                       verify_images=opts.verify_images, atol=opts.atol)
    say(fp32.summary())
    folder = fp32.onnx_path.parent
    meta = fp32.meta
    result = RunExport(folder=folder, fp32=fp32)

    val: ValData | None = None
    splits: ProtocolSplits | None = None
    needs_val = calibrate_mode != "none" or len(precisions) > 1
    if needs_val:
        try:
            splits = rebuild_splits(meta)  # once: val (calibration, checks) and train (INT8 calibration)
            val = load_val_data(meta, splits, val_images, say, progress)
        except VerificationDataError as exc:
            if len(precisions) > 1:
                raise VerificationDataError(f"FP16/INT8 exports are checked on the labelled validation split: "
                                            f"{exc}") from exc
            say(f"no labelled validation data ({exc}); thresholds not calibrated (0.5 or the checkpoint's)")
    if val is None or splits is None:
        result.artifacts.append(Artifact("fp32", fp32.onnx_path, "fp32", "onnxruntime", fp32.size_bytes,
                                         thresholds=meta.thresholds, note="not calibrated: no labelled val data"))
        _write_summary(result, say)
        _write_card(result, meta, None, "No labelled validation data: thresholds were not calibrated.")
        return result

    result.val_labels = val.labels_name
    say(f"validation labels: {val.regime.describe()}")
    audit_data = load_audit_data(audit, meta, say, progress) if audit is not None else None
    ref = CpuModel(fp32.onnx_path)
    ref_logits = ref.logits(val.inputs)
    k: ExpectedPositives | None = None
    chosen = default_mode(val.fully_labelled) if calibrate_mode == "auto" else calibrate_mode
    if chosen != "none" and parse_mode(chosen) in (CalibrationMode("pu-f1"), CalibrationMode("rate")):  # no K given
        k = expected_tags(val, ref_logits, audit_data, meta)
        say(f"expected tags per image for {chosen}: {k.describe()}")
        if k.caveat():
            say(f"  note: {k.caveat()}")

    def calibrate_on(art: Artifact, model: CpuModel, logits: np.ndarray) -> ModelMeta:
        audit_logits = model.logits(audit_data.inputs) if audit_data is not None else None
        calibrated = _calibrate_artifact(art, logits, val, calibrate_mode, list(meta.classes), folder, say, k,
                                         audit_data, audit_logits)
        art.size_bytes = art.path.stat().st_size
        return calibrated

    fp32_art = Artifact("fp32", fp32.onnx_path, "fp32", "onnxruntime", fp32.size_bytes)
    _measure(fp32_art, ref, ref_logits, None, val)
    card_meta = meta
    if calibrate_mode != "none":
        card_meta = calibrate_on(fp32_art, ref, ref_logits)
    ref_thresholds = np.asarray(fp32_art.thresholds or [0.5] * len(meta.classes))
    result.artifacts.append(fp32_art)
    with_openvino = opts.openvino == "on" or (opts.openvino == "auto" and importlib.util.find_spec("openvino"))

    def check_runtimes(art: Artifact) -> None:
        if with_openvino and art.runtime == "onnxruntime" and art.precision in ("fp32", "int8"):
            rows, chosen = _openvino_rows(art, ref_logits, ref_thresholds, val, (bounds or {}).get("int8"), say)
            result.artifacts += rows
            if chosen:
                name, rates = chosen["backend"], chosen["images_per_s"]
                result.runtime_notes.append(
                    f"`{art.path.name}`: `python -m serve` runs it with {name} by default on a {chosen['cpu']} CPU, "
                    f"where it passed its check against FP32 and ran {rates[name]:.0f} images/s against ONNX "
                    f"Runtime's {rates['onnxruntime']:.0f} (`--backend onnxruntime` to override); elsewhere ONNX "
                    "Runtime.")

    check_runtimes(fp32_art)
    calibration: list[np.ndarray] = []  # the INT8 calibration images, read once when a conversion asks

    def read_calibration() -> np.ndarray:
        if not calibration:
            say(f"reading {opts.calibration_images} training images for INT8 calibration ...")
            calibration.append(load_train_sample(meta, splits, opts.calibration_images, seed, progress))
        return calibration[0]

    inputs = ConversionInputs(say, read_calibration, opts.int8_calibration, opts.int8_report, opts.int8_keep_float)
    distill = _distillation(fp32, splits, opts, say)

    def convert(conversion: Conversion, precision: str,
                with_qat: bool) -> tuple[ConversionResult, PrecisionReport, CpuModel, np.ndarray]:
        conv = conversion.make(fp32.onnx_path,
                               dataclasses.replace(inputs, distilled=distill.onnx if with_qat else None))
        model = CpuModel(conv.path)
        logits = model.logits(val.inputs)
        report = PrecisionReport(reference=str(fp32.onnx_path), candidate=str(conv.path), precision=precision,
                                 thresholds_source="fp32 calibrated" if fp32_art.thresholds else "0.5",
                                 **compare_outputs(ref_logits, logits, ref_thresholds, val.labels))
        try:
            check_precision(report, (bounds or {}).get(precision))
        except ExportError:  # the export fails loudly and leaves no unverified model behind
            conv.path.unlink(missing_ok=True)
            raise
        return conv, report, model, logits

    conversions = [(precision, c) for precision in precisions for c in PRECISIONS[precision].conversions
                   if opts.trt or not c.engines_only]
    try:
        for precision, conversion in conversions:
            int8 = precision == "int8"
            try:
                conv, report, model, logits = convert(conversion, precision, with_qat=int8 and opts.int8_qat == "on")
            except PrecisionError as exc:
                if not (int8 and opts.int8_qat == "auto"):
                    raise
                say(f"  post-training INT8 misses its bounds ({'; '.join(exc.failures)}): quantization-aware "
                    "distillation (--int8-qat auto; off: --int8-qat off) ...")
                conv, report, model, logits = convert(conversion, precision, with_qat=True)
            art = Artifact(conversion.artifact, conv.path, precision, conversion.runtime, conv.size_bytes)
            say(f"  {report.summary()}"
                + (f" (mAP against the {val.labels_name})" if report.map_drop is not None else ""))
            art.agreement, art.max_prob_diff = report.decision_agreement, report.max_prob_diff
            _measure(art, model, logits, report, val)
            notes = [art.note] if art.note else []
            if conv.quantization.get("qat"):
                notes.append(f"quantization-aware distillation ({conv.quantization['qat']['epochs']} epochs)")
            kept = conv.quantization.get("keep_float")
            if kept:
                notes.append(f"kept in float ({kept['spec']}): {', '.join(kept['nodes'])}")
            art.note = "; ".join(notes)
            side = sidecar_document(conv.path, conv.meta, conv.info(), report.to_dict(), sha256=conv.sha256)
            atomic_write_text(sidecar_path(conv.path), json.dumps(side, indent=2) + "\n")
            if calibrate_mode != "none":
                calibrate_on(art, model, logits)
            result.artifacts.append(art)
            check_runtimes(art)
    finally:
        distill.close()

    if opts.trt:
        _build_engines(result, precisions, opts.trt_targets, opts.trt_batch, say)
    _write_summary(result, say)
    _write_card(result, card_meta, per_class_ap(ref_logits, val.labels), _labels_note(val))
    return result


def _distillation(fp32: ExportResult, splits: ProtocolSplits, opts: ExportOptions,
                  say: Callable[[str], None]) -> DistilledExports:
    """The quantization-aware distillation of ``fp32``'s checkpoint, made when an INT8 conversion first asks."""
    from export.int8_qat import DistilledExports

    def read(count: int) -> np.ndarray:
        return load_train_sample(fp32.meta, splits, count, opts.seed, opts.progress)

    def export(checkpoint: Path, onnx_path: Path) -> Path:
        return export_onnx(checkpoint, onnx_path, images=opts.images, opset=opts.opset,
                           verify_images=opts.verify_images, atol=opts.atol).onnx_path

    return DistilledExports(fp32.checkpoint, read, export, fp32.onnx_path.parent,
                            epochs=opts.int8_qat_epochs, progress=opts.progress, say=say)


def _measure(art: Artifact, model: CpuModel, logits: np.ndarray, report: PrecisionReport | None, val: ValData) -> None:
    from models.evaluation.metrics import mean_average_precision

    if report is not None and report.map_candidate is not None:
        art.val_mAP = report.map_candidate
    else:
        art.val_mAP = mean_average_precision(logits, val.labels)
    if art.runtime == "onnxruntime":
        art.images_per_s = model.images_per_second(val.inputs, THROUGHPUT_BATCH, THROUGHPUT_SECONDS)
    else:
        art.note = "made for TensorRT; checked in ONNX Runtime"


def _openvino_rows(art: Artifact, ref_logits: np.ndarray, thresholds: np.ndarray, val: ValData,
                   int8_bounds: PrecisionBounds | None,
                   say: Callable[[str], None]) -> tuple[list[Artifact], dict[str, Any]]:
    """``art``'s file run by each OpenVINO backend (:mod:`export.openvino_check`): one summary row each, and the
    pick (``{}``: none), written into the file's metadata."""
    from export.openvino_check import check_file, pick

    say(f"checking {art.path.name} with OpenVINO ...")
    checks = check_file(art.path, art.precision, ref_logits, thresholds, val.inputs, val.labels, int8_bounds,
                        lambda model: model.images_per_second(val.inputs, THROUGHPUT_BATCH, THROUGHPUT_SECONDS))
    chosen = pick(art.images_per_s, checks)
    if chosen:
        write_meta(art.path, {"runtime_pick": chosen})
        art.size_bytes = art.path.stat().st_size
    rows = []
    for check in checks:
        r = check.report
        note = check.note or ("passed; python -m serve runs this file with it on this CPU model" if chosen.get(
            "backend") == check.backend else "passed; not picked: not 10% faster than onnxruntime")
        say(f"  {check.backend}: " + (f"{r.summary()}; " if r else "") + note)
        rows.append(Artifact(f"{art.name} on {check.backend}", art.path, art.precision, check.backend,
                             art.size_bytes, val_mAP=r.map_candidate if r else None,
                             agreement=r.decision_agreement if r else None,
                             max_prob_diff=r.max_prob_diff if r else None,
                             images_per_s=check.images_per_s, thresholds=art.thresholds,
                             calibration=art.calibration, note=note))
    return rows, chosen


def _build_engines(result: RunExport, precisions: Sequence[str], targets: Sequence[str] | None,
                   batch: tuple[int, int, int], say: Callable[[str], None]) -> None:
    from export.tensorrt_build import build_engine

    sources = {a.name: a for a in result.artifacts}
    for precision in precisions:
        src = sources.get(PRECISIONS[precision].engine_source)
        if src is None:
            continue
        engine_path = src.path.with_name(f"model.{precision}.engine")
        say(f"building a TensorRT engine from {src.path.name} ...")
        built = build_engine(src.path, engine_path, min_batch=batch[0], opt_batch=batch[1], max_batch=batch[2],
                             targets=targets, log=say)
        say(f"  {built.summary()}")
        result.artifacts.append(Artifact(
            f"engine-{precision}", built.engine_path, precision, "tensorrt", built.size_bytes,
            val_mAP=src.val_mAP, agreement=src.agreement, max_prob_diff=src.max_prob_diff,
            thresholds=built.meta.thresholds, calibration=src.calibration,
            note=f"{built.flavour} {built.tensorrt_version}, targets {','.join(built.targets)}; "
                 f"mAP/agreement of its ONNX source"))


def _labels_note(val: ValData) -> str:
    """Which labels the validation figures were measured against."""
    if val.fully_labelled:
        return f"Validation figures are measured against the {val.labels_name} of {val.source}."
    return (f"Validation figures are measured against the {val.labels_name} of {val.source}: most positives are "
            "missing there, so precision, F1 and AP are lower bounds.")


def _write_card(result: RunExport, meta: ModelMeta, ap: np.ndarray | None, labels_note: str) -> None:
    """The export folder's model card (``README.md``) and ``tags.csv``."""
    files = [CardFile(a.path.name, a.precision, a.runtime, a.size_bytes, a.val_mAP) for a in result.artifacts]
    write_model_card(result.folder, meta, files, result.fp32.onnx_path, labels_note, ap, result.runtime_notes)


def _write_summary(result: RunExport, say: Callable[[str], None]) -> None:
    """``summary.md`` + ``summary.json`` in the export folder; the table is also logged."""
    doc = {
        "checkpoint": str(result.fp32.checkpoint),
        "artifacts": [a.to_dict() for a in result.artifacts],
        "thresholds": {a.name: a.thresholds for a in result.artifacts},
        "fp32_parity": result.fp32.verification.to_dict()}
    atomic_write_text(result.folder / "summary.json", json.dumps(doc, indent=2) + "\n")
    table = result.table()
    text = (f"# Export of {result.fp32.checkpoint}\n\nval mAP and decision agreement on the validation split; "
            f"throughput: the row's runtime on the exporting machine's CPU, batch {THROUGHPUT_BATCH}.\n\n{table}\n")
    atomic_write_text(result.folder / "summary.md", text)
    result.summary_path = result.folder / "summary.md"
    say(table)
    if any(a.runtime == "tensorrt" for a in result.artifacts):
        say("(engines run only on an NVIDIA GPU: serve them with `python -m serve ... --model <engine>`)")


__all__ = ["Artifact", "RunExport", "export_run", "write_meta"]
