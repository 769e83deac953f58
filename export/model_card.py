"""The model card of an export folder: ``README.md`` for people (classes, training, validation scores, thresholds,
files, the tagging command) and ``tags.csv`` (``name,threshold,val_ap`` per class) for other tools."""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.checkpoint import ModelMeta
from models.data.label_regime import NOT_AVAILABLE
from models.files.atomic_writes import atomic_write_text

MODEL_CARD_FILE = "README.md"
TAGS_FILE = "tags.csv"


@dataclass
class CardFile:
    """One exported file listed on the card."""

    name: str
    precision: str
    runtime: str
    size_bytes: int
    val_map: float | None = None


def tags_table(meta: ModelMeta, per_class_ap: np.ndarray | None) -> str:
    """``tags.csv`` text: a header, then ``name,threshold,val_ap`` per class (AP in percent, 2 decimals)."""
    thresholds = meta.thresholds if meta.thresholds is not None else [0.5] * len(meta.classes)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["name", "threshold", "val_ap"])
    for c, name in enumerate(meta.classes):
        ap = "" if per_class_ap is None or np.isnan(per_class_ap[c]) else f"{100 * per_class_ap[c]:.2f}"
        writer.writerow([name, f"{thresholds[c]:.6g}", ap])
    return buffer.getvalue()


def tag_command(model_path: Path) -> str:
    """The command that tags a folder with the exported model at ``model_path``."""
    return (f"python -m serve tag path/to/images --model {shlex.quote(str(model_path))} "
            "--output tags.jsonl --sidecar")


def _metric_lines(meta: ModelMeta, labels_note: str) -> list[str]:
    lines = []
    for split in ("val", "test"):
        metrics = meta.metrics.get(split)
        if not isinstance(metrics, dict):
            continue
        if metrics.get("mAP") is not None:
            figures = ", ".join(f"{k} {metrics[k]:.2f}" for k in ("mAP", "OF1", "CF1") if metrics.get(k) is not None)
            lines.append(f"- {split}: {figures}")
        elif metrics.get("mAP_observed") is not None:
            lines.append(f"- {split}: mAP {NOT_AVAILABLE}; {metrics['mAP_observed']:.2f} against its labels as "
                         "given (a lower bound)")
    if not lines:
        return ["No metrics: the run had no labelled evaluation data."]
    return [*lines, "", labels_note]


def _calibration_line(meta: ModelMeta) -> str:
    cal = meta.calibration or {}
    if meta.thresholds is None:
        return "Thresholds: 0.5 for every class (not calibrated)."
    mode = cal.get("mode", "unknown mode")
    data = cal.get("data", "the validation split")
    return f"Thresholds: calibrated per class by `{mode}` on {data}" + (
        f" (details: `{cal['report']}`)." if cal.get("report") else ".")


def model_card_markdown(meta: ModelMeta, files: Sequence[CardFile], model_path: Path, labels_note: str,
                        per_class_ap: np.ndarray | None, runtime_notes: Sequence[str] = ()) -> str:
    """The ``README.md`` text of an export folder; ``labels_note`` says what the figures were measured against,
    ``runtime_notes`` the faster CPU runtimes the export picked."""
    data = meta.data or {}
    thresholds = meta.thresholds if meta.thresholds is not None else [0.5] * len(meta.classes)
    head = meta.head.get("kind", "linear") if meta.head else "linear"
    lines = [
        f"# {data.get('name', 'spml')} tagger: {meta.method or 'model'} on {meta.arch}", "",
        f"A multi-label image tagger with {len(meta.classes)} classes, exported by spml {meta.package_version}. "
        "It outputs one logit per class; the probability is its sigmoid, and a class is a tag when its "
        "probability reaches the class's threshold.", "",
        "## Use", "", "```bash", tag_command(model_path), "```", "",
        "## Training", "",
        f"- data: `{data.get('source', data.get('name', 'unknown'))}` ({data.get('num_train', '?')} training and "
        f"{data.get('num_val', '?')} validation images), observed labels `{data.get('observed_labels', '?')}`",
        f"- method: `{meta.method}`" + (f" with {meta.method_hparams}" if meta.method_hparams else ""),
        f"- model: {meta.arch}" + (f" from {meta.weights} weights" if meta.weights else "") + f", {head} head"
        + (", LgConv" if meta.lgconv else "") + f", best epoch {meta.epoch}",
        f"- input: {meta.image_size} x {meta.image_size} px RGB ({meta.resize} resize, {meta.interpolation}"
        + (f", centre crop {meta.crop:g}" if meta.crop < 1 else "") + f"), pixels / 255 normalised with mean "
        f"{list(meta.mean)} and std {list(meta.std)}", "",
        "## Metrics", "", *_metric_lines(meta, labels_note), "",
        "## Files", "", "| file | precision | runtime | size (MB) | val mAP |", "|---|---|---|---:|---:|",
    ]
    for f in files:
        val = "-" if f.val_map is None else f"{f.val_map:.2f}"
        lines.append(f"| `{f.name}` | {f.precision} | {f.runtime} | {f.size_bytes / 1e6:.1f} | {val} |")
    lines += [f"\n{note}" for note in runtime_notes]
    lines += ["", "## Classes and thresholds", "", _calibration_line(meta),
              f"The same table as CSV: `{TAGS_FILE}`.", "", "| class | threshold | val AP |", "|---|---:|---:|"]
    for c, name in enumerate(meta.classes):
        ap = "-" if per_class_ap is None or np.isnan(per_class_ap[c]) else f"{100 * per_class_ap[c]:.2f}"
        lines.append(f"| {name.replace('|', '/')} | {thresholds[c]:.4f} | {ap} |")
    return "\n".join(lines) + "\n"


def write_model_card(folder: Path, meta: ModelMeta, files: Sequence[CardFile], model_path: Path,
                     labels_note: str, per_class_ap: np.ndarray | None,
                     runtime_notes: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``README.md`` and ``tags.csv`` into ``folder`` atomically; returns their paths."""
    card, tags = folder / MODEL_CARD_FILE, folder / TAGS_FILE
    atomic_write_text(card, model_card_markdown(meta, files, model_path, labels_note, per_class_ap, runtime_notes))
    atomic_write_text(tags, tags_table(meta, per_class_ap))
    return card, tags
