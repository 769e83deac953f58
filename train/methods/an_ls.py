"""AN-LS: assume negative with label smoothing (Cole et al., CVPR 2021; docs/methods.md). ``ls_coef = 0.1`` gives
targets 0.9 / 0.1 as the reference code; ``ls_pos`` / ``ls_neg`` give the asymmetric AN-LS(eps_p, eps_n)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.methods.base import LossOutput, Method, MethodContext, MethodHparams, prob_bce, register


@dataclass
class AnLsHparams(MethodHparams):
    """``ls_coef``: targets ``1 - ls_coef`` (observed) and ``ls_coef`` (unobserved); ``ls_pos`` / ``ls_neg``, when
    set, replace it on one side (Cole et al.'s asymmetric AN-LS(eps_p, eps_n))."""

    ls_coef: float = 0.1
    ls_pos: float | None = None
    ls_neg: float | None = None

    def smoothing(self) -> tuple[float, float]:
        """``(eps_p, eps_n)`` in use, each in [0, 1)."""
        eps_p = self.ls_coef if self.ls_pos is None else self.ls_pos
        eps_n = self.ls_coef if self.ls_neg is None else self.ls_neg
        for name, eps in (("ls_pos", eps_p), ("ls_neg", eps_n)):
            if not 0.0 <= eps < 1.0:
                raise ValueError(f"an-ls: {name} must be in [0, 1), got {eps}")
        return eps_p, eps_n


@register
class AssumeNegativeLabelSmoothing(Method):
    """BCE against smoothed AN targets, mean over N*C entries."""

    name = "an-ls"
    left_out_of_auto = "12.0 to 28.5 test mAP below an on the Tux Paint stamps"
    Hparams = AnLsHparams
    paper = "Cole et al. 2021"
    description = "AN with label smoothing (targets 0.9 / 0.1; `--hp ls_pos=0`: the asymmetric AN-LS(0, 0.1))"

    def __init__(self, ctx: MethodContext, hparams: AnLsHparams) -> None:
        super().__init__(ctx, hparams)
        self.eps_p, self.eps_n = hparams.smoothing()

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        z = self.targets(batch)
        target = z * (1.0 - self.eps_p) + (1.0 - z) * self.eps_n
        return LossOutput(prob_bce(torch.sigmoid(logits), target).mean())
