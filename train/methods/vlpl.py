"""VLPL: vision-language pseudo-labels (Xing et al., CVPR 2024 workshop; reference code mvrl/VLPL): CLIP
pseudo-positives trained as label-smoothed positives, EM's entropy term elsewhere. docs/methods.md ("VLPL")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from train.methods.base import (
    POSITIVES,
    LabelEstimate,
    LossOutput,
    Method,
    MethodContext,
    MethodHparams,
    neg_log,
    register,
)
from train.methods.em import EmHparams, entropy
from train.pseudo_labels.spec import WHOLE_IMAGE, PseudoLabelSpec

VLPL_CLIP = "ViT-L-14-336:openai"  # openai/clip-vit-large-patch14-336 of the reference, in open_clip's names
VLPL_PROMPT = "{}"
VLPL_PRE_RESIZE = 448  # the reference's training resolution, from which its CLIP input is resized


@dataclass
class VlplHparams(EmHparams):
    """EM's ``alpha``, the pseudo-positives' weight ``beta_pos``, the CLIP ``temperature`` and ``threshold``."""

    beta_pos: float = 0.7
    temperature: float = 0.01
    threshold: float = 0.3


def pseudo_positive_loss(p: torch.Tensor) -> torch.Tensor:
    """``0.9 (-log p) + 0.1 (-log(1 - p))``, the reference's label-smoothed term of a pseudo-positive."""
    return 0.9 * neg_log(p) + 0.1 * neg_log(1 - p)


def take_pseudo_positives(method: Method, ctx: MethodContext) -> None:
    """Keep ``ctx.pseudo_positives`` as a non-persistent buffer (checkpoints do not carry them)."""
    positives = ctx.pseudo_positives
    if positives is None:
        raise ValueError(f"method {method.name!r} trains on CLIP pseudo-labels: MethodContext.pseudo_positives is "
                         "missing (the trainer computes them; in code, give a (N_train, C) bool tensor)")
    if tuple(positives.shape) != (ctx.num_train, ctx.num_classes):
        raise ValueError(f"pseudo_positives has shape {tuple(positives.shape)}, expected "
                         f"({ctx.num_train}, {ctx.num_classes})")
    method.register_buffer("pseudo_positives", positives.to(torch.bool).clone(), persistent=False)


@register
class VisionLanguagePseudoLabels(Method):
    """Observed positive: ``-log p``; CLIP pseudo-positive: label-smoothed positive, weight ``beta_pos``; other
    unobserved entries: ``-alpha H(p)``."""

    name = "vlpl"
    Hparams = VlplHparams
    uses_pseudo_labels = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"alpha": 0.2}, "coco": {"alpha": 0.1}, "nus": {"alpha": 0.1}, "cub": {"alpha": 0.01}}
    # main_clip.py: Adam without schedule for 10 epochs, batch 8 (ResNet-50), lr 1e-5 (1e-4 on CUB)
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {
        "*": {"batch_size": 8, "lr": 1e-5, "epochs": 10, "optimizer": "adam", "scheduler": "none"},
        "cub": {"lr": 1e-4}}
    paper = "Xing et al. 2024"
    description = ("EM + CLIP pseudo-positives (softmax over the class prompts above 0.3) trained as "
                   "label-smoothed positives")
    hp: VlplHparams
    pseudo_positives: torch.Tensor

    def __init__(self, ctx: MethodContext, hparams: VlplHparams) -> None:
        super().__init__(ctx, hparams)
        take_pseudo_positives(self, ctx)

    @classmethod
    def pseudo_label_spec(cls, hparams: MethodHparams) -> PseudoLabelSpec:
        assert isinstance(hparams, VlplHparams)
        return PseudoLabelSpec(kind=WHOLE_IMAGE, clip=VLPL_CLIP, prompt=VLPL_PROMPT, temperature=hparams.temperature,
                               threshold=hparams.threshold, pre_resize=VLPL_PRE_RESIZE)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        p = torch.sigmoid(logits)
        z = self.targets(batch)
        pseudo = self.pseudo_positives[batch["index"]] & (z == 0)
        unobserved = torch.where(pseudo, self.hp.beta_pos * pseudo_positive_loss(p), -self.hp.alpha * entropy(p))
        entries = torch.where(z == 1, neg_log(p), torch.where(z == 0, unobserved, torch.zeros_like(p)))
        return LossOutput(entries.mean())

    def label_estimates(self) -> dict[str, LabelEstimate]:
        """CLIP's pseudo-positives beyond the observed labels (``clip_positive_precision``)."""
        return {"clip_positive": LabelEstimate(self.pseudo_positives & (self.ctx.train_observed.to(
            self.pseudo_positives.device) == 0), POSITIVES)}
