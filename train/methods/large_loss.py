"""Large Loss (Kim et al., CVPR 2022): LL-R, LL-Ct and LL-Cp; reference code snucml/LargeLossMatters. From the second
epoch the largest unobserved losses are rejected or corrected to positives; k's schedule and departures:
docs/large-loss-and-boostlu.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from train.distributed import gather_varying, max_over_ranks_
from train.methods.base import EpochEndContext, LossOutput, Method, MethodContext, MethodHparams, register


def large_loss_entries(loss: torch.Tensor, unobserved: torch.Tensor, share: float) -> torch.Tensor:
    """Bool mask of the unobserved entries of ``loss`` at or above the k-th largest unobserved loss of the global batch,
    ``k = ceil(entries * share)`` clipped to ``[1, entries]``."""
    masked = torch.where(unobserved, loss.detach(), torch.zeros_like(loss))
    everyone, _ = gather_varying(masked)
    count = min(max(math.ceil(everyone.numel() * share), 1), everyone.numel())
    threshold = torch.topk(everyone.flatten(), count).values[-1]
    return unobserved & (masked >= threshold)


@dataclass
class LargeLossHparams(MethodHparams):
    """``delta_rel``: percent of the batch's entries added to the modified share at every epoch end (LL-Cp:
    the share modified in every batch), as the reference's ``--delta_rel`` (0.1 ... 0.5)."""

    delta_rel: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.delta_rel <= 100.0:
            raise ValueError(f"delta_rel is a percentage in [0, 100], got {self.delta_rel}")


# Per-scheme defaults: the BoostLU paper's config (one value per scheme for every dataset; LL-Ct's is
# LargeLossHparams' 0.2)
@dataclass
class LlrHparams(LargeLossHparams):
    """LL-R's ``delta_rel`` (default 0.5)."""

    delta_rel: float = 0.5


@dataclass
class LlcpHparams(LargeLossHparams):
    """LL-Cp's ``delta_rel`` (default 0.1)."""

    delta_rel: float = 0.1


# Published optimisation (the authors' answer in snucml/LargeLossMatters issue #4, and the reference's
# defaults: batch 16, 10 epochs; its SGD has momentum 0.9 and weight decay 1e-3), the classifier at 10x the
# learning rate as in the reference (--head-lr-mult).
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "*": {"batch_size": 16, "epochs": 10, "head_lr_mult": 10.0},
    "voc": {"optimizer": "sgd", "lr": 5e-3, "momentum": 0.9, "weight_decay": 1e-3},
    "coco": {"optimizer": "adam", "lr": 1e-5},
    "nus": {"optimizer": "adam", "lr": 1e-5},
    "cub": {"optimizer": "adam", "lr": 7.5e-5}}


class LargeLoss(Method):
    """AN whose largest unobserved losses are rejected or corrected (not registered: the three schemes are)."""

    correct: ClassVar[bool] = True  # False: reject (loss 0); True: the loss of a positive target
    permanent: ClassVar[bool] = False
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = PAPER_SETTINGS
    starts_at_label_prior: ClassVar[bool] = True
    paper = "Kim et al. 2022"
    hp: LargeLossHparams

    def __init__(self, ctx: MethodContext, hparams: LargeLossHparams) -> None:
        super().__init__(ctx, hparams)
        # float64, decremented as the reference does; a host copy avoids a device sync per step
        self.register_buffer("clean_rate", torch.tensor(1.0, dtype=torch.float64))
        self._clean_rate = 1.0
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh_rate())

    def refresh_rate(self) -> None:
        """Copy the ``clean_rate`` buffer to the host (after a checkpoint is loaded)."""
        self._clean_rate = float(self.clean_rate)

    def modified_share(self) -> float:
        """The share of a batch's entries modified in the current epoch (0 in the first epoch)."""
        if self._clean_rate == 1.0:
            return 0.0
        return self.hp.delta_rel / 100 if self.permanent else 1 - self._clean_rate

    def observed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's observed labels (LL-Cp adds its permanent corrections)."""
        return batch["observed"]

    def record(self, index: torch.Tensor, chosen: torch.Tensor) -> None:
        """Remember the batch's corrected entries (LL-Cp only)."""

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        observed = self.observed(batch)
        loss = F.binary_cross_entropy_with_logits(logits, observed, reduction="none")
        share = self.modified_share()
        if share == 0.0:  # the first epoch: plain AN
            return LossOutput(loss.mean())
        chosen = large_loss_entries(loss, observed < 0.5, share)
        if self.correct:
            replaced = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
        else:
            replaced = torch.zeros_like(loss)
        self.record(batch["index"], chosen)
        return LossOutput(torch.where(chosen, replaced, loss).mean())

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        self._clean_rate -= self.hp.delta_rel / 100
        self.clean_rate.fill_(self._clean_rate)
        return {"ll_clean_rate": self._clean_rate}


# delta_rel per dataset family: the authors' best values (snucml/LargeLossMatters issue #4)
@register
class LargeLossRejection(LargeLoss):
    """LL-R: the largest unobserved losses are left out (loss 0)."""

    name = "ll-r"
    Hparams = LlrHparams
    correct = False
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"delta_rel": 0.2}, "coco": {"delta_rel": 0.4}, "nus": {"delta_rel": 0.4}, "cub": {"delta_rel": 0.4}}
    description = "AN; from epoch 2 the largest unobserved losses are dropped, a share growing each epoch"


@register
class LargeLossTemporaryCorrection(LargeLoss):
    """LL-Ct: the largest unobserved losses get a positive target for this step."""

    name = "ll-ct"
    Hparams = LargeLossHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"delta_rel": 0.2}, "coco": {"delta_rel": 0.2}, "nus": {"delta_rel": 0.2}, "cub": {"delta_rel": 0.4}}
    description = "as `ll-r`, but those entries are trained as positives"


@register
class LargeLossPermanentCorrection(LargeLoss):
    """LL-Cp: the largest unobserved losses become observed positives for the rest of the run."""

    name = "ll-cp"
    Hparams = LlcpHparams
    permanent = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"delta_rel": 0.1}, "coco": {"delta_rel": 0.2}, "nus": {"delta_rel": 0.2}, "cub": {"delta_rel": 0.2}}
    description = "as `ll-ct`, and they stay positives for the rest of training"

    def __init__(self, ctx: MethodContext, hparams: LargeLossHparams) -> None:
        super().__init__(ctx, hparams)
        # 1 = an unobserved entry corrected to positive (uint8: max-reducible by gloo and NCCL alike)
        self.register_buffer("corrected", torch.zeros(ctx.num_train, ctx.num_classes, dtype=torch.uint8))

    def observed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.maximum(batch["observed"], self.corrected[batch["index"]].to(batch["observed"].dtype))

    def record(self, index: torch.Tensor, chosen: torch.Tensor) -> None:
        self.corrected[index] |= chosen.to(torch.uint8)

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        max_over_ranks_(self.corrected)  # every rank's corrections of its own images, on every rank
        return {**super().on_epoch_end(ctx), "llcp_corrected": float(self.corrected.sum())}
