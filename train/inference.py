"""Forward passes over an evaluation loader: one output row per dataset row, in dataset order, with the rows of
unreadable images marked missing (under torchrun every rank's shard is gathered)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from models.data.dataset import ImageLabelDataset, SkipReporter, collate_readable
from models.data.types import LabelledImages
from train.distributed import current_world, gather_indexed_rows


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
    """``forward`` (already in the wanted mode, called under inference mode and ``autocast()``) over every batch
    of ``loader``, whose dataset is an :class:`ImageLabelDataset`; ``width``: its outputs' columns (the shape of
    an empty shard)."""
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
    """Runs a forward over whole datasets in dataset order with the run's evaluation settings: the evaluation
    transform, loaders of ``batch_size`` with ``workers`` (sharded under torchrun, gathered back), the device,
    autocast, channels-last inputs and the run's report of unreadable images."""

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

    def rows(self, forward: Callable[[torch.Tensor], torch.Tensor], loader: DataLoader[dict[str, torch.Tensor]],
             width: int, desc: str = "") -> Rows:
        """``forward`` (already in the wanted mode) over every row of ``loader``'s dataset (:func:`predict_rows`)."""
        return predict_rows(forward, loader, width, self.device, self.autocast, self.channels_last, self.reporter,
                            desc, self.progress)
