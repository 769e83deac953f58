"""LAC: label-aware global consistency (Xie, Xiao, Huang, NeurIPS 2022; reference code xiemk/SPML-LAC), on the
label-wise embedding head. Stage 1: AN plus pseudo-label consistency on a strong view; stage 2 adds a SupCon loss over a
queue of embedding pairs, in float32. Departures from the reference: docs/methods.md ("LAC")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from models.data.augment import StrongTransform
from models.preprocess import EvalTransform
from train.distributed import gather_varying
from train.methods.base import EpochEndContext, LossOutput, Method, MethodContext, MethodHparams, register

STRONG = "images_strong"


def plc_loss(strong_logits: torch.Tensor, weak_logits: torch.Tensor, observed: torch.Tensor,
             threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LAC's pseudo-label consistency: (loss, hard targets); BCE of the strong logits on the confident entries of the
    weak ones, averaged over them (0 when none)."""
    q = torch.sigmoid(weak_logits.detach()) + observed
    target = (q >= threshold).to(strong_logits.dtype)
    mask = ((q >= threshold) | (q < 1.0 - threshold)).to(strong_logits.dtype)
    bce = F.binary_cross_entropy_with_logits(strong_logits, target, reduction="none")
    return (mask * bce).sum() / mask.sum().clamp(min=1.0), target


