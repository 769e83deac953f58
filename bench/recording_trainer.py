"""A trainer that remembers every epoch: ``python -m train``'s :class:`~train.trainer.Trainer`, unchanged, plus the
validation logits of each epoch and a copy of its weights, so that a benchmark can score any epoch afterwards
(for example the epoch that another selection criterion would have picked) on the test split.

Nothing of the training changes: the run folder, its selection, checkpoints and summary are those of the product.
"""

from __future__ import annotations

import numpy as np
import torch

from train.config import TrainConfig
from train.fixed_features import FixedFeaturePhase
from train.selection import Candidate
from train.trainer import Trainer


class RecordingTrainer(Trainer):
    """:class:`~train.trainer.Trainer` that keeps, per epoch, the model's validation logits (one row per validation
    image, in split order) and a CPU copy of the model's weights (not the EMA's)."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__(cfg)
        self.val_logits: list[np.ndarray] = []
        self.epoch_weights: list[dict[str, torch.Tensor]] = []

    def _candidates(self, linear: FixedFeaturePhase | None) -> list[Candidate]:
        candidates = super()._candidates(linear)
        logits = candidates[0].assessment.logits
        if logits is None or len(logits) != len(self.splits.val):
            raise RuntimeError("some validation images could not be read: the recorded epochs would not line up")
        self.val_logits.append(np.asarray(logits, dtype=np.float32))
        self.epoch_weights.append({k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()})
        return candidates

    def test_logits(self, epoch: int) -> np.ndarray:
        """The logits (N_test, C) of the model as it was after ``epoch`` (1-based) on the test split, in split
        order; call after :meth:`fit` (the model's weights are replaced by that epoch's)."""
        if self.splits.test is None:
            raise ValueError("this dataset has no test split")
        self.model.load_state_dict(self.epoch_weights[epoch - 1])
        rows = self._predict(self.model, self.predictor.eval_loader(self.splits.test), f"test @ epoch {epoch}")
        if rows.missing:
            raise RuntimeError(f"{rows.missing} test image(s) could not be read")
        return rows.values.numpy().astype(np.float32)
