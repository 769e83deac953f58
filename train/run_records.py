"""What a run writes, prints and reads back: the run folder's files (written atomically, by rank 0 only), the RNG states
and checkpoint reading ``--resume`` needs, and the lines a run prints."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.checkpoint import Checkpoint, load_checkpoint
from models.data.label_regime import describe_regimes
from models.data.observed_file import OBSERVED_FILE, sha256_of
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.files.run_folder import CONFIG_FILE, METRICS_FILE, SCORES_FILE, SUMMARY_FILE
from train.config import describe_settings
from train.distributed import barrier, broadcast_object, current_world
from train.selection import Assessment, figure

# ----------------------------------------------------------------- the run folder's files

class RunFolderWriter:
    """Writes a run folder's text files; a no-op unless ``writer`` (rank 0)."""

    def __init__(self, run_dir: Path, writer: bool) -> None:
        self.run_dir = run_dir
        self.writer = writer

    def write_config(self, config: dict[str, Any]) -> None:
        """config.json."""
        self._write_json(CONFIG_FILE, config)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json."""
        self._write_json(SUMMARY_FILE, summary)

    def write_scores(self, arrays: dict[str, np.ndarray]) -> None:
        """scores.npz: the best checkpoint's logits and labels per split (``val_logits``, ``val_labels``, ...)."""
        if self.writer:
            with atomic_path(self.run_dir / SCORES_FILE, suffix=".npz") as tmp:
                np.savez_compressed(tmp, **arrays)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Add one epoch's line to metrics.jsonl."""
        if self.writer:
            atomic_write_text(self.run_dir / METRICS_FILE, self._metrics_text() + json.dumps(record) + "\n")

    def keep_metrics_before(self, epoch: int) -> None:
        """Drop the metrics lines of ``epoch`` and later (a resumed run trains them again)."""
        if not self.writer or not (self.run_dir / METRICS_FILE).exists():
            return
        lines = [line for line in self._metrics_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line).get("epoch", 0) < epoch]
        atomic_write_text(self.run_dir / METRICS_FILE, "".join(line + "\n" for line in kept))

    def write_protocol(self, content: bytes, resume: bool) -> None:
        """The protocol file; a resumed run's must hold the same protocol (``ValueError`` otherwise)."""
        if not self.writer:
            return
        path = self.run_dir / OBSERVED_FILE
        if resume and path.is_file():
            if sha256_of(path.read_bytes()) != sha256_of(content):
                raise ValueError(f"{path}: the observed labels or the split changed since this run started")
            return
        with atomic_path(path) as tmp:
            tmp.write_bytes(content)

    def _metrics_text(self) -> str:
        path = self.run_dir / METRICS_FILE
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def _write_json(self, name: str, content: dict[str, Any]) -> None:
        if self.writer:
            atomic_write_text(self.run_dir / name, json.dumps(content, indent=2) + "\n")


# ----------------------------------------------------------------- checkpoint state

def capture_rng() -> dict[str, Any]:
    """All RNG states as tensors/lists (loadable with ``weights_only=True``)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_shared(path: Path, device: torch.device) -> Checkpoint:
    """The checkpoint at ``path`` on every rank (rank 0 reads and sends it under torchrun)."""
    if not current_world().distributed:
        return load_checkpoint(path, map_location=device)
    barrier()  # rank 0 has finished writing it
    return broadcast_object(load_checkpoint(path, map_location="cpu") if current_world().is_main else None)



# ----------------------------------------------------------------- what a run prints and records



def opening_lines(run: Any) -> list[str]:
    """The lines a run starts with: what trains on what, weights, preprocessing, regimes, selection, k."""
    cfg = run.cfg
    lines = [f"run {run.run_dir}: {cfg.method} on {run.dataset.name} ({run.splits.summary()}), {cfg.arch} "
             f"@{cfg.image_size}px, {run.device}" + (f", {run.precision.dtype}" if run.precision.dtype else ""),
             describe_settings(cfg), *run.weights_report, f"preprocessing: {run.transform}",
             describe_regimes(run.splits.regimes),
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
    if cfg.fixed_features:
        return (f"fixed features: the {cfg.arch} backbone is frozen; the head trains {cfg.epochs} epochs on features "
                "computed once")
    return (f"LinearInit: {cfg.linear_init} epochs on fixed {cfg.arch} features, "
            + (f"then {cfg.epochs} end to end" if cfg.epochs else "no end-to-end phase (linear probe)"))


def epoch_record(epoch: int, stage: int | None, stats: dict[str, float], selection: str,
                 candidates: list[Any], improved: bool) -> dict[str, Any]:
    """The ``metrics.jsonl`` line of an epoch: stats, validation figures, criterion and best-so-far."""
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
    """The end-of-run figures of a fully labelled split: mAP, OF1 / CF1 at 0.5 and tags per image."""
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
