"""IUN, "ignore unobserved positives" (Cole et al., CVPR 2021): the observed positive plus every TRUE negative (an
oracle reference bound)."""

from __future__ import annotations

from typing import ClassVar

import torch

from train.methods.base import LossOutput, Method, neg_log, register


@register
class IgnoreUnobservedPositives(Method):
    """One observed positive + all true negatives (uses the annotated labels to find the negatives)."""

    name = "iun"
    trains_on_full_labels = True
    paper = "Cole et al. 2021"
    starts_at_label_prior: ClassVar[bool] = True
    description = "reference: observed positive + all true negatives (needs full labels)"

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        p = torch.sigmoid(logits)
        observed, full = batch["observed"], self.targets(batch)
        loss = torch.where(observed > 0.5, neg_log(p), torch.where(full < 0.5, neg_log(1.0 - p), torch.zeros_like(p)))
        return LossOutput(loss.mean())
