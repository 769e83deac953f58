"""WAN: weak assume negative (Cole et al., CVPR 2021): unobserved labels are negatives with weight gamma."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.methods.base import LossOutput, Method, MethodHparams, neg_log, register


@dataclass
class WanHparams(MethodHparams):
    """``gamma``: weight of the unobserved (negative) terms; None = 1 / (C - 1), as in paper and code."""

    gamma: float | None = None


@register
class WeakAssumeNegative(Method):
    """``-log p`` at observed positives, ``gamma * -log(1 - p)`` elsewhere; mean over N*C entries."""

    name = "wan"
    Hparams = WanHparams
    paper = "Cole et al. 2021"
    description = "AN with the negatives weighted 1/(C-1)"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        c = logits.shape[1]
        gamma = self.hp.gamma if self.hp.gamma is not None else 1.0 / max(c - 1, 1)
        p = torch.sigmoid(logits)
        z = self.targets(batch)
        loss = torch.where(z > 0.5, neg_log(p), gamma * neg_log(1.0 - p))
        return LossOutput(loss.mean())
