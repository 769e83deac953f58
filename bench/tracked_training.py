"""``python -m bench.tracked_training ARGS``: ``python -m train ARGS`` that also scores every epoch's model on the
test split and, where the training split has hidden full labels, its label recovery (Cole et al.: training-set mAP
against them), for learning curves. Selection, checkpoints and the summary are the product's; each epoch's figures
are appended to ``RUN/epochs.jsonl`` (kept across ``--resume``: an epoch trained again replaces its line).

The extra passes run after the epoch's selection, under a forked RNG, so the training randomness is unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from models.files.atomic_writes import atomic_write_text
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


def main(argv: list[str] | None = None) -> int:
    """``python -m train`` with :class:`TrackingTrainer`."""
    from train.__main__ import main as train_main

    return train_main(argv, trainer_class=TrackingTrainer)


if __name__ == "__main__":
    sys.exit(main())
