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
from train.fixed_features import FixedFeaturePhase, HeadOptimisation, head_optimiser
from train.methods import Method
from train.selection import Criterion, DatasetForward, Rows

CHUNK = 256  # rows per forward of the last stage when predicting a whole split


class LastStage(nn.Module):
    """``model`` from its last stage's input to the logits; with ``frozen_statistics`` its BatchNorms keep theirs."""

    def __init__(self, model: MultiLabelNet, frozen_statistics: bool) -> None:
        super().__init__()
        self.model = model
        self.frozen_statistics = frozen_statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.from_last_stage(x.float())

    def train(self, mode: bool = True) -> LastStage:
        super().train(mode)
        for module in self.modules() if self.frozen_statistics else ():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self


class TopPhase(FixedFeaturePhase):
    """The last stage (at ``optimisation.lr``) and head (``head_lr_mult`` times it) on cached float16 inputs."""

    def __init__(self, model: MultiLabelNet, method: Method, predictor: DatasetForward, train: LabelledImages,
                 val: LabelledImages, observed: torch.Tensor, negatives: torch.Tensor, annotated: torch.Tensor | None,
                 optimisation: HeadOptimisation, batch_size: int, seed: int, criterion: Criterion,
                 val_full_labels: bool, cache: FeatureCache, cache_key: Callable[[LabelledImages], dict[str, Any]],
                 head_lr_mult: float = 1.0, frozen_statistics: bool = True) -> None:
        self.threads = torch.get_num_threads()  # convolutions: every thread pays
        super().__init__(model, method, predictor, train, val, observed, negatives, annotated, optimisation, batch_size,
                         seed, criterion, val_full_labels, cache, cache_key, head=LastStage(model, frozen_statistics))
        self.flipped, _ = self._extract(train, "train, flipped")
        head = {id(p) for p in model.head.parameters()}
        body = [p for p in model.parameters() if p.requires_grad and id(p) not in head]
        groups = [{"params": body}, {"params": list(model.head.parameters()), "lr": optimisation.lr * head_lr_mult},
                  *method.param_groups(optimisation.lr)]
        self.optimizer, self.scheduler = head_optimiser(groups, optimisation, self.total_steps)

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
