"""``python -m bench.tracked_training ARGS``: ``python -m train ARGS`` that also scores every epoch's model on the
test split and, where the training split has hidden full labels, its label recovery (Cole et al.: training-set mAP
against them), for learning curves. Selection, checkpoints and the summary are the product's; each epoch's figures
are appended to ``RUN/epochs.jsonl`` (kept across ``--resume``: an epoch trained again replaces its line).

The extra passes run after the epoch's selection, under a forked RNG, so the training randomness is unchanged.
:class:`RecordingTrainer` instead keeps every epoch's validation and test logits in memory, so that a benchmark can
score any epoch afterwards (the epoch another selection criterion would have picked; bench/own_data.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.files.atomic_writes import atomic_write_text
from train.config import TrainConfig
from train.fixed_features import FixedFeaturePhase
from train.selection import Candidate
from train.trainer import Trainer

EPOCHS_FILE = "epochs.jsonl"


def read_epochs(run: Path) -> list[dict[str, Any]]:
    """The per-epoch records of a tracked run (``epochs.jsonl``), in epoch order; empty when there are none."""
    path = Path(run) / EPOCHS_FILE
    if not path.is_file():
        return []
    records = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[int(record["epoch"])] = record
    return [records[e] for e in sorted(records)]


class TrackingTrainer(Trainer):
    """The product's trainer plus test mAP and label recovery of the current model after every epoch."""

    def _run_epoch(self, epoch: int) -> None:
        super()._run_epoch(epoch)
        if not self.world.is_main:
            return
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            record: dict[str, Any] = {"epoch": epoch}
            if self.splits.test is not None:
                loader = self.predictor.eval_loader(self.splits.test)
                record["test_mAP"] = self.evaluate(self.model, loader, "test (tracked)", "test").metrics["mAP"]
            if self.splits.train_has_full_labels:
                loader = self.predictor.eval_loader(self.splits.train)
                recovery = self.evaluate(self.model, loader, "train (tracked)", "train").metrics["mAP"]
                record["train_recovery_mAP"] = recovery
        kept = [r for r in read_epochs(self.run_dir) if int(r["epoch"]) < epoch]
        atomic_write_text(self.run_dir / EPOCHS_FILE, "".join(json.dumps(r) + "\n" for r in [*kept, record]))


class RecordingTrainer(Trainer):
    """:class:`~train.trainer.Trainer` that keeps, per epoch, the model's validation logits and its test logits (one
    row per image, in split order; not the EMA's)."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__(cfg)
        self.val_logits: list[np.ndarray] = []
        self.test_logits: list[np.ndarray] = []

    def _candidates(self, linear: FixedFeaturePhase | None) -> list[Candidate]:
        candidates = super()._candidates(linear)
        logits = candidates[0].assessment.logits
        if logits is None or len(logits) != len(self.splits.val):
            raise RuntimeError("some validation images could not be read: the recorded epochs would not line up")
        self.val_logits.append(np.asarray(logits, dtype=np.float32))
        if self.splits.test is not None:
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):  # the test pass must not move the training RNG
                self.test_logits.append(self._test_logits(linear))
        return candidates

    def _test_logits(self, linear: FixedFeaturePhase | None) -> np.ndarray:
        """The current model's test logits (N_test, C) in split order (the head on cached features in a phase on
        fixed features)."""
        assert self.splits.test is not None
        if linear is not None:
            rows = linear.head_rows(self.model, self.splits.test, "test")
        else:
            rows = self._predict(self.model, self.predictor.eval_loader(self.splits.test), "test (recorded)")
        if rows.missing:
            raise RuntimeError(f"{rows.missing} test image(s) could not be read")
        return rows.values.numpy().astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    """``python -m train`` with :class:`TrackingTrainer`."""
    from train.__main__ import main as train_main

    return train_main(argv, trainer_class=TrackingTrainer)


if __name__ == "__main__":
    sys.exit(main())
