"""A trainer that remembers every epoch: ``python -m train``'s :class:`~train.trainer.Trainer`, unchanged, plus the
validation and test logits of each epoch's model, so that a benchmark can score any epoch afterwards (for example
the epoch that another selection criterion would have picked) on the test split.

Nothing of the training changes: the run folder, its selection, checkpoints and summary are those of the product
(the test predictions run after the epoch's selection, under a forked RNG, so the training randomness is the
product's too).
"""

from __future__ import annotations

import numpy as np
import torch

from train.config import TrainConfig
from train.fixed_features import FixedFeaturePhase
from train.selection import Candidate
from train.trainer import Trainer


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
