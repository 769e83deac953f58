"""``--trainable top``: after LinearInit's head, the last stage and the head train on the cached output of the frozen
stages below (seconds per epoch on a CPU), flipped at random from a second cached pass over the flipped images."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from models.data.types import LabelledImages
from models.network import MultiLabelNet
from train.feature_cache import FeatureCache
from train.fixed_features import FixedFeaturePhase, HeadOptimisation
from train.methods import Method
from train.selection import Criterion, DatasetForward, Rows

CHUNK = 256  # rows per forward of the last stage when predicting a whole split


class LastStage(nn.Module):
    """``model`` from its last stage's input to the logits (its BatchNorms as ``--bn-stats`` keeps them)."""

    def __init__(self, model: MultiLabelNet) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.from_last_stage(x.float())


class TopPhase(FixedFeaturePhase):
    """The last stage (at ``optimisation.lr``) and head (``head_lr_mult`` times it) on cached float16 inputs."""

    def __init__(self, model: MultiLabelNet, method: Method, predictor: DatasetForward, train: LabelledImages,
                 val: LabelledImages, observed: torch.Tensor, negatives: torch.Tensor, annotated: torch.Tensor | None,
                 optimisation: HeadOptimisation, batch_size: int, seed: int, criterion: Criterion,
                 val_full_labels: bool, cache: FeatureCache, cache_key: Callable[[LabelledImages], dict[str, Any]],
                 head_lr_mult: float = 1.0) -> None:
        self.threads, self.head_lr_mult = torch.get_num_threads(), head_lr_mult  # convolutions: every thread pays
        super().__init__(model, method, predictor, train, val, observed, negatives, annotated, optimisation, batch_size,
                         seed, criterion, val_full_labels, cache, cache_key, head=LastStage(model))

    def param_groups(self) -> list[dict[str, Any]]:
        """The last stage's parameters at the phase's lr, the head's at ``head_lr_mult`` times it, the method's."""
        head, lr = {id(p) for p in self.model.head.parameters()}, self.optimisation.lr
        body = [p for p in self.model.parameters() if p.requires_grad and id(p) not in head]
        return [{"params": body}, {"params": list(self.model.head.parameters()), "lr": lr * self.head_lr_mult},
                *self.method.param_groups(lr)]

    def extract_views(self, train: LabelledImages) -> None:
        """The flipped training images' inputs (the random flip of training)."""
        self.flipped, _ = self._extract(train, "train, flipped")

    def _extract(self, images: LabelledImages, split: str, later: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The last stage's inputs of ``images`` (float16; flipped left-right for the split ``train, flipped``)."""
        flipped = split.endswith("flipped")
        self.model.eval()

        def forward(x: torch.Tensor) -> torch.Tensor:
            return self.model.below_last_stage(x.flip(-1) if flipped else x).half()

        def compute() -> Rows:
            return self.predictor.rows(forward, self.predictor.eval_loader(images), 0, f"last-stage inputs ({split})")

        assert self.cache is not None and self.cache_key is not None
        key = {**self.cache_key(images), "below_last_stage": True, "flipped": flipped}
        rows, hit = self.cache.get(key, compute)
        self.cache_hits.append(hit)
        return rows.values.half(), rows.present

    def batches(self, epoch: int) -> Iterator[tuple[int, int, dict[str, torch.Tensor]]]:
        """:meth:`FixedFeaturePhase.batches` with each row flipped left-right with probability 0.5 (seeded)."""
        generator = torch.Generator().manual_seed(self.seed * 7_919 + epoch)
        for number, size, batch in super().batches(epoch):
            flip = torch.rand(len(batch["index"]), generator=generator) < 0.5
            flipped = self.flipped.index_select(0, batch["index"].cpu()).to(batch["images"].device)
            batch["images"] = torch.where(flip.to(flipped.device)[:, None, None, None], flipped, batch["images"])
            yield number, size, batch

    def _logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The network's logits for cached last-stage inputs, in chunks, in eval mode (the mode is restored)."""
        was_training = self.head.training
        self.head.eval()
        with torch.inference_mode():
            out = torch.cat([self.head(rows[i:i + CHUNK]).float() for i in range(0, len(rows), CHUNK)])
        self.head.train(was_training)
        return out.cpu()

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch of the last stage and head (phase 2 in metrics.jsonl)."""
        return {**super().train_epoch(epoch), "phase": 2.0}
