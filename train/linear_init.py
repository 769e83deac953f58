"""LinearInit (Cole et al. 2021): train the linear head on FIXED backbone features first, then end to end.

Phase 1 extracts the backbone features of the training and validation images once (eval transform, eval
mode), then trains only the head - and the method's own parameters, e.g. ROLE's label matrix - for
``linear_init`` epochs with Adam at ``linear_init_lr``. The method's ``training_step`` gets the head as its
model and the feature batch as its images, so every method works unchanged. The best phase-1 epoch (val mAP)
is restored before the end-to-end phase, as in the reference code.

Under torchrun every rank extracts its shard of the features and gets them all back; each global batch is
split over the ranks (rank r takes rows r, r + W, ...), each rank's loss is weighted by its share of the batch
and DistributedDataParallel (wrapping the head and the method's parameters for the epoch, see
``train.training_step``) averages the gradients, so every step equals the one-process step. A final batch with
fewer rows than ranks is skipped. Unreadable images have no features: phase 1 leaves their rows out of training
and validation.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import numpy as np
import torch

from train.data.dataset import NEGATIVES, ImageLabelDataset
from train.distributed import current_world, sum_over_ranks
from train.inference import predict_rows
from train.metrics import evaluate
from train.optimizers import build_optimizer
from train.training_step import run_training_step, wrap_training_step


class TrainerParts(Protocol):
    """What phase 1 uses of the trainer (:class:`train.trainer.Trainer` has all of it), named here so that this
    module does not import the trainer that imports it."""

    cfg: Any
    model: Any
    method: Any
    device: torch.device
    splits: Any
    train_set: Any
    eval_transform: Any
    channels_last: bool
    skips: Any
    precision: Any
    classes: list[str]

    def _eval_loader(self, dataset: Any) -> Any: ...


class LinearPhase:
    """Phase-1 state: cached features, the head-only optimiser and the best head + method state so far."""

    def __init__(self, trainer: TrainerParts) -> None:
        self.trainer = trainer
        cfg = trainer.cfg
        model = trainer.model
        params = [{"params": list(model.head.parameters())}, *trainer.method.param_groups(cfg.linear_init_lr)]
        self.optimizer = build_optimizer("adam", params, cfg.linear_init_lr)
        # Extraction must not consume the global RNG (a DataLoader iterator draws a seed from it), or a run
        # resumed inside phase 1 - which extracts again - would augment differently afterwards.
        devices = [trainer.device] if trainer.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.train_features, self.train_present = self._extract(trainer.splits.train)
            self.val_features, self.val_present = self._extract(trainer.splits.val)
        self.best_map = -np.inf
        self.best_state: dict[str, Any] | None = None

    def _extract(self, images: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features of ``images`` on the device, and the mask of the readable ones."""
        t = self.trainer
        loader = t._eval_loader(ImageLabelDataset(images, t.eval_transform))
        t.model.eval()
        rows = predict_rows(t.model.features, loader, t.model.num_features, t.device, t.precision.autocast,
                            t.channels_last, t.skips)
        return rows.values.to(t.device), rows.present

    def state_dict(self) -> dict[str, Any]:
        """Resume state of phase 1 (the features are recomputed, not saved)."""
        return {"optimizer": self.optimizer.state_dict(), "best_map": float(self.best_map), "best": self.best_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.best_map = float(state["best_map"])
        self.best_state = state["best"]

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities of the current head on the cached training features (no augmentation exists)."""
        with torch.inference_mode():
            return torch.sigmoid(self.trainer.model.head(self.train_features)).cpu()

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch over the cached training features in a seeded random order."""
        t = self.trainer
        head, method = t.model.head, t.method
        head.train()
        generator = torch.Generator().manual_seed(t.cfg.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_features.shape[0], generator=generator)
        if not self.train_present.all():
            order = order[self.train_present[order]]
        n = len(order)
        observed, negatives, full = t.train_set.observed, t.train_set.negatives, t.train_set.full
        total, seen = 0.0, 0
        world = current_world()
        # this epoch's step module (DDP under torchrun); dropped at the end of the epoch, so it never coexists
        # with the end-to-end wrapper of the same method parameters
        step = wrap_training_step(head, method, t.device)
        for start in range(0, n, t.cfg.batch_size):
            global_idx = order[start : start + t.cfg.batch_size]
            if len(global_idx) < world.size:
                continue
            idx = global_idx[world.rank :: world.size]
            batch = {"images": self.train_features[idx.to(t.device)], "observed": observed[idx].to(t.device),
                     NEGATIVES: negatives[idx].to(t.device), "full": full[idx].to(t.device), "index": idx.to(t.device)}
            out = run_training_step(step, batch)
            self.optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(out.loss):
                raise FloatingPointError(f"loss is {out.loss.item()} in linear-init epoch {epoch}")
            # this rank's share of the global mean; DDP's average of the gradients then gives the one-process step
            (out.loss * (len(idx) * world.size / len(global_idx))).backward()
            self.optimizer.step()
            total += out.loss.item() * len(idx)
            seen += len(idx)
        sums = sum_over_ranks({"loss": total, "seen": float(seen)})
        return {"loss": sums["loss"] / max(sums["seen"], 1), "phase": 1.0}

    def validate(self) -> dict[str, Any]:
        """Val metrics of the current head on the cached validation features."""
        t = self.trainer
        present = self.val_present
        with torch.inference_mode():
            logits = t.model.head(self.val_features[present.to(self.val_features.device)]).cpu().numpy()
        return evaluate(logits, t.splits.val.labels[present.numpy()], t.classes)

    def remember_if_best(self, val_map: float) -> bool:
        """Keep a copy of the head and the method state when ``val_map`` is the best of phase 1."""
        if val_map > self.best_map:
            self.best_map = val_map
            self.best_state = {"head": copy.deepcopy(self.trainer.model.head.state_dict()),
                               "method": copy.deepcopy(self.trainer.method.state_dict())}
            return True
        return False

    def restore_best(self) -> None:
        """Load the best phase-1 head and method state (before the end-to-end phase)."""
        if self.best_state is not None:
            self.trainer.model.head.load_state_dict(self.best_state["head"])
            self.trainer.method.load_state_dict(self.best_state["method"])
