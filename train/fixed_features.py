"""Training the head on FIXED backbone features: the seeds' fixed-feature mode (``--trainable head``, Cole et al.'s
``linear_fixed_features``) and the first phase of LinearInit (``--linear-init N``: then end to end).

The phase takes the backbone features of the training and validation images from the feature cache
(:mod:`train.feature_cache`: computed once, eval transform, eval mode), then trains only the head - and the
method's own parameters, e.g. ROLE's label matrix - on them: LinearInit for ``linear_init`` epochs with Adam at
``linear_init_lr`` and no schedule (the reference's), ``--trainable head`` for ``--epochs`` with the run's
optimiser, learning rate and per-step schedule. The method's step gets the head as its model and the feature
batch as its images, so every method that only needs logits works unchanged; PU-MLC's mixup then mixes feature
vectors instead of images. The best epoch (by the run's selection criterion on val) is restored at the end of a
LinearInit phase, as in the reference code.

Under torchrun every rank extracts its shard of the features and gets them all back; each global batch is
split over the ranks (rank r takes rows r, r + W, ...), each rank's loss is weighted by its share of the batch
and DistributedDataParallel (wrapping the head and the method's parameters for the epoch, see
``train.training_step``) averages the gradients, so every step equals the one-process step. A final batch with
fewer rows than ranks is skipped. Unreadable images have no features: the phase leaves their rows out of training
and validation.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.data.dataset import FULL_LABELS, NEGATIVES
from models.data.types import LabelledImages
from models.network import MultiLabelNet
from train.distributed import current_world
from train.epoch_loop import EpochTotals
from train.feature_cache import FeatureCache
from train.inference import DatasetForward, Rows
from train.methods import Method
from train.optimizer_factory import build_optimizer, build_scheduler
from train.selection import CRITERIA, DEFAULT_CRITERION, Assessment, Criterion, assess
from train.training_step import run_training_step, wrap_training_step

#: Threads for work on cached features (a linear head on batches of feature vectors): too little work per operation
#: to split, so one thread is fastest (bench/README.md, head training threads).
HEAD_THREADS = 1


@contextmanager
def head_threads() -> Iterator[None]:
    """Run the block with at most :data:`HEAD_THREADS` intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, HEAD_THREADS))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class HeadOptimisation:
    """How the head trains on fixed features: optimiser, learning rate, weight decay, momentum and per-step
    schedule over ``epochs`` (LinearInit: Adam, its own learning rate, no schedule)."""

    optimizer: str
    lr: float
    epochs: int
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: str = "none"


