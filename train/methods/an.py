"""AN, "assume negative" (Cole et al., CVPR 2021; docs/methods.md): every unobserved label is a negative."""

from __future__ import annotations

from typing import ClassVar

import torch

from train.methods.base import LossOutput, Method, neg_log, register


def assume_negative_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all N*C entries of ``-log p`` (target 1) / ``-log(1-p)`` (target 0), in probability space
    with the reference code's 1e-5 epsilon."""
    p = torch.sigmoid(logits)
    loss = torch.where(targets > 0.5, neg_log(p), neg_log(1.0 - p))
    return loss.mean()


@register
class AssumeNegative(Method):
    """BCE against the observed labels, unobserved = negative."""

    name = "an"
    paper = "Cole et al. 2021"
    starts_at_label_prior: ClassVar[bool] = True
    description = "assume every unobserved label is negative"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        return LossOutput(assume_negative_loss(logits, self.targets(batch)))
