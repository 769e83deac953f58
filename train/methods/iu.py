"""IU, "ignore unobserved" (Cole et al. 2021): the observed positives and negatives only; it needs a protocol that
observes negatives (``--observed 'single?neg=N'``)."""

from __future__ import annotations

import torch

from models.data.dataset import NEGATIVES
from train.methods.base import LossOutput, Method, MethodContext, MethodHparams, neg_log, register


@register
class IgnoreUnobserved(Method):
    """Observed positives and observed negatives only."""

    name = "iu"
    paper = "Cole et al. 2021"
    uses_observed_negatives = True
    description = "observed positives + negatives (`single?neg=N`)"

    def __init__(self, ctx: MethodContext, hparams: MethodHparams) -> None:
        super().__init__(ctx, hparams)
        if not bool((ctx.train_observed < 0).any()):
            raise ValueError("method 'iu' trains on known negatives, and these labels have none: give some (a "
                             "'-name' entry in labels.csv says the image is not 'name', and the answers of a label "
                             "review, --review, add the ones you said no to); on a benchmark, draw them with "
                             "--observed 'single?neg=N' (N per image, or all)")

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        p = torch.sigmoid(logits)
        positive, negative = batch["observed"] > 0.5, batch[NEGATIVES] > 0.5
        loss = torch.where(positive, neg_log(p), torch.where(negative, neg_log(1.0 - p), torch.zeros_like(p)))
        return LossOutput(loss.mean())
