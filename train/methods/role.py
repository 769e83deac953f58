"""ROLE: regularised online label estimation (Cole et al., CVPR 2021; docs/methods.md): a label-estimator matrix
parameter learnt with the classifier at 10x the learning rate, each trained on the other's predictions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from train.methods.base import (
    SCORES,
    EpochEndContext,
    LabelEstimate,
    LossOutput,
    Method,
    MethodContext,
    MethodHparams,
    expected_positives_regulariser,
    neg_log,
    prob_bce,
    register,
)
from train.methods.epr import EXPECTED_POSITIVES


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@dataclass
class RoleHparams(MethodHparams):
    """``k`` as in EPR; ``lr_mult`` of the estimator; initial probabilities of its entries."""

    k: float | None = None
    lr_mult: float = 10.0
    init_unobserved: float = 0.6  # unobserved logits ~ U[logit(1 - x), logit(x)]
    init_observed: float = 0.995


@register
class Role(Method):
    """Classifier and label estimator trained against each other's (detached) predictions."""

    name = "role"
    left_out_of_auto = "10.8 to 13.0 test mAP below an on the Tux Paint stamps at each learning rate"
    Hparams = RoleHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {f: {"k": k} for f, k in EXPECTED_POSITIVES.items()}
    uses_expected_positives = True
    paper = "Cole et al. 2021"
    description = "online label estimation: a learnt N x C label matrix (10x learning rate)"

    def __init__(self, ctx: MethodContext, hparams: RoleHparams) -> None:
        super().__init__(ctx, hparams)
        generator = torch.Generator().manual_seed(0)
        bound = _logit(hparams.init_unobserved)
        init = (torch.rand(ctx.num_train, ctx.num_classes, generator=generator) * 2.0 - 1.0) * bound
        init[ctx.train_observed > 0.5] = _logit(hparams.init_observed)
        self.estimator = nn.Parameter(init)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        return [{"params": [self.estimator], "lr": lr * self.hp.lr_mult, "weight_decay": 0.0}]

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        k = self.hp.k if self.hp.k is not None else self.ctx.expected_positives
        z = self.targets(batch)
        p = torch.sigmoid(logits)
        y = torch.sigmoid(self.estimator[batch["index"]])  # the estimator's probabilities
        observed = z > 0.5
        zero = torch.zeros_like(p)
        classifier = torch.where(observed, neg_log(p), zero) + prob_bce(p, y.detach())
        estimator = torch.where(observed, neg_log(y), zero) + prob_bce(y, p.detach())
        main = (0.5 * (classifier + estimator)).mean()
        reg = 0.5 * (expected_positives_regulariser(p, k) + expected_positives_regulariser(y, k))
        return LossOutput(main + reg, {"role_reg": reg.detach()})

    @torch.no_grad()
    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        """Logs only: how far the estimator's unobserved entries moved from their initial 0.5 +- 0.1."""
        unobserved = self.ctx.train_observed.to(self.estimator.device) < 0.5
        probs = torch.sigmoid(self.estimator)
        return {"estimator_unobserved_mean": float(probs[unobserved].mean()),
                "estimator_unobserved_abs_logit": float(self.estimator[unobserved].abs().mean())}

    def label_estimates(self) -> dict[str, LabelEstimate]:
        """The estimator's logits (``estimator_recovery_mAP``)."""
        return {"estimator": LabelEstimate(self.estimator.detach(), SCORES)}
