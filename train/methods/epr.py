"""EPR: expected positive regularisation (Cole et al., CVPR 2021; docs/methods.md), scaled as the reference code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from train.methods.base import LossOutput, Method, MethodHparams, expected_positives_regulariser, neg_log, register

# Expected positives per image from Cole et al.'s lookup (fully labelled train sets).
EXPECTED_POSITIVES = {"voc": 1.5, "coco": 2.9, "nus": 1.9, "cub": 31.4}


@dataclass
class EprHparams(MethodHparams):
    """``k``: expected positives per image; None = the run's k."""

    k: float | None = None


@register
class ExpectedPositiveRegularisation(Method):
    """``-log p`` at observed positives (others 0), mean over N*C, plus the expected-positives regulariser."""

    name = "epr"
    Hparams = EprHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {f: {"k": k} for f, k in EXPECTED_POSITIVES.items()}
    uses_expected_positives = True
    paper = "Cole et al. 2021"
    description = "positives only + expected-number-of-positives regulariser"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        k = self.hp.k if self.hp.k is not None else self.ctx.expected_positives
        p = torch.sigmoid(logits)
        z = self.targets(batch)
        positive = torch.where(z > 0.5, neg_log(p), torch.zeros_like(p)).mean()
        reg = expected_positives_regulariser(p, k)
        return LossOutput(positive + reg, {"epr_reg": reg.detach()})
