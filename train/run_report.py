"""What a run says and records: its opening lines, each epoch's line and ``metrics.jsonl`` record, and at the end
``summary.json`` and the closing line. Pure functions of the run's figures; the trainer writes and prints them."""

from __future__ import annotations

from typing import Any

import numpy as np

from models.data.label_regime import describe_regimes
from train.selection import Assessment, figure

__all__ = ["epoch_line", "epoch_record", "held_out_line", "opening_lines", "summary_line"]


def opening_lines(run: Any) -> list[str]:
    """The lines a run starts with (``run``: a :class:`~train.run_preparation.PreparedRun` or the trainer): what
    trains on what, the weights, preprocessing, label regimes, selection, k and stages."""
    cfg = run.cfg
    lines = [f"run {run.run_dir}: {cfg.method} on {run.dataset.name} ({run.splits.summary()}), {cfg.arch} "
             f"@{cfg.image_size}px, {run.device}" + (f", {run.precision.dtype}" if run.precision.dtype else ""),
             *run.weights_report, f"preprocessing: {run.transform}", describe_regimes(run.splits.regimes),
             run.selection.describe()]
    if run.expected_positives is not None:
        lines.append(f"{cfg.method}: {run.expected_positives.describe()}")
        if run.expected_positives.caveat():
            lines.append(f"note: {run.expected_positives.caveat()}")
    if len(run.stage_plan) > 1:
        lines.append(f"{cfg.method} trains in {len(run.stage_plan)} stages of {', '.join(map(str, run.stage_plan))} "
                     "epochs; each stage starts from the previous stage's best weights")
    return lines


def feature_phase_line(cfg: Any) -> str:
    """The line that opens a phase on fixed features (``--trainable head``, or LinearInit's first phase)."""
    if cfg.trainable == "head":
        return (f"fixed features: the {cfg.arch} backbone is frozen; the head trains {cfg.epochs} epochs on features "
                "computed once")
    return (f"LinearInit: {cfg.linear_init} epochs on fixed {cfg.arch} features, "
            + (f"then {cfg.epochs} end to end" if cfg.epochs else "no end-to-end phase (linear probe)"))


def epoch_record(epoch: int, stage: int | None, stats: dict[str, float], selection: str,
                 candidates: list[Any], improved: bool) -> dict[str, Any]:
    """The ``metrics.jsonl`` line of an epoch: its stats, the validation figures of the model (and its EMA), the
    selection criterion's value and whether it is the best so far."""
    val = candidates[0].assessment.metrics
    record: dict[str, Any] = {"epoch": epoch, **({"stage": stage} if stage is not None else {}),
                              **{k: round(v, 6) for k, v in stats.items()},
                              "val_mAP": val["mAP"], "val_OF1": val["OF1"], "val_CF1": val["CF1"]}
    if val["mAP"] is None:
        record["val_mAP_observed"] = val["mAP_observed"]
    if selection != "val_mAP":
        record[f"val_{selection}"] = candidates[0].assessment.score
    if len(candidates) > 1:
        record["val_mAP_ema"] = candidates[1].assessment.metrics["mAP"]
        record[f"val_{selection}_ema"] = candidates[1].assessment.score
    record["best"] = improved
    return record


def epoch_line(epoch: int, total: int, phase: str, stats: dict[str, float], record: dict[str, Any],
               selection: str) -> str:
    """The console line of an epoch (``phase``: `` (head on features)``, `` (linear)`` or ``""``)."""
    score = f"  val {selection} {record[f'val_{selection}']:.4g}" if selection != "val_mAP" else ""
    return (f"epoch {epoch}/{total}{phase}  loss {stats['loss']:.4f}  val mAP {figure(record['val_mAP'])}{score}"
            + (f"  (ema {figure(record['val_mAP_ema'])})" if "val_mAP_ema" in record else "")
            + (f"  k {stats['k_estimate']:.2f}" if "k_estimate" in stats else "")
            + (f"  {stats['train_images_per_s']:.0f} img/s" if "train_images_per_s" in stats else "")
            + ("  *best*" if record["best"] else ""))


def held_out_line(metrics: dict[str, Any], logits: np.ndarray | None, num_classes: int) -> str:
    """The end-of-run figures of a split with full labels, each saying what it is: mAP (over the classes that have
    a positive there, when some have none) and OF1 / CF1 at the uncalibrated threshold 0.5 with the tags per image
    it gives (the exported model calibrates per-class thresholds instead)."""
    text = f"mAP {figure(metrics['mAP'])}"
    missing = int(metrics.get("classes_without_positives") or 0)
    if missing and metrics.get("mAP") is not None:
        text += f" (over the {num_classes - missing} of {num_classes} classes with a positive)"
    if metrics.get("OF1") is None:
        return text
    tags = "" if logits is None else f", {float((np.asarray(logits) >= 0).sum(1).mean()):.2f} tags per image"
    return (text + f"  OF1 {figure(metrics['OF1'])}  CF1 {figure(metrics['CF1'])} at threshold 0.5{tags} "
            "(python -m export calibrates per-class thresholds)")


def summary_line(best_epoch: int, selection: str, metrics: dict[str, Any],
                 assessments: dict[str, Assessment], num_classes: int) -> str:
    """The closing line: the selected epoch, its val mAP, its test figures and label recovery where there are."""
    line = f"best epoch {best_epoch} ({selection}): val mAP {figure(metrics['val']['mAP'])}"
    if "test" in metrics:
        line += f" | test {held_out_line(metrics['test'], assessments['test'].logits, num_classes)}"
    if "train_recovery" in metrics:
        line += f" | train label recovery mAP {metrics['train_recovery']['mAP']:.2f}"
    return line