def supcon_loss(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """SupCon over ``features (M, V, d)`` with ``labels (M,)`` as LAC's reference computes it; 0 for an empty input."""
    m, views, _ = features.shape
    if m == 0:
        return features.sum() * 0.0
    flat = torch.cat(torch.unbind(features, dim=1), dim=0)  # view-major: all first views, then all second...
    lab = labels.repeat(views)
    logits = flat @ flat.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = ~torch.eye(m * views, dtype=torch.bool, device=flat.device)
    positive = (lab[:, None] == lab[None, :]) & not_self
    denominator = torch.logsumexp(logits.masked_fill(~not_self, float("-inf")), dim=1, keepdim=True)
    log_prob = logits - denominator
    pos = positive.to(flat.dtype)
    mean_pos = (pos * log_prob).sum(1) / pos.sum(1).clamp(min=1.0)
    return -mean_pos.mean()


@torch.no_grad()
def class_embedding_similarity(embeddings: torch.Tensor) -> float:
    """Mean cosine between different classes' embeddings of the same image over ``(N, C, D)``."""
    n, c, _ = embeddings.shape
    if c < 2:
        return 1.0
    unit = F.normalize(embeddings.float(), dim=-1)
    gram = unit @ unit.transpose(1, 2)  # (N, C, C)
    return float((gram.sum() - gram.diagonal(dim1=1, dim2=2).sum()) / (n * c * (c - 1)))


@dataclass
class LacHparams(MethodHparams):
    """PLC's threshold per stage, the loss weights (0 switches a term off), SupCon's temperature, the queue size (raised
    to batch_size * C), the projector width and the number of ``stages`` (1 or 2)."""

    threshold_stage1: float = 0.6
    threshold_stage2: float = 0.9
    plc_weight: float = 1.0
    lac_weight: float = 1.0
    temperature: float = 0.5
    queue_size: int = 512
    feat_dim: int = 128
    stages: int = 2


@register
class LabelAwareConsistency(Method):
    """AN + pseudo-label consistency (stage 1), + label-aware contrastive queue loss (stage 2)."""

    name = "lac"
    Hparams = LacHparams
    required_head = "lem"
    # Only CUB's stage-1 threshold is published (author's config in the reference repo's issue #2); the other
    # values are the README's COCO defaults, used for every dataset.
    presets: ClassVar[dict[str, dict[str, Any]]] = {"cub": {"threshold_stage1": 0.5}}
    # The README's optimisation for every dataset: AdamW (wd 1e-2), OneCycle to 1e-4, EMA 0.9997, batch 32,
    # 40 epochs per stage
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {
        "*": {"optimizer": "adamw", "weight_decay": 1e-2, "scheduler": "onecycle", "lr": 1e-4, "ema": 0.9997,
              "batch_size": 32, "epochs": 40}}
    needs_embeddings = True
    leaves_parameters_unused = True  # the projector: unused in stage 1, and on a rank that selects no pair
    paper = "Xie, Xiao, Huang 2022"
    description = ("label-wise embedding head; AN + weak/strong-view pseudo-label consistency, then (stage 2) "
                   "+ a label-aware contrastive loss over a memory queue")

    def __init__(self, ctx: MethodContext, hparams: LacHparams) -> None:
        super().__init__(ctx, hparams)
        if hparams.stages not in (1, 2):
            raise ValueError(f"lac: stages must be 1 or 2, got {hparams.stages}")
        if not 0.5 <= hparams.threshold_stage1 <= 1.0 or not 0.5 <= hparams.threshold_stage2 <= 1.0:
            raise ValueError("lac: thresholds must be in [0.5, 1] (q >= delta and q < 1 - delta must not overlap)")
        if hparams.temperature <= 0:
            raise ValueError("lac: temperature must be > 0")
        width = ctx.feature_width or 512
        self.projector = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, hparams.feat_dim))
        capacity = max(hparams.queue_size, ctx.batch_size * ctx.num_classes)
        self.register_buffer("stage", torch.tensor(1, dtype=torch.long))
        self.register_buffer("queue", torch.zeros(capacity, 2, hparams.feat_dim))
        self.register_buffer("queue_labels", torch.full((capacity,), -1, dtype=torch.long))  # -1: empty slot
        self.register_buffer("queue_ptr", torch.tensor(0, dtype=torch.long))
        # the stage as a Python int beside its buffer, so that a step does not read a device tensor to branch
        self._stage = 1
        self.register_load_state_dict_post_hook(lambda module, _keys: module._read_stage())
        self._last_embeddings: torch.Tensor | None = None  # the weak view's, of the latest batch (a log line)

    def _read_stage(self) -> None:
        self._stage = int(self.stage)

    def extra_views(self, preprocessing: EvalTransform) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        return {STRONG: StrongTransform(preprocessing)}

    @classmethod
    def stage_epochs(cls, hparams: MethodHparams, epochs: int) -> list[int]:
        assert isinstance(hparams, LacHparams)
        return [epochs] * hparams.stages  # the paper trains both stages for the same number of epochs (40)

    def start_stage(self, stage: int) -> None:
        self.stage.fill_(stage)
        self._stage = stage
        for layer in self.projector:  # the reference builds a fresh projector for stage 2
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        self.queue.zero_()
        self.queue_labels.fill_(-1)
        self.queue_ptr.zero_()

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        return [{"params": list(self.projector.parameters())}]

    @property
    def threshold(self) -> float:
        """PLC's delta in the current stage."""
        return self.hp.threshold_stage2 if self._stage >= 2 else self.hp.threshold_stage1

    def _enqueue(self, feats: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this batch's items at the queue pointer; returns the valid queue entries and the batch's items with
        their gradients. Under torchrun every rank enqueues the same gathered global batch."""
        feats, _ = gather_varying(feats)
        labels, _ = gather_varying(labels)
        count, capacity = feats.shape[0], self.queue.shape[0]
        ptr = int(self.queue_ptr)
        if ptr + count >= capacity:
            ptr = 0
        live = torch.cat([self.queue[:ptr], feats, self.queue[ptr + count:]])  # a copy: the writes below keep it
        self.queue[ptr:ptr + count] = feats.detach()
        self.queue_labels[ptr:ptr + count] = labels
        self.queue_ptr.fill_(ptr + count)
        valid = self.queue_labels >= 0
        return live[valid], self.queue_labels[valid]

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """``logits``: the weak view's; ``batch`` also holds ``logits_strong`` and the per-class ``embeddings`` /
        ``embeddings_strong`` of both views (one model call)."""
        strong = batch["logits_strong"]
        weak_emb, strong_emb = batch["embeddings"], batch["embeddings_strong"]
        n = logits.shape[0]
        z = self.targets(batch)
        an = F.binary_cross_entropy_with_logits(logits, z)
        plc, target = plc_loss(strong, logits, z, self.threshold)
        loss = an + self.hp.plc_weight * plc
        logs: dict[str, torch.Tensor | float] = {"an": an.detach(), "plc": plc.detach(),
                                                 "plc_positives_per_image": target.sum() / n}
        self._last_embeddings = weak_emb.detach()
        if self._stage >= 2 and self.hp.lac_weight > 0:
            rows, cols = torch.nonzero(target > 0.5, as_tuple=True)
            with torch.autocast(weak_emb.device.type, enabled=False):
                pairs = torch.stack([weak_emb[rows, cols].float(), strong_emb[rows, cols].float()], dim=1)
                projected = F.normalize(self.projector(pairs), dim=-1)
                feats, labels = self._enqueue(projected, cols)
                lac = supcon_loss(feats, labels, self.hp.temperature)
            loss = loss + self.hp.lac_weight * lac
            logs.update(lac=lac.detach(), queue_entries=float(labels.numel()))
        return LossOutput(loss, logs)

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        """Logs ``class_embedding_cos`` on the epoch's last training batch."""
        if self._last_embeddings is None:
            return {}
        similarity = class_embedding_similarity(self._last_embeddings)
        self._last_embeddings = None
        return {"class_embedding_cos": similarity}
