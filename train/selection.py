"""Evaluation and model selection: forward passes over whole datasets (sharded under torchrun), the metrics of a model's
predictions, and the criterion that picks the best epoch (``val_mAP`` with full validation labels, else a label-free one
of :mod:`models.evaluation.criteria`: :func:`resolve_criterion`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from models.backbones.batchnorm_folding import folded_copy
from models.data.dataset import ImageLabelDataset, SkipReporter, collate_readable
from models.data.label_regime import NOT_AVAILABLE
from models.data.types import LabelledImages
from models.evaluation.criteria import CRITERIA, FULL_LABEL_DEFAULT, Criterion, default_criterion
from models.evaluation.metrics import evaluate
from models.network import MultiLabelNet
from models.runtimes.onnx_forward import onnx_forward, worth_exporting
from train.console import log
from train.distributed import current_world, gather_indexed_rows

# ----------------------------------------------------------------- predictions over a dataset

@dataclass
class Rows:
    """``values`` (N, ...) float32 on the CPU, zero where ``present`` (N,) is False (an unreadable image)."""

    values: torch.Tensor
    present: torch.Tensor

    @property
    def missing(self) -> int:
        """How many rows have no value."""
        return int((~self.present).sum())


def predict_rows(
    forward: Callable[[torch.Tensor], torch.Tensor],
    loader: DataLoader[dict[str, torch.Tensor]],
    width: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    channels_last: bool,
    reporter: SkipReporter,
    desc: str = "",
    progress: bool = False,
) -> Rows:
    """``forward`` over every batch of ``loader``; ``width``: its outputs' columns."""
    dataset = loader.dataset
    assert isinstance(dataset, ImageLabelDataset)
    chunks: list[torch.Tensor] = []
    indices = [torch.zeros(0, dtype=torch.long)]
    with torch.inference_mode():
        for raw in tqdm(loader, desc=desc, leave=False, disable=not progress, file=sys.stderr):
            batch = reporter.take(raw, dataset.paths)
            if "images" not in batch:
                continue
            x = batch["images"].to(device, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast():
                out = forward(x)
            chunks.append(out.float().cpu())
            indices.append(batch["index"])
    local = torch.cat(chunks) if chunks else torch.zeros((0, width))  # a shard of unreadable images only
    values, present = gather_indexed_rows(local, torch.cat(indices), len(dataset))
    return Rows(values, present)


class DatasetForward:
    """A forward over whole datasets in dataset order with the run's evaluation settings."""

    def __init__(self, eval_transform: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
                 autocast: Callable[[], AbstractContextManager[Any]], channels_last: bool, reporter: SkipReporter,
                 batch_size: int, workers: int, progress: bool = False) -> None:
        self.eval_transform = eval_transform
        self.device = device
        self.autocast = autocast
        self.channels_last = channels_last
        self.reporter = reporter
        self.batch_size = batch_size
        self.workers = workers
        self.progress = progress

    def loader(self, dataset: ImageLabelDataset) -> DataLoader[dict[str, torch.Tensor]]:
        """In-order loader over ``dataset``; under torchrun each rank reads its shard (:meth:`rows` gathers them)."""
        sampler = DistributedSampler(dataset, shuffle=False) if current_world().distributed else None
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, sampler=sampler,
                          num_workers=self.workers, pin_memory=self.device.type == "cuda",
                          collate_fn=collate_readable)

    def eval_loader(self, images: LabelledImages) -> DataLoader[dict[str, torch.Tensor]]:
        """:meth:`loader` over ``images`` with the evaluation transform."""
        return self.loader(ImageLabelDataset(images, self.eval_transform))

    def fixed_features(self, model: MultiLabelNet, images: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
        """``model.features`` of a frozen backbone: a BatchNorm-folded copy, run by ONNX Runtime when it pays."""
        folded = model.fold_for_inference()
        size = getattr(self.eval_transform, "image_size", None)
        if size is None:
            return folded.features
        # its own generator: extraction must not draw from the global random stream (resumed runs extract again)
        example = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)).to(self.device)
        if folded is model:
            folded = folded_copy(model, lambda net, x: net.features(x), example)
        if self.device.type != "cpu" or self._autocasts() or not worth_exporting(images, size):
            return folded.features
        forward = onnx_forward(folded, lambda net, x: net.features(x), example, torch.get_num_threads())
        if isinstance(forward, str):
            log(f"note: features computed by PyTorch (ONNX Runtime could not take the backbone: {forward})")
            return folded.features
        return forward

    def _autocasts(self) -> bool:
        """Whether the run's forward passes run under autocast."""
        with self.autocast():
            return torch.is_autocast_enabled(self.device.type)

    def rows(self, forward: Callable[[torch.Tensor], torch.Tensor], loader: DataLoader[dict[str, torch.Tensor]],
             width: int, desc: str = "") -> Rows:
        """``forward`` (already in the wanted mode) over every row of ``loader``'s dataset (:func:`predict_rows`)."""
        return predict_rows(forward, loader, width, self.device, self.autocast, self.channels_last, self.reporter,
                            desc, self.progress)


