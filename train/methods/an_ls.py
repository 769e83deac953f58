"""AN-LS: assume negative with label smoothing (Cole et al. 2021).

The reference code smooths with ``ls_coef = 0.1`` into targets 0.9 / 0.1; the paper's formula with
epsilon = 0.1 would give 0.95 / 0.05. We follow the code (the published numbers come from it), so the
paper's formula corresponds to ``--hp ls_coef=0.05``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.methods.base import LossOutput, Method, MethodHparams, prob_bce, register


@dataclass
class AnLsHparams(MethodHparams):
    """``ls_coef``: targets become ``1 - ls_coef`` (observed) and ``ls_coef`` (unobserved)."""

    ls_coef: float = 0.1


@register
class AssumeNegativeLabelSmoothing(Method):
    """BCE against smoothed AN targets, mean over N*C entries."""

    name = "an-ls"
    Hparams = AnLsHparams
    description = "assume negative with label smoothing (targets 0.9 / 0.1)"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        eps = self.hp.ls_coef
        z = self.targets(batch)
        target = z * (1.0 - eps) + (1.0 - z) * eps
        return LossOutput(prob_bce(torch.sigmoid(logits), target).mean())
