"""LinearInit (Cole et al. 2021): train the linear head on FIXED backbone features first, then end to end.

Phase 1 extracts the backbone features of the training and validation images once (eval transform, eval
mode), then trains only the head - and the method's own parameters, e.g. ROLE's label matrix - for
``linear_init`` epochs with Adam at ``linear_init_lr``. The method's step gets the head as its model and the
feature batch as its images, so every method works unchanged. The best phase-1 epoch (by the run's selection
criterion on val) is restored before the end-to-end phase, as in the reference code.

Under torchrun every rank extracts its shard of the features and gets them all back; each global batch is
split over the ranks (rank r takes rows r, r + W, ...), each rank's loss is weighted by its share of the batch
and DistributedDataParallel (wrapping the head and the method's parameters for the epoch, see
``train.training_step``) averages the gradients, so every step equals the one-process step. A final batch with
fewer rows than ranks is skipped. Unreadable images have no features: phase 1 leaves their rows out of training
and validation.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from models.resnet import MultiLabelResNet
from train.data.dataset import FULL_LABELS, NEGATIVES
from train.data.types import LabelledImages
from train.distributed import current_world
from train.epoch_loop import EpochTotals
from train.inference import Predictor
from train.methods import Method
from train.optimizers import build_optimizer
from train.selection import CRITERIA, DEFAULT_CRITERION, Assessment, Criterion, assess
from train.training_step import run_training_step, wrap_training_step


class LinearPhase:
    """Phase-1 state: cached features, the head-only optimiser and the best head + method state so far.

    ``observed``: the training labels the method may use (N_train, C), ``negatives`` its observed negatives (1 where
    the protocol observed a negative); ``annotated``: the annotated training labels, given only to a method that
    trains on them (the oracle capability), else None."""

    def __init__(self, model: MultiLabelResNet, method: Method, predictor: Predictor, train: LabelledImages,
                 val: LabelledImages, observed: torch.Tensor, negatives: torch.Tensor, annotated: torch.Tensor | None,
                 lr: float, batch_size: int, seed: int, criterion: Criterion = CRITERIA[DEFAULT_CRITERION],
                 val_full_labels: bool = True) -> None:
        self.model, self.method, self.predictor = model, method, predictor
        self.observed, self.negatives, self.annotated = observed, negatives, annotated
        self.batch_size, self.seed, self.criterion = batch_size, seed, criterion
        self.val_full_labels = val_full_labels
        self.val_labels = val.labels
        self.classes = list(train.classes)
        params = [{"params": list(model.head.parameters())}, *method.param_groups(lr)]
        self.optimizer = build_optimizer("adam", params, lr)
        # Extraction must not consume the global RNG (a DataLoader iterator draws a seed from it), or a run
        # resumed inside phase 1 - which extracts again - would augment differently afterwards.
        devices = [predictor.device] if predictor.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.train_features, self.train_present = self._extract(train)
            self.val_features, self.val_present = self._extract(val)
        self.best_score = -np.inf
        self.best_state: dict[str, Any] | None = None

    def _extract(self, images: LabelledImages) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features of ``images`` on the device, and the mask of the readable ones."""
        self.model.eval()
        rows = self.predictor.rows(self.model.features, self.predictor.eval_loader(images), self.model.num_features)
        return rows.values.to(self.predictor.device), rows.present

    def state_dict(self) -> dict[str, Any]:
        """Resume state of phase 1 (the features are recomputed, not saved)."""
        return {"optimizer": self.optimizer.state_dict(), "best_map": float(self.best_score), "best": self.best_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.best_score = float(state["best_map"])
        self.best_state = state["best"]

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities of the current head on the cached training features (no augmentation exists)."""
        with torch.inference_mode():
            return torch.sigmoid(self.model.head(self.train_features)).cpu()

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch over the cached training features in a seeded random order."""
        head, device = self.model.head, self.predictor.device
        head.train()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_features.shape[0], generator=generator)
        if not self.train_present.all():
            order = order[self.train_present[order]]
        totals = EpochTotals(epoch)
        world = current_world()
        # this epoch's step module (DDP under torchrun); dropped at the end of the epoch, so it never coexists
        # with the end-to-end wrapper of the same method parameters
        step = wrap_training_step(head, self.method, device)
        for number, start in enumerate(range(0, len(order), self.batch_size), start=1):
            global_idx = order[start : start + self.batch_size]
            if len(global_idx) < world.size:
                continue
            idx = global_idx[world.rank :: world.size]
            batch = {"images": self.train_features[idx.to(device)], "observed": self.observed[idx].to(device),
                     NEGATIVES: self.negatives[idx].to(device), "index": idx.to(device)}
            if self.annotated is not None:
                batch[FULL_LABELS] = self.annotated[idx].to(device)
            out = run_training_step(step, batch)
            self.optimizer.zero_grad(set_to_none=True)
            # this rank's share of the global mean; DDP's average of the gradients then gives the one-process step
            (out.loss * (len(idx) * world.size / len(global_idx))).backward()
            self.optimizer.step()
            totals.add(out, len(idx), number)
        totals.raise_if_diverged()
        stats, _ = totals.means()
        return {**stats, "phase": 1.0}

    def validate(self) -> Assessment:
        """The current head's val predictions (cached features) against the val labels, with the criterion."""
        present = self.val_present
        with torch.inference_mode():
            logits = self.model.head(self.val_features[present.to(self.val_features.device)]).cpu().numpy()
        return assess(logits, self.val_labels[present.numpy()], self.classes, self.criterion,
                      full_labels=self.val_full_labels)

    def remember_if_best(self, score: float) -> bool:
        """Keep a copy of the head and the method state when ``score`` is the best of phase 1."""
        if score > self.best_score:
            self.best_score = score
            self.best_state = {"head": copy.deepcopy(self.model.head.state_dict()),
                               "method": copy.deepcopy(self.method.state_dict())}
            return True
        return False

    def restore_best(self) -> None:
        """Load the best phase-1 head and method state (before the end-to-end phase)."""
        if self.best_state is not None:
            self.model.head.load_state_dict(self.best_state["head"])
            self.method.load_state_dict(self.best_state["method"])
