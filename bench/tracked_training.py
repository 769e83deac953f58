"""``python -m bench.tracked_training ARGS``: ``python -m train ARGS`` that also scores every epoch's model on the
test split, where the training split has hidden full labels its label recovery (Cole et al.: training-set mAP
against them), and where the validation images are scored with their observed labels (a user's view of a benchmark)
its val mAP against the dataset's full labels (to compare settings without reading test), for learning curves.
Selection, checkpoints and the summary are the product's; each epoch's figures are appended to ``RUN/epochs.jsonl``
(kept across ``--resume``: an epoch trained again replaces its line).

The extra passes run with the epoch's validation (in a phase on fixed features, the head on the cached features),
under a forked RNG, so the training randomness is unchanged.
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

from models.evaluation.metrics import mean_average_precision
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


def labels_by_path(dataset: Any, classes: list[str]) -> dict[str, np.ndarray]:
    """Every image's labels in ``dataset`` (its train, val and test parts) over ``classes`` (a subset of its own),
    by path."""
    column = {name: i for i, name in enumerate(dataset.classes)}
    keep = [column[name] for name in classes]
    return {str(path): row[keep] for part in (dataset.train, dataset.val, dataset.test) if part is not None
            for path, row in zip(part.paths, part.labels, strict=True)}


class TrackingTrainer(Trainer):
    """The product's trainer plus test mAP, label recovery and the hidden-label val mAP of the current model after
    every epoch."""

    _hidden_val: np.ndarray | None = None
    _tracked: dict[str, float] | None = None

    def _candidates(self, linear: FixedFeaturePhase | None) -> list[Candidate]:
        candidates = super()._candidates(linear)
        if self.world.is_main:  # scored here, before LinearInit's last epoch restores its best head
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):  # the extra passes must not move the training RNG
                self._tracked = self._track(linear, candidates[0].assessment.logits)
        return candidates

    def _track(self, linear: FixedFeaturePhase | None, val_logits: Any) -> dict[str, float]:
        """This epoch's extra figures: hidden-label val mAP, test mAP, label recovery (the head on cached features
        in a phase on fixed features)."""
        record: dict[str, float] = {}
        hidden = self.hidden_val_labels()
        if hidden is not None and val_logits is not None and len(val_logits) == len(hidden):
            record["val_full_mAP"] = float(mean_average_precision(np.asarray(val_logits), hidden))
        parts = [("test_mAP", self.splits.test, "test")] if self.splits.test is not None else []
        if self.splits.train_has_full_labels:
            parts.append(("train_recovery_mAP", self.splits.train, "train"))
        for key, images, split in parts:
            if linear is not None:
                rows = linear.head_rows(self.model, images, split)
                present = rows.present.numpy()
                record[key] = float(mean_average_precision(rows.values.numpy()[present], images.labels[present]))
            else:
                loader = self.predictor.eval_loader(images)
                record[key] = self.evaluate(self.model, loader, f"{split} (tracked)", split).metrics["mAP"]
        return record

    def hidden_val_labels(self) -> np.ndarray | None:
        """The validation images' full labels from the dataset itself when the run scores val with observed labels
        (``--observed ...?val=observed``), in split order over the run's classes; None otherwise."""
        if self.splits.has_full_labels("val"):
            return None
        if self._hidden_val is None:
            from models.data.registry import load_dataset

            dataset = load_dataset(self.cfg.data)
            if not set(self.splits.classes) <= set(dataset.classes):
                return None
            full = labels_by_path(dataset, list(self.splits.classes))
            if any(str(path) not in full for path in self.splits.val.paths):
                return None
            self._hidden_val = np.stack([full[str(path)] for path in self.splits.val.paths])
        return self._hidden_val

    def _run_epoch(self, epoch: int) -> None:
        super()._run_epoch(epoch)
        if not self.world.is_main or self._tracked is None:
            return
        record: dict[str, Any] = {"epoch": epoch, **self._tracked}
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