class FixedFeaturePhase:
    """State of a phase on fixed features: cached features, the head-only optimiser (and schedule) and the best head
    + method state so far.

    ``observed``: the training labels the method may use (N_train, C), ``negatives`` its observed negatives (1 where
    the protocol observed a negative); ``annotated``: the annotated training labels, given only to a method that
    trains on them (the oracle capability), else None. ``cache``/``cache_key``: where the features come from
    (:mod:`train.feature_cache`; ``cache_key(images)`` gives a split's key), None to extract them every time;
    ``features``: the features of splits by name (``train``, ``val``, ...) when the caller has them already (the
    method chooser trains many heads on one extraction)."""

    def __init__(self, model: MultiLabelNet, method: Method, predictor: DatasetForward, train: LabelledImages,
                 val: LabelledImages, observed: torch.Tensor, negatives: torch.Tensor, annotated: torch.Tensor | None,
                 optimisation: HeadOptimisation, batch_size: int, seed: int,
                 criterion: Criterion = CRITERIA[DEFAULT_CRITERION], val_full_labels: bool = True,
                 cache: FeatureCache | None = None,
                 cache_key: Callable[[LabelledImages], dict[str, Any]] | None = None,
                 features: dict[str, Rows] | None = None) -> None:
        self.model, self.method, self.predictor = model, method, predictor
        self.observed, self.negatives, self.annotated = observed, negatives, annotated
        self.batch_size, self.seed, self.criterion = batch_size, seed, criterion
        self.val_full_labels = val_full_labels
        self.val_labels = val.labels
        self.classes = list(train.classes)
        self.cache, self.cache_key = cache, cache_key
        self.cache_hits: list[bool] = []
        self.given = dict(features or {})
        params = [{"params": list(model.head.parameters())}, *method.param_groups(optimisation.lr)]
        self.optimizer = build_optimizer(optimisation.optimizer, params, optimisation.lr,
                                         weight_decay=optimisation.weight_decay, momentum=optimisation.momentum)
        steps = optimisation.epochs * self.steps_per_epoch(len(train))
        self.scheduler = build_scheduler(optimisation.scheduler, self.optimizer, steps)
        # Extraction must not consume the global RNG (a DataLoader iterator draws a seed from it), or a run
        # resumed inside the phase - which extracts again - would augment differently afterwards.
        devices = [predictor.device] if predictor.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.train_features, self.train_present = self._extract(train, "train")
            self.val_features, self.val_present = self._extract(val, "val")
        self.best_score = -np.inf
        self.best_state: dict[str, Any] | None = None

    def steps_per_epoch(self, count: int) -> int:
        """Optimiser steps of one epoch over ``count`` training rows."""
        return max(1, -(-count // self.batch_size))

    def _extract(self, images: LabelledImages, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features of ``images`` on the device (given, from the cache when there, else computed), and the
        readable ones' mask."""
        if split in self.given:
            rows = self.given[split]
            return rows.values.to(self.predictor.device), rows.present
        self.model.eval()

        def compute() -> Rows:
            return self.predictor.rows(self.model.features, self.predictor.eval_loader(images),
                                       self.model.num_features, f"features ({split})")

        if self.cache is not None and self.cache_key is not None:
            rows, hit = self.cache.get(self.cache_key(images), compute)
            self.cache_hits.append(hit)
        else:
            rows = compute()
        return rows.values.to(self.predictor.device), rows.present

    def head_rows(self, model: MultiLabelNet, images: LabelledImages, split: str) -> Rows:
        """Logits of ``model``'s head (eval mode) on the cached features of ``images`` (computed and cached the first
        time), for evaluating a network whose backbone is this phase's fixed one."""
        features, present = self._extract(images, split)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model.head(features).float().cpu()
        model.train(was_training)
        return Rows(torch.where(present[:, None], logits, torch.zeros_like(logits)), present)

    def state_dict(self) -> dict[str, Any]:
        """Resume state of the phase (the features come back from the cache, or are computed again)."""
        return {"optimizer": self.optimizer.state_dict(), "best_map": float(self.best_score), "best": self.best_state,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.best_score = float(state["best_map"])
        self.best_state = state["best"]

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities of the current head on the cached training features (no augmentation exists)."""
        with torch.inference_mode(), head_threads():
            return torch.sigmoid(self.model.head(self.train_features)).cpu()

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch over the cached training features in a seeded random order."""
        with head_threads():
            return self._train_epoch(epoch)

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        head, device = self.model.head, self.predictor.device
        head.train()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_features.shape[0], generator=generator)
        if not self.train_present.all():
            order = order[self.train_present[order]]
        totals = EpochTotals(epoch)
        world = current_world()
        started = time.perf_counter()
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
            if self.scheduler is not None:
                self.scheduler.step()
            totals.add(out, len(idx), number)
        totals.raise_if_diverged()
        stats, _ = totals.means()
        return {**stats, "phase": 1.0, "lr": float(self.optimizer.param_groups[0]["lr"]),
                "train_seconds": time.perf_counter() - started}

    def validate(self) -> Assessment:
        """The current head's val predictions (cached features) against the val labels, with the criterion."""
        present = self.val_present
        with torch.inference_mode(), head_threads():
            logits = self.model.head(self.val_features[present.to(self.val_features.device)]).cpu().numpy()
        return assess(logits, self.val_labels[present.numpy()], self.classes, self.criterion,
                      full_labels=self.val_full_labels)

    def remember_if_best(self, score: float) -> bool:
        """Keep a copy of the head and the method state when ``score`` is the best of the phase."""
        if score > self.best_score:
            self.best_score = score
            self.best_state = {"head": copy.deepcopy(self.model.head.state_dict()),
                               "method": copy.deepcopy(self.method.state_dict())}
            return True
        return False

    def restore_best(self) -> None:
        """Load the best head and method state of the phase (before the end-to-end phase of LinearInit)."""
        if self.best_state is not None:
            self.model.head.load_state_dict(self.best_state["head"])
            self.method.load_state_dict(self.best_state["method"])
