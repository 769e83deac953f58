"""AEVLP: GPR loss with DAMP pseudo-labels (Tran et al., ICCV 2025; reference code Fsoft-AIC/AEVLP): GR-Loss on unknown
labels, CLIP pseudo-positives from the whole image and a grid of crops weighted by ``1 - v'``, plus the
expected-positives regulariser. Settings and the reference's pitfalls: docs/methods.md ("AEVLP")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from train.methods.base import (
    POSITIVES,
    LabelEstimate,
    LossOutput,
    MethodContext,
    MethodHparams,
    expected_positives_regulariser,
    register,
)
from train.methods.epr import EXPECTED_POSITIVES
from train.methods.gr_loss import GR_LOG_EPSILON, GeneralizedRobustLoss, GrLossHparams, gr_unobserved_loss, gr_weights
from train.methods.vlpl import take_pseudo_positives
from train.pseudo_labels.spec import IMAGE_AND_GRID, PseudoLabelSpec

AEVLP_CLIP = "ViT-B-16:openai"  # configs/*.json: clip_model ViT-B/16, clip_weight openai
AEVLP_PROMPT = "a photo of a {}."  # PromptLearner: ctx_init + " " + name + "."


@dataclass
class AevlpHparams(GrLossHparams):
    """GR-Loss's ``beta``, ``alpha``, ``q2``, ``q3``; the pseudo-positives' weight bounds ``lam`` and positive share
    ``rho``; ``reg`` and ``k`` (None: the published or the run's k) of the regulariser; the pseudo-label settings."""

    lam: tuple[float, float] = (0.8, 0.3)
    rho: float = 0.9
    reg: float = 0.001
    k: float | None = None
    temperature: float = 0.01
    threshold: float = 0.5
    top_k: int = 3
    eta: float = 0.1
    grid_size: int = 4
    negative_ratio: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lam = (float(self.lam[0]), float(self.lam[1]))
        if not 0.0 <= self.lam[1] <= self.lam[0] <= 1.0:
            raise ValueError(f"lam = (lam1, lam2) needs 0 <= lam2 <= lam1 <= 1, got {self.lam}")


_BETA_COCO = (0.0, 10.0, -2.0, -8.0)
_ALPHA = (0.5, 2.0, 0.8, 0.5)


@register
class AdaptiveEfficientVisionLanguagePseudoLabels(GeneralizedRobustLoss):
    """GR-Loss on unknown labels, weighted CLIP pseudo-positives, expected-positives regulariser."""

    name = "aevlp"
    left_out_of_auto = ""  # GR Loss's measurement is not its own (the chooser leaves it out: CLIP pseudo-labels)
    Hparams = AevlpHparams
    uses_pseudo_labels = True
    uses_expected_positives = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "voc": {"beta": (0.0, 2.0, -2.0, -2.0), "alpha": _ALPHA, "q2": 0.01, "q3": 1.0, "lam": (0.7, 0.4),
                "rho": 0.9, "reg": 0.05, "k": EXPECTED_POSITIVES["voc"], "temperature": 0.01, "eta": 0.0,
                "threshold": 0.5, "grid_size": 4, "negative_ratio": 0.2, "top_k": 3},
        "coco": {"beta": _BETA_COCO, "alpha": _ALPHA, "q2": 0.01, "q3": 1.0, "lam": (0.7, 0.5), "rho": 0.9,
                 "reg": 0.001, "k": EXPECTED_POSITIVES["coco"], "temperature": 0.01, "eta": 0.3, "threshold": 0.5,
                 "grid_size": 4, "negative_ratio": 0.3, "top_k": 3},
        "nus": {"beta": _BETA_COCO, "alpha": _ALPHA, "q2": 0.01, "q3": 1.0, "lam": (0.7, 0.5), "rho": 0.9,
                "reg": 0.001, "k": EXPECTED_POSITIVES["nus"], "temperature": 0.01, "eta": 0.3, "threshold": 0.6,
                "grid_size": 4, "negative_ratio": 0.2, "top_k": 3},
        "cub": {"beta": _BETA_COCO, "alpha": _ALPHA, "q2": 0.01, "q3": 1.5, "lam": (0.8, 0.2), "rho": 0.9,
                "reg": 0.01, "k": EXPECTED_POSITIVES["cub"], "temperature": 0.1, "eta": 0.005, "threshold": 0.005,
                "grid_size": 5, "negative_ratio": 0.2, "top_k": 32}}
    # configs/*.json: Adam at 1e-5 without schedule, the head at 10x (--head-lr-mult)
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {
        "*": {"batch_size": 8, "lr": 1e-5, "head_lr_mult": 10.0, "epochs": 8, "optimizer": "adam",
              "scheduler": "none"},
        "coco": {"batch_size": 16}, "nus": {"batch_size": 16, "epochs": 10}, "cub": {"epochs": 10}}
    paper = "Tran et al. 2025"
    description = ("GR-Loss on unknown labels + CLIP pseudo-positives from the whole image and a grid of crops, "
                   "weighted by a clamped v(p), + expected-positives regulariser")
    hp: AevlpHparams
    pseudo_positives: torch.Tensor

    def __init__(self, ctx: MethodContext, hparams: AevlpHparams) -> None:
        super().__init__(ctx, hparams)
        take_pseudo_positives(self, ctx)

    @classmethod
    def pseudo_label_spec(cls, hparams: MethodHparams) -> PseudoLabelSpec:
        assert isinstance(hparams, AevlpHparams)
        return PseudoLabelSpec(kind=IMAGE_AND_GRID, clip=AEVLP_CLIP, prompt=AEVLP_PROMPT,
                               temperature=hparams.temperature, threshold=hparams.threshold,
                               grid_size=hparams.grid_size, top_k=hparams.top_k, eta=hparams.eta,
                               negative_ratio=hparams.negative_ratio)

    def expected_positives(self) -> float:
        """k of the regulariser: ``--hp k`` or the preset's, else the run's."""
        return self.hp.k if self.hp.k is not None else self.ctx.expected_positives

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        z = self.targets(batch)
        p = torch.sigmoid(logits)
        k, v = gr_weights(p.detach(), self.schedule())
        pseudo = self.pseudo_positives[batch["index"]] & (z == 0)
        lam1, lam2 = self.hp.lam
        confidence = 1 - v.clamp(min=1 - lam1, max=1 - lam2)
        rho = self.hp.rho
        pseudo_term = confidence * (rho * -torch.log(p + GR_LOG_EPSILON)
                                    + (1 - rho) * -torch.log(1 - p + GR_LOG_EPSILON))
        unknown = gr_unobserved_loss(logits, k, v, self.hp.q2, self.hp.q3)
        entries = torch.where(z == 1, -torch.log(p + GR_LOG_EPSILON),
                              torch.where(pseudo, pseudo_term, torch.where(z == 0, unknown, torch.zeros_like(p))))
        reg = expected_positives_regulariser(p, self.expected_positives())
        return LossOutput(entries.mean() + self.hp.reg * reg, {"epr_reg": reg.detach()})

    def label_estimates(self) -> dict[str, LabelEstimate]:
        """CLIP's pseudo-positives beyond the observed labels (``clip_positive_precision``)."""
        return {"clip_positive": LabelEstimate(self.pseudo_positives & (self.ctx.train_observed.to(
            self.pseudo_positives.device) == 0), POSITIVES)}
