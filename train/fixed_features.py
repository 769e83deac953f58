"""Training the head on FIXED backbone features: ``--trainable head`` and the first phase of LinearInit. Only the head
and the method's parameters train, on cached features (:mod:`train.feature_cache`); a LinearInit phase restores its best
epoch at the end. Under torchrun every step equals the one-process step (docs/distributed.md)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from models.data.dataset import FULL_LABELS, NEGATIVES
from models.data.types import LabelledImages
from models.network import MultiLabelNet
from train.distributed import current_world
from train.epoch import (
    DIVERGED_HINT,
    EpochTotals,
    build_optimizer,
    build_scheduler,
    method_step,
    run_training_step,
    wrap_training_step,
)
from train.feature_cache import FeatureCache
from train.methods import Method
from train.selection import CRITERIA, DEFAULT_CRITERION, Assessment, Criterion, DatasetForward, Rows, assess

#: Threads for work on cached features (a linear head on batches of feature vectors): too little work per operation
#: to split, so one thread is fastest (bench/README.md, head training threads).
HEAD_THREADS = 1


@contextmanager
def head_threads(limit: int = HEAD_THREADS) -> Iterator[None]:
    """Run the block with at most ``limit`` intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, limit))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class HeadOptimisation:
    """How the head trains on fixed features: optimiser, lr, weight decay, momentum, schedule, epochs."""

    optimizer: str
    lr: float
    epochs: int
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: str = "none"


