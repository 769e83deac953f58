"""The full-label BCE oracle: trains on the annotated labels (an upper bound, not an SPML method)."""

from __future__ import annotations

from typing import ClassVar

import torch

from train.methods.an import assume_negative_loss
from train.methods.base import LossOutput, Method, register


@register
class FullLabelBCE(Method):
    """BCE against the full annotated labels (the papers' "BCE full labels" row)."""

    name = "bce"
    trains_on_full_labels = True
    paper = "-"
    starts_at_label_prior: ClassVar[bool] = True
    description = "oracle: BCE on the full labels (upper bound)"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        return LossOutput(assume_negative_loss(logits, self.targets(batch)))
