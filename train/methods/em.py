"""EM ("entropy maximisation") and EM + APL, asymmetric pseudo-labelling (Zhou et al., ECCV 2022; docs/methods.md).
Without a preset APL's warm-up is half the run, 1 to 5 epochs (docs/methods-investigation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from train.methods.base import (
    NEGATIVES,
    EpochEndContext,
    LabelEstimate,
    LossOutput,
    Method,
    MethodContext,
    MethodHparams,
    neg_log,
    prob_bce,
    register,
)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Binary entropy ``-[p log(p + eps) + (1 - p) log(1 - p + eps)]`` with the reference epsilon."""
    return p * neg_log(p) + (1.0 - p) * neg_log(1.0 - p)


@dataclass
class EmHparams(MethodHparams):
    """``alpha``: weight of the entropy term on unobserved entries."""

    alpha: float = 0.1


@register
class EntropyMaximisation(Method):
    """Observed positive: ``-log p``; unobserved: ``-alpha * H(p)``."""

    name = "em"
    Hparams = EmHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"alpha": 0.2}, "coco": {"alpha": 0.1}, "nus": {"alpha": 0.1}, "cub": {"alpha": 0.01}}
    # Zhou et al.'s main.py: Adam without schedule for 10 epochs (the paper preset); batch and lr per dataset
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"batch_size": 8, "lr": 1e-5}, "coco": {"batch_size": 16, "lr": 1e-5},
        "nus": {"batch_size": 16, "lr": 1e-5}, "cub": {"batch_size": 8, "lr": 1e-4}}
    paper = "Zhou et al. 2022"
    description = "entropy maximisation on unobserved labels"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        p = torch.sigmoid(logits)
        z = self.targets(batch)
        loss = torch.where(z > 0.5, neg_log(p), -self.hp.alpha * entropy(p))
        return LossOutput(loss.mean())


@dataclass
class EmAplHparams(EmHparams):
    """EM's ``alpha`` plus APL's ``beta``, ``theta``, ``warmup_epochs`` and ``total_epochs`` (None: from the run)."""

    beta: float = 0.9
    theta: float = 0.9
    warmup_epochs: int | None = None
    total_epochs: int | None = None


PAPER_WARMUP_EPOCHS = 5  # T_w of Zhou et al.'s VOC and COCO runs (10 epochs in all)


def default_warmup(total_epochs: int) -> int:
    """EM-APL's default warm-up: half of ``total_epochs``, from 1 to the papers' 5."""
    return min(PAPER_WARMUP_EPOCHS, max(1, total_epochs // 2))


@register
class EmAsymmetricPseudoLabels(EntropyMaximisation):
    """EM plus accumulating soft negative pseudo-labels (a buffer saved with the checkpoint)."""

    name = "em-apl"
    Hparams = EmAplHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"alpha": 0.2, "theta": 0.9, "warmup_epochs": 5, "beta": 0.02},
        "coco": {"alpha": 0.1, "theta": 0.9, "warmup_epochs": 5, "beta": 0.9},
        "nus": {"alpha": 0.1, "theta": 0.9, "warmup_epochs": 4, "beta": 0.2},
        "cub": {"alpha": 0.01, "theta": 0.9, "warmup_epochs": 3, "beta": 0.4}}
    description = "EM + accumulating soft negative pseudo-labels after a warm-up"

    def __init__(self, ctx: MethodContext, hparams: EmAplHparams) -> None:
        super().__init__(ctx, hparams)
        # -1 = no pseudo-label; otherwise the soft target (the prediction when it was assigned)
        self.register_buffer("pseudo", torch.full((ctx.num_train, ctx.num_classes), -1.0))
        self.register_buffer("initial_unobserved", (ctx.train_observed < 0.5).sum(0).float())

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        p = torch.sigmoid(logits)
        z = self.targets(batch)
        soft = self.pseudo[batch["index"]]
        pseudo_labelled = soft >= 0
        loss = torch.where(
            z > 0.5, neg_log(p),
            torch.where(pseudo_labelled, self.hp.beta * prob_bce(p, soft.clamp(min=0.0)), -self.hp.alpha * entropy(p)))
        return LossOutput(loss.mean())

    def total_epochs(self) -> int:
        """The schedule's length T: ``--hp total_epochs`` or the run's epochs."""
        return self.hp.total_epochs or self.ctx.epochs

    def warmup_epochs(self) -> int:
        """The warm-up of this run: ``--hp warmup_epochs`` or the preset's, else :func:`default_warmup`."""
        if self.hp.warmup_epochs is not None:
            return self.hp.warmup_epochs
        return default_warmup(self.total_epochs())

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        total, warmup = self.total_epochs(), self.warmup_epochs()
        if ctx.epoch < warmup or total <= warmup:
            return {}
        probs = ctx.predict_train(True).to(self.pseudo.device)
        observed = self.ctx.train_observed.to(self.pseudo.device) > 0.5
        per_round = (self.hp.theta * self.initial_unobserved / (total - warmup)).long()
        added = 0
        for c in range(self.pseudo.shape[1]):
            candidates = torch.nonzero(~observed[:, c] & (self.pseudo[:, c] < 0)).flatten()
            n = min(int(per_round[c]), candidates.numel())
            if n == 0:
                continue
            lowest = candidates[torch.argsort(probs[candidates, c])[:n]]
            self.pseudo[lowest, c] = probs[lowest, c]
            added += n
        return {"apl_added": float(added), "apl_total": float((self.pseudo >= 0).sum())}

    def label_estimates(self) -> dict[str, LabelEstimate]:
        """The pseudo-negatives so far (``apl_negative_precision``)."""
        return {"apl_negative": LabelEstimate(self.pseudo >= 0, NEGATIVES)}
