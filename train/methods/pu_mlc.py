"""PU-MLC: "Positive Label Is All You Need for Multi-Label Classification" (Yuan, Zhang, Huang; ICME 2024): the
reference's variational PU loss per class plus the mixup regulariser, in float32. Formulas: docs/methods.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from train.methods.base import LossOutput, Method, MethodContext, MethodHparams, register

PU_EPSILON = 1e-10
MIXUP = "images_mixup"  # the mixed images, run through the model by the trainer (their logits: "logits_mixup")


def adaptive_temperature(logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """Per-class ``min(alpha * std_c, 1)`` (population std over the batch, detached); 1 where std is 0."""
    std = logits.detach().std(dim=0, unbiased=False)
    tau = torch.clamp(alpha * std, max=1.0)
    return torch.where(std > 1e-6, tau, torch.ones_like(tau))


def variational_pu_loss(logits: torch.Tensor, positives: torch.Tensor, gamma: float,
                        alpha: float | None) -> torch.Tensor:
    """PU-MLC's L_var (summed over classes); ``alpha=None`` means no temperature, ``gamma=0`` no re-balance."""
    if alpha is not None:
        logits = logits / adaptive_temperature(logits, alpha)
    p = torch.sigmoid(logits)
    mean_p = p.mean(dim=0)
    weight = mean_p.detach() ** gamma
    unlabelled = weight * torch.log(mean_p + PU_EPSILON)
    pos = positives > 0.5
    count = pos.sum(dim=0)
    pos_log = torch.where(pos, torch.log(p + PU_EPSILON), torch.zeros_like(p)).sum(dim=0)
    positive = torch.where(count > 0, pos_log / count.clamp(min=1), torch.zeros_like(pos_log))
    return (unlabelled - positive).sum()


def mixup_regulariser(mixed_targets: torch.Tensor, mixed_logits: torch.Tensor) -> torch.Tensor:
    """``sum_c mean_n (log(phi^ + 1e-10) - log(sigmoid(s^) + 1e-10))^2``."""
    diff = torch.log(mixed_targets + PU_EPSILON) - torch.log(torch.sigmoid(mixed_logits) + PU_EPSILON)
    return (diff**2).mean(dim=0).sum()


@dataclass
class PuMlcHparams(MethodHparams):
    """``gamma``: re-balance power; ``alpha``: temperature scale (None = no temperature); ``mixup_weight``
    (lambda, 0 switches the regulariser off) and ``mixup_alpha`` (the Beta distribution's parameter)."""

    gamma: float = 0.55
    alpha: float | None = 1.0
    mixup_weight: float = 1.0
    mixup_alpha: float = 0.3


@register
class PuMlc(Method):
    """Variational PU loss with adaptive temperature and re-balance factor, plus the mixup regulariser."""

    name = "pu-mlc"
    Hparams = PuMlcHparams
    starts_at_label_prior: ClassVar[bool] = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {"coco": {"gamma": 0.55, "alpha": 1.0},
                                                    "voc": {"gamma": 0.85, "alpha": 2.0}}
    # The README's commands (2 GPUs, so the batch is twice the per-GPU one): Adam with coupled weight decay
    # 1e-4, OneCycle, EMA, and the paper's trainable scope. Two differences stay: the backbone is the SPML
    # protocol's ResNet-50 (the paper uses ResNet-101) and OneCycle spans the run's epochs (the reference
    # schedules 80 epochs and stops early, so it never anneals fully).
    trainable_scope = "layer4"  # LgConv branches + layer4 + head; stem and layers 1-3 frozen
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {
        "*": {"weight_decay": 1e-4, "scheduler": "onecycle"},
        "coco": {"batch_size": 70, "lr": 1e-4, "ema": 0.9997, "epochs": 40},
        "voc": {"batch_size": 90, "lr": 4e-5, "ema": 0.991, "epochs": 55}}
    paper = "Yuan, Zhang, Huang 2024"
    description = ("variational PU loss (positives vs all images), adaptive temperature, re-balance factor, "
                   "mixup regulariser")

    def __init__(self, ctx: MethodContext, hparams: PuMlcHparams) -> None:
        super().__init__(ctx, hparams)
        # made once: making a distribution checks its parameters, which takes longer than a draw
        self.mixing = torch.distributions.Beta(hparams.mixup_alpha, hparams.mixup_alpha)

    def extra_model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The mixup images, the pairs and lambda; nothing when the regulariser is off."""
        if self.hp.mixup_weight <= 0:
            return {}
        images = batch["images"]
        n = images.shape[0]
        half = n // 2
        first = torch.arange(half, device=images.device)
        second = torch.arange(n - half, n, device=images.device) if half > 0 else first
        if half == 0:  # a batch of one: mix the sample with itself
            first = second = torch.zeros(1, dtype=torch.long, device=images.device)
        first = first[torch.randperm(first.numel()).to(images.device)]
        lam = self.mixing.sample()
        return {MIXUP: lam * images[first] + (1.0 - lam) * images[second], "mixup_pairs": torch.stack([first, second]),
                "mixup_lambda": lam}

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """L_var, plus the mixup regulariser when the batch holds the mixed images' logits (``logits_mixup``)."""
        z = self.targets(batch)
        loss = variational_pu_loss(logits, z, self.hp.gamma, self.hp.alpha)
        if "logits_mixup" not in batch:
            return LossOutput(loss)
        first, second = batch["mixup_pairs"]
        lam = batch["mixup_lambda"].to(logits.device)
        phi = torch.where(z > 0.5, torch.ones_like(logits), torch.sigmoid(logits))
        mixed_targets = lam * phi[first] + (1.0 - lam) * phi[second]
        reg = mixup_regulariser(mixed_targets, batch["logits_mixup"])
        return LossOutput(loss + self.hp.mixup_weight * reg, {"mixup_reg": reg.detach()})
