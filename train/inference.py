"""Forward passes over an evaluation loader: one output row per dataset row, in dataset order, with the rows of
unreadable images marked missing (under torchrun every rank's shard is gathered)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from train.data.dataset import ImageLabelDataset, SkipReporter
from train.distributed import gather_indexed_rows


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
