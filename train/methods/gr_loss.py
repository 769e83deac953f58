"""GR-Loss (Chen et al., IJCAI 2024; reference code yan4xi1/GRLoss, settings from Fsoft-AIC/AEVLP). The schedules,
numerics and departures from the reference: docs/methods.md ("GR-Loss"). The ``epoch`` buffer never moves back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from train.methods.base import EpochEndContext, LossOutput, Method, MethodContext, MethodHparams, register

GR_LOG_EPSILON = 1e-7  # losses.py LOG_EPSILON of the reference (neg_log of the observed positives)

Quad = tuple[float, float, float, float]


@dataclass
class GrLossHparams(MethodHparams):
    """``beta = (w_0, w_T, b_0, b_T)`` and ``alpha = (mu_0, sigma_0, mu_T, sigma_T)``, the schedules' first and last
    values; ``q2``, ``q3`` the robust terms' exponents."""

    beta: tuple[float, float, float, float] = (0.0, 2.0, -2.0, -2.0)
    alpha: tuple[float, float, float, float] = (0.5, 2.0, 0.8, 0.5)
    q2: float = 0.01
    q3: float = 1.0

    def __post_init__(self) -> None:
        for name in ("beta", "alpha"):
            values = tuple(float(v) for v in getattr(self, name))
            if len(values) != 4 or not all(math.isfinite(v) for v in values):
                raise ValueError(f"{name} takes 4 finite numbers, got {getattr(self, name)!r}")
            setattr(self, name, values)
        if not (self.alpha[1] > 0 and self.alpha[3] > 0):
            raise ValueError(f"alpha's sigmas (its 2nd and 4th values) must be > 0, got {self.alpha}")
        if not (self.q2 > 0 and self.q3 > 0):
            raise ValueError(f"q2 and q3 must be > 0, got {self.q2}, {self.q3}")


def gr_schedule(hp: GrLossHparams, epoch: int, total: int, linear_init: int = 0) -> Quad:
    """``(w, b, mu, sigma)`` of the 1-based ``epoch`` of ``total`` epochs, the first ``linear_init`` of them
    LinearInit epochs, as the reference's ``run_train`` computes them (same operations in the same order)."""
    span = total - linear_init
    w_0, w_max, b_0, b_max = hp.beta
    mu_0, sigma_0, mu_max, sigma_max = hp.alpha
    if span <= 0:  # every epoch is a LinearInit epoch: both factors are 0 (the reference divides by zero)
        return w_0, b_0, mu_0, sigma_0
    late, early = max(epoch - linear_init - 1, 0), max(epoch - linear_init, 0)
    return (w_0 + (w_max - w_0) * late / span, b_0 + (b_max - b_0) * late / span,
            mu_0 + (mu_max - mu_0) * early / span, sigma_0 + (sigma_max - sigma_0) * early / span)


def gr_weights(p_detached: torch.Tensor, schedule: Quad) -> tuple[torch.Tensor, torch.Tensor]:
    """The soft pseudo-label ``k(p') = sigmoid(w p' + b)`` and the Gaussian weight
    ``v(p') = exp(-(p' - mu)^2 / (2 sigma^2))`` of the detached probabilities under ``schedule``."""
    w, b, mu, sigma = schedule
    k = torch.sigmoid(w * p_detached + b)
    v = torch.exp(-0.5 * ((p_detached - mu) / sigma) ** 2)
    return k, v


def gr_unobserved_loss(logits: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2: float, q3: float) -> torch.Tensor:
    """The ``(N, C)`` unobserved-entry term ``v [k (1 - p^q2) / q2 + (1 - k) (1 - (1 - p)^q3) / q3]`` of every
    entry."""
    # from logsigmoid: equal to the reference's (1 - pow(p, q)) / q, but finite where float32 sigmoid underflows to 0
    towards_one = -torch.expm1(q2 * F.logsigmoid(logits)) / q2  # (1 - p^q2) / q2
    towards_zero = -torch.expm1(q3 * F.logsigmoid(-logits)) / q3  # (1 - (1 - p)^q3) / q3
    return v * (k * towards_one + (1.0 - k) * towards_zero)


def gr_entry_loss(logits: torch.Tensor, observed: torch.Tensor, schedule: Quad, q2: float, q3: float) -> torch.Tensor:
    """The ``(N, C)`` matrix of GR-Loss entries: observed 1 -> the positive term, 0 -> the
    weighted robust terms, anything else 0."""
    p = torch.sigmoid(logits)
    k, v = gr_weights(p.detach(), schedule)
    positive = -torch.log(p + GR_LOG_EPSILON)
    unobserved = gr_unobserved_loss(logits, k, v, q2, q3)
    zero = torch.zeros_like(logits)
    return torch.where(observed == 1, positive, torch.where(observed == 0, unobserved, zero))


# The GRLoss repository's config.py defaults, one set for every dataset (docs/methods.md, "GR-Loss")
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "*": {"batch_size": 8, "lr": 1e-5, "head_lr_mult": 10.0, "epochs": 8, "optimizer": "adam", "scheduler": "none"}}


@register
class GeneralizedRobustLoss(Method):
    """Observed positive: ``-log p``; unobserved: soft pseudo-label of two robust losses, Gaussian-weighted."""

    name = "gr-loss"
    left_out_of_auto = "5.9 to 13.2 test mAP below an on the Tux Paint stamps"
    Hparams = GrLossHparams
    # voc: the GRLoss repository's defaults (also AEVLP's configs/pascal.json); coco, nus, cub: AEVLP's configs
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"beta": (0.0, 2.0, -2.0, -2.0), "alpha": (0.5, 2.0, 0.8, 0.5), "q2": 0.01, "q3": 1.0},
        "coco": {"beta": (0.0, 10.0, -2.0, -8.0), "alpha": (0.5, 2.0, 0.8, 0.5), "q2": 0.01, "q3": 1.0},
        "nus": {"beta": (0.0, 10.0, -2.0, -8.0), "alpha": (0.5, 2.0, 0.8, 0.5), "q2": 0.01, "q3": 1.0},
        "cub": {"beta": (0.0, 10.0, -2.0, -8.0), "alpha": (0.5, 2.0, 0.8, 0.5), "q2": 0.01, "q3": 1.5}}
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = PAPER_SETTINGS
    paper = "Chen et al. 2024"
    description = ("positives `-log p`; unobserved: soft pseudo-label k(p) between two robust losses, "
                   "Gaussian weight v(p), both scheduled over the epochs")
    hp: GrLossHparams

    def __init__(self, ctx: MethodContext, hparams: GrLossHparams) -> None:
        super().__init__(ctx, hparams)
        self.register_buffer("epoch", torch.tensor(1, dtype=torch.int64))  # the epoch the next steps belong to
        self._epoch = 1  # host copy: no device sync per step

    def schedule(self) -> Quad:
        """``(w, b, mu, sigma)`` of the current epoch."""
        return gr_schedule(self.hp, self._epoch, self.ctx.epochs, self.ctx.linear_init_epochs)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        entries = gr_entry_loss(logits, self.targets(batch), self.schedule(), self.hp.q2, self.hp.q3)
        return LossOutput(entries.mean())

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        w, b, mu, sigma = self.schedule()  # what the epoch's steps used
        self._epoch = ctx.epoch + 1
        self.epoch.fill_(self._epoch)
        return {"gr_w": w, "gr_b": b, "gr_mu": mu, "gr_sigma": sigma}

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # LinearInit restores the method state of its best epoch at its end: the schedule keeps the current epoch
        current = self._epoch
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._epoch = max(current, int(self.epoch))
        self.epoch.fill_(self._epoch)