# ----------------------------------------------------------------- assessment and selection

DEFAULT_CRITERION = FULL_LABEL_DEFAULT
SELECT_CHOICES = ("auto", *CRITERIA)


@dataclass(frozen=True)
class SelectionRule:
    """The criterion a run selects its epochs with (``name`` in :data:`CRITERIA`) and why it is that one."""

    name: str
    reason: str

    @property
    def criterion(self) -> Criterion:
        """The criterion's function."""
        return CRITERIA[self.name]

    def describe(self) -> str:
        """The start-of-run line."""
        return f"best epoch selected by {self.name}: {CRITERIA.row(self.name).help} ({self.reason})"


def resolve_criterion(select: str, val_has_full_labels: bool) -> SelectionRule:
    """The rule of ``--select``: ``auto`` is ``val_mAP`` with full val labels, else the label-free default."""
    if select == "auto":
        name = default_criterion(val_has_full_labels)
        return SelectionRule(name, "auto: val has full labels" if val_has_full_labels else
                             "auto: val has no full labels")
    CRITERIA.row(select)  # an unknown name: the one message listing the criteria
    note = "" if val_has_full_labels or select != "val_mAP" else ", against val labels that are not full"
    return SelectionRule(select, f"--select {select}{note}")


def finite_score(value: float | None) -> float:
    """``value`` as a comparable score: -inf for None or NaN."""
    return -math.inf if value is None or math.isnan(value) else float(value)


@dataclass
class Assessment:
    """A model's predictions on a split, judged: its ``metrics`` (None where full labels are needed and missing), the
    criterion's ``score`` (-inf when undefined), and the ``logits`` and ``labels``."""

    metrics: dict[str, Any]
    score: float
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None


def assess(logits: np.ndarray, labels: np.ndarray, classes: list[str],
           criterion: Criterion = CRITERIA[DEFAULT_CRITERION], full_labels: bool = True,
           metrics: bool = True) -> Assessment:
    """The metrics of ``logits`` against ``labels`` (unless ``metrics`` is False) and the criterion's score."""
    if not metrics:
        return Assessment({}, finite_score(criterion(logits, labels)), logits, labels)
    figures = evaluate(logits, labels, classes)
    if not full_labels:
        figures = {**{k: None for k in FULL_LABEL_FIGURES}, "mAP_observed": figures["mAP"],
                   "num_images": figures.get("num_images")}
    return Assessment(figures, finite_score(criterion(logits, labels)), logits, labels)


#: The figures of :func:`models.evaluation.metrics.evaluate` that need full labels (None on a split without them).
FULL_LABEL_FIGURES = ("mAP", "OF1", "CF1", "OP", "OR", "CP", "CR", "per_class_AP")


def figure(value: float | None, spec: str = ".2f") -> str:
    """A figure for a log line: formatted, or ``n/a (no full labels)`` when None."""
    return NOT_AVAILABLE if value is None else f"{value:{spec}}"


@dataclass
class AssessedWeights:
    """Weights that could be the epoch's pick: the trained ``model`` itself or its EMA (``name``), assessed."""

    name: str
    module: nn.Module
    assessment: Assessment


def best_weights(candidates: list[AssessedWeights]) -> AssessedWeights:
    """The candidate with the highest score (the first on a tie)."""
    return max(candidates, key=lambda c: c.assessment.score)


class BestSoFar:
    """The best score and its epoch in the current stage (or LinearInit phase)."""

    def __init__(self) -> None:
        self.score = -math.inf
        self.epoch = 0

    def offer(self, score: float, epoch: int) -> bool:
        """Take ``score`` of ``epoch`` when it beats the best so far; True when it did."""
        if score > self.score:
            self.score, self.epoch = score, epoch
            return True
        return False

    def reset(self) -> None:
        """Forget the best (a new stage selects its own)."""
        self.score, self.epoch = -math.inf, 0

    def state_dict(self) -> dict[str, float | int]:
        """Resume state (``best_map`` keeps the key name of earlier checkpoints)."""
        return {"best_map": self.score, "best_epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.score, self.epoch = float(state["best_map"]), int(state["best_epoch"])