class FixedFeaturePhase:
    """State of a phase on fixed features: the features, the head-only optimiser and schedule, and the best head +
    method state so far. ``annotated`` is given only to an oracle method; ``features``: splits the caller extracted
    already."""

    threads = HEAD_THREADS  # intra-op threads of its training and predictions

    def __init__(self, model: MultiLabelNet, method: Method, predictor: DatasetForward, train: LabelledImages,
                 val: LabelledImages, observed: torch.Tensor, negatives: torch.Tensor, annotated: torch.Tensor | None,
                 optimisation: HeadOptimisation, batch_size: int, seed: int,
                 criterion: Criterion = CRITERIA[DEFAULT_CRITERION], val_full_labels: bool = True,
                 cache: FeatureCache | None = None,
                 cache_key: Callable[[LabelledImages], dict[str, Any]] | None = None,
                 features: dict[str, Rows] | None = None, head: nn.Module | None = None) -> None:
        self.model, self.method, self.predictor = model, method, predictor
        self.head = model.head if head is None else head
        self.observed, self.negatives, self.annotated = observed, negatives, annotated
        self.batch_size, self.seed, self.criterion = batch_size, seed, criterion
        self.val_full_labels = val_full_labels
        self.val_labels = val.labels
        self.classes = list(train.classes)
        self.cache, self.cache_key = cache, cache_key
        self.cache_hits: list[bool] = []
        self.given = dict(features or {})
        self.optimisation = optimisation
        self.total_steps = optimisation.epochs * self.steps_per_epoch(len(train))
        self.optimizer, self.scheduler = head_optimiser(self.param_groups(), optimisation, self.total_steps)
        # Extraction must not consume the global RNG (a DataLoader iterator draws a seed from it), or a run
        # resumed inside the phase - which extracts again - would augment differently afterwards.
        devices = [predictor.device] if predictor.device.type == "cuda" else []
        self._forward: Callable[[torch.Tensor], torch.Tensor] | None = None  # one backbone forward for both splits
        with torch.random.fork_rng(devices=devices):
            self.train_features, self.train_present = self._extract(train, "train", later=len(val))
            self.val_features, self.val_present = self._extract(val, "val")
            self.extract_views(train)
        self._forward = None
        self.best_score = -np.inf
        self.best_state: dict[str, Any] | None = None

    def param_groups(self) -> list[dict[str, Any]]:
        """The optimiser's parameter groups: the head's, then the method's."""
        return [{"params": list(self.head.parameters())}, *self.method.param_groups(self.optimisation.lr)]

    def extract_views(self, train: LabelledImages) -> None:
        """Cache other views of the training images, inside the extraction's own random stream (none here)."""

    def steps_per_epoch(self, count: int) -> int:
        """Optimiser steps of one epoch over ``count`` training rows."""
        return max(1, -(-count // self.batch_size))

    def _extract(self, images: LabelledImages, split: str, later: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features of ``images`` and the readable ones' mask; ``later``: images extracted next."""
        if split in self.given:
            rows = self.given[split]
            return rows.values.to(self.predictor.device), rows.present
        self.model.eval()

        def compute() -> Rows:
            if self._forward is None:
                self._forward = self.predictor.fixed_features(self.model, len(images) + later)
            return self.predictor.rows(self._forward, self.predictor.eval_loader(images), self.model.num_features,
                                       f"features ({split})")

        if self.cache is not None and self.cache_key is not None:
            rows, hit = self.cache.get(self.cache_key(images), compute)
            self.cache_hits.append(hit)
        else:
            rows = compute()
        return rows.values.to(self.predictor.device), rows.present

    def head_rows(self, model: MultiLabelNet, images: LabelledImages, split: str) -> Rows:
        """Logits of ``model``'s head (eval mode) on the cached features of ``images``."""
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

    def _logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The head's logits for cached rows, on the CPU."""
        with torch.inference_mode(), head_threads(self.threads):
            return self.head(rows).float().cpu()

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities of the current head on the cached training features (no augmentation exists)."""
        return torch.sigmoid(self._logits(self.train_features))

    @property
    def pace(self) -> tuple[int, int]:
        """Steps of the schedule and of an epoch: phases of one pace can train together (:class:`JointTraining`)."""
        return self.total_steps, self.steps_per_epoch(int(self.train_present.sum()))

    def batches(self, epoch: int) -> Iterator[tuple[int, int, dict[str, torch.Tensor]]]:
        """The steps of an epoch over the training features in a seeded order: the step's number, its global batch's
        rows and this rank's share (a global batch with fewer rows than ranks is skipped)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_features.shape[0], generator=generator)
        if not self.train_present.all():
            order = order[self.train_present[order]]
        labels = {"observed": self.observed, NEGATIVES: self.negatives, FULL_LABELS: self.annotated}
        if not (self.method.uses_observed_negatives or bool(self.negatives.any())):
            del labels[NEGATIVES]
        rows = {key: value.index_select(0, order).to(self.predictor.device) for key, value in labels.items()
                if value is not None}
        rows["index"] = order.to(self.predictor.device)
        world = current_world()
        for number, start in enumerate(range(0, len(order), self.batch_size), start=1):
            size = min(self.batch_size, len(order) - start)
            if size >= world.size:
                batch = {key: value[start:start + size][world.rank::world.size] for key, value in rows.items()}
                yield number, size, {"images": self.train_features.index_select(0, batch["index"]), **batch}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch over the cached training features in a seeded random order."""
        with head_threads(self.threads):
            self.head.train()
            totals = EpochTotals(epoch)
            world = current_world()
            started = time.perf_counter()
            # this epoch's step module (DDP under torchrun); dropped at the end of the epoch, so it never coexists
            # with the end-to-end wrapper of the same method parameters
            step = wrap_training_step(self.head, self.method, self.predictor.device)
            for number, size, batch in self.batches(epoch):
                rows = len(batch["index"])
                out = run_training_step(step, batch)
                self.optimizer.zero_grad(set_to_none=True)
                # this rank's share of the global mean; DDP's average of the gradients then gives the one-process step
                (out.loss * (rows * world.size / size)).backward()
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
                totals.add(out, rows, number)
            totals.raise_if_diverged()
            stats, _ = totals.means()
            return {**stats, "phase": 1.0, "lr": float(self.optimizer.param_groups[0]["lr"]),
                    "train_seconds": time.perf_counter() - started}

    def validate(self, metrics: bool = True) -> Assessment:
        """The current head's val predictions against the val labels, with the criterion and metrics."""
        present = self.val_present
        logits = self._logits(self.val_features[present.to(self.val_features.device)]).numpy()
        return assess(logits, self.val_labels[present.numpy()], self.classes, self.criterion,
                      full_labels=self.val_full_labels, metrics=metrics)

    def remember_if_best(self, score: float) -> bool:
        """Keep a copy of the head and the method state when ``score`` is the best of the phase."""
        if score > self.best_score:
            self.best_score = score
            self.best_state = {"head": copy.deepcopy(self.head.state_dict()),
                               "method": copy.deepcopy(self.method.state_dict())}
            return True
        return False

    def restore_best(self) -> None:
        """Load the best head and method state of the phase (before the end-to-end phase of LinearInit)."""
        if self.best_state is not None:
            self.head.load_state_dict(self.best_state["head"])
            self.method.load_state_dict(self.best_state["method"])


def head_optimiser(groups: list[dict[str, Any]], optimisation: HeadOptimisation,
                   total_steps: int) -> tuple[torch.optim.Optimizer, LRScheduler | None]:
    """The optimiser of ``groups`` and its per-step schedule over ``total_steps``."""
    optimizer = build_optimizer(optimisation.optimizer, groups, optimisation.lr,
                                weight_decay=optimisation.weight_decay, momentum=optimisation.momentum)
    return optimizer, build_scheduler(optimisation.scheduler, optimizer, total_steps)


class JointTraining:
    """Phases of the same pace and optimisation trained together in one process (a candidate's cross-fitted heads): one
    backward and one optimiser step over all of them per step, with the same updates as training them one by one."""

    def __init__(self, phases: list[FixedFeaturePhase]) -> None:
        self.phases = phases
        self.random_states = [torch.get_rng_state() for _ in phases]
        if len(phases) == 1:
            return
        first = phases[0]
        if current_world().distributed or any(p.pace != first.pace or p.optimisation != first.optimisation
                                              for p in phases):
            raise ValueError("phases train together in one process only, at the same pace and optimisation")
        heads = {"params": [p for phase in phases for p in phase.head.parameters()]}
        groups = [heads, *(group for phase in phases for group in phase.method.param_groups(first.optimisation.lr))]
        self.optimizer, self.scheduler = head_optimiser(groups, first.optimisation, first.total_steps)

    def train_epoch(self, epoch: int) -> None:
        """One epoch of every phase; ``FloatingPointError`` when a loss was not finite."""
        if len(self.phases) == 1:
            torch.set_rng_state(self.random_states[0])
            self.phases[0].train_epoch(epoch)
            self.random_states[0] = torch.get_rng_state()
            return
        for phase in self.phases:
            phase.head.train()
        losses = []  # per step, of every phase: checked at the end of the epoch (no host sync per step)
        with head_threads():
            for steps in zip(*(phase.batches(epoch) for phase in self.phases), strict=True):
                outs = []
                for i, (phase, (_, _, batch)) in enumerate(zip(self.phases, steps, strict=True)):
                    torch.set_rng_state(self.random_states[i])
                    outs.append(method_step(phase.head, phase.method, batch).loss)
                    self.random_states[i] = torch.get_rng_state()
                stacked = torch.stack(outs)
                self.optimizer.zero_grad(set_to_none=True)
                stacked.sum().backward()
                losses.append(stacked.detach())
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
        bad = torch.nonzero(~torch.isfinite(torch.stack(losses)))
        if len(bad):
            step, i = bad[0].tolist()
            raise FloatingPointError(f"loss is {float(losses[step][i])} at epoch {epoch}, step {step + 1}; "
                                     f"{DIVERGED_HINT}")


def joint_groups(phases: list[FixedFeaturePhase]) -> list[list[int]]:
    """The indices of ``phases`` in groups that can train together (same pace; alone under torchrun)."""
    groups: dict[Any, list[int]] = {}
    for i, phase in enumerate(phases):
        groups.setdefault(i if current_world().distributed else phase.pace, []).append(i)
    return list(groups.values())
