"""One pass over the training set: its data (shuffled, augmented, sharded under torchrun), the step loop, and the
epoch's running totals.

Nothing in the loop waits for the device unless the step itself needs it: the loss and the methods' logged values
are summed where they are computed, and read on the host (progress bar, divergence check) after the epoch's first
step, every :data:`HOST_SYNC_EVERY` steps and at the end of the epoch. A non-finite loss is therefore noticed at
the next such point, not at its step; the error names the first step that had one, and no checkpoint of that
epoch is written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from models.data.dataset import ImageLabelDataset, SkipReporter, collate_readable
from train.distributed import PerSampleSeeded, current_world, sum_over_ranks
from train.methods import LossOutput

HOST_SYNC_EVERY = 25  # steps between two reads of the running totals on the host
DIVERGED_HINT = "try a lower --lr, --clip-grad 1.0, or --amp off"  # ends the error of a loss that was not finite


@dataclass
class TrainData:
    """The training set and its loader: a seeded shuffle in one process, a rank-independent shuffle and
    augmentation (:class:`~train.distributed.PerSampleSeeded`) sharded by a ``DistributedSampler`` under torchrun."""

    dataset: ImageLabelDataset
    loader: DataLoader[dict[str, torch.Tensor]]
    generator: torch.Generator
    seed: int
    skips: SkipReporter  # the run's report of unreadable images (each once)
    sampler: DistributedSampler[Any] | None = None
    seeded: PerSampleSeeded | None = None

    def start_epoch(self, epoch: int) -> None:
        """Select ``epoch``'s shuffle and augmentation seeds."""
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)
        if self.sampler is not None and self.seeded is not None:
            self.sampler.set_epoch(epoch)
            self.seeded.set_epoch(epoch)


def build_train_data(dataset: ImageLabelDataset, batch_per_process: int, global_batch: int, seed: int,
                     workers: int, pin_memory: bool, skips: SkipReporter) -> TrainData:
    """The loader of ``dataset`` with ``batch_per_process`` images per step and process; the last incomplete batch
    is dropped unless the whole set is smaller than one global batch."""
    generator = torch.Generator()
    sampler: DistributedSampler[Any] | None = None
    seeded: PerSampleSeeded | None = None
    if current_world().distributed:
        seeded = PerSampleSeeded(dataset, seed)
        sampler = DistributedSampler(seeded, shuffle=True, seed=seed)
    loader = DataLoader(
        seeded or dataset, batch_size=batch_per_process, shuffle=sampler is None, sampler=sampler,
        generator=generator if sampler is None else None, num_workers=workers,
        drop_last=len(dataset) > global_batch, pin_memory=pin_memory, collate_fn=collate_readable,
    )
    return TrainData(dataset, loader, generator, seed, skips, sampler, seeded)


def all_ranks_empty(empty: bool) -> bool:
    """True when this step has no readable image on some rank (under torchrun every rank must then skip it
    together, so this one vote per step is part of the step); in one process: ``empty``."""
    if not current_world().distributed:
        return empty
    return sum_over_ranks({"empty": float(empty)})["empty"] > 0


class EpochTotals:
    """Batch-size weighted sums of the loss and the logged values of an epoch's steps, kept on the loss's device,
    and the first step whose loss was not finite."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.sums: dict[str, torch.Tensor | float] = {}
        self.seen = 0
        self._bad_step: torch.Tensor | None = None  # -1 while every loss was finite
        self._bad_loss: torch.Tensor | None = None

    def add(self, out: LossOutput, images: int, step: int) -> None:
        """Count step ``step`` (1-based) of ``images`` images; no host sync."""
        loss = out.loss.detach().float()
        if self._bad_step is None:
            self._bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), device=loss.device)
        first_bad = ~torch.isfinite(loss) & (self._bad_step < 0)
        self._bad_step = torch.where(first_bad, step, self._bad_step)
        self._bad_loss = torch.where(first_bad, loss, self._bad_loss)
        self.seen += images
        for key, value in [("loss", loss), *out.logs.items()]:
            weighted = (value.detach().float() if isinstance(value, torch.Tensor) else float(value)) * images
            self.sums[key] = self.sums.get(key, 0.0) + weighted

    def raise_if_diverged(self) -> None:
        """``FloatingPointError`` naming the first non-finite step when there was one on any rank (a host sync;
        under torchrun a vote, so that every rank stops at the same point)."""
        step = -1 if self._bad_step is None else int(self._bad_step)
        anywhere = step >= 0
        if current_world().distributed:
            anywhere = sum_over_ranks({"bad": float(anywhere)})["bad"] > 0
        if not anywhere:
            return
        where = (f"loss is {float(self._bad_loss)} at epoch {self.epoch}, step {step}"  # type: ignore[arg-type]
                 if step >= 0 else f"the loss of another process is not finite in epoch {self.epoch}")
        raise FloatingPointError(f"{where}; {DIVERGED_HINT}")

    def mean_loss(self) -> float:
        """This process's mean loss so far (a host sync)."""
        return float(self.sums.get("loss", 0.0)) / max(self.seen, 1)

    def means(self) -> tuple[dict[str, float], int]:
        """The epoch's means over every rank (sums divided by images) and the number of images (one host sync)."""
        tensors = {k: v for k, v in self.sums.items() if isinstance(v, torch.Tensor)}
        read = dict(zip(tensors, torch.stack(list(tensors.values())).tolist(), strict=True)) if tensors else {}
        totals = {k: float(read.get(k, v)) for k, v in self.sums.items()}  # type: ignore[arg-type]
        totals = sum_over_ranks({**totals, "_seen": float(self.seen)})
        seen = totals.pop("_seen")
        return {k: v / max(seen, 1.0) for k, v in totals.items()}, int(seen)


def to_device(batch: dict[str, torch.Tensor], device: torch.device, channels_last: bool) -> dict[str, torch.Tensor]:
    """A batch on ``device`` (non-blocking), its image views in the channels-last layout when asked."""
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if channels_last:
        for key in out:
            if key.startswith("images"):
                out[key] = out[key].contiguous(memory_format=torch.channels_last)
    return out


def train_epoch(data: TrainData, epoch: int, step: Callable[[dict[str, torch.Tensor]], LossOutput],
                to_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]], desc: str,
                progress: bool) -> dict[str, float]:
    """One pass over ``data``: each readable batch goes to the device and through ``step`` (forward, backward,
    update). Returns the epoch's mean loss and logged values over every rank, images/s and seconds."""
    data.start_epoch(epoch)
    totals = EpochTotals(epoch)
    start = time.perf_counter()
    bar = tqdm(data.loader, desc=desc, leave=False, disable=not progress, file=sys.stderr, unit="batch")
    for index, raw in enumerate(bar):
        readable = data.skips.take(raw, data.dataset.paths)
        if all_ranks_empty("images" not in readable):
            continue
        batch = to_device(readable)
        totals.add(step(batch), batch["images"].shape[0], index + 1)
        if index == 0 or (index + 1) % HOST_SYNC_EVERY == 0:  # the first step: a run that diverges at once stops
            totals.raise_if_diverged()
            rate = totals.seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{totals.mean_loss():.4f}", img_s=f"{rate:.0f}")
    elapsed = time.perf_counter() - start
    totals.raise_if_diverged()
    stats, images = totals.means()
    stats.update(train_images_per_s=images / elapsed if elapsed > 0 else 0.0, train_seconds=elapsed)
    return stats
