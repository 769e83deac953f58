"""The torch ``Dataset`` over a :class:`LabelledImages`; an unreadable image yields an item holding only its row under
``SKIPPED``, which :func:`collate_readable` keeps out of the batch."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from models.data.types import LabelledImages
from models.preprocess import read_image

SKIPPED = "skipped"  # batch key: the dataset rows of this batch whose image could not be read
NEGATIVES = "observed_negatives"  # batch key: 1 where a label is observed negative (the protocol's -1 entries)
FULL_LABELS = "full"  # batch key of the annotated labels: only in the batches of methods that train on them


class ImageLabelDataset(Dataset[dict[str, torch.Tensor]]):
    """Items are dicts: ``images``, ``observed``, ``observed_negatives``, ``index``, the extra views, and the annotated
    labels under ``FULL_LABELS`` only with ``annotated_in_items``."""

    def __init__(self, images: LabelledImages, transform: Callable[[torch.Tensor], torch.Tensor],
                 observed: np.ndarray | None = None,
                 views: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
                 annotated_in_items: bool = False) -> None:
        self.paths: list[Path] = list(images.paths)
        self.labels = torch.from_numpy(images.labels.astype(np.float32))
        matrix = self.labels.numpy() if observed is None else np.asarray(observed, dtype=np.float32)
        if matrix.shape != tuple(self.labels.shape):
            raise ValueError("observed labels must have the same shape as the full labels")
        self.observed = torch.from_numpy((matrix > 0).astype(np.float32))
        self.negatives = torch.from_numpy((matrix < 0).astype(np.float32))
        self.annotated_in_items = annotated_in_items
        self.transform = transform
        # every transform of this package resizes the whole image to its ``image_size`` first, so large JPEGs
        # may be decoded at reduced scale (models.preprocess.decode_scaled); others get full-size images
        self.decode_side: int | None = getattr(transform, "decode_side", None)
        self.views = dict(views or {})
        clash = set(self.views) & {"images", "observed", NEGATIVES, FULL_LABELS, "index", SKIPPED}
        if clash:
            raise ValueError(f"extra view names clash with batch keys: {sorted(clash)}")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path = self.paths[index]
        try:
            image = read_image(path, self.decode_side)
        except Exception:  # any decoder failure: the batch goes on without this image
            return {SKIPPED: torch.tensor(index, dtype=torch.long)}
        item = {
            "images": self.transform(image),
            "observed": self.observed[index],
            NEGATIVES: self.negatives[index],
            "index": torch.tensor(index, dtype=torch.long)}
        if self.annotated_in_items:
            item[FULL_LABELS] = self.labels[index]
        for key, view in self.views.items():
            item[key] = view(image)
        return item


def collate_readable(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``default_collate`` over the readable items; unreadable rows go to ``batch[SKIPPED]``."""
    readable = [item for item in items if SKIPPED not in item]
    batch: dict[str, torch.Tensor] = default_collate(readable) if readable else {}
    skipped = [item[SKIPPED] for item in items if SKIPPED in item]
    if skipped:
        batch[SKIPPED] = torch.stack(skipped)
    return batch


class SkipReporter:
    """Reports each unreadable image once per run: one warning line on stderr with its path and the reason."""

    def __init__(self) -> None:
        self.reported: set[Path] = set()

    def take(self, batch: dict[str, torch.Tensor], paths: Sequence[Path]) -> dict[str, torch.Tensor]:
        """Remove ``SKIPPED`` from ``batch`` (rows into ``paths``), report files not reported yet, return the
        batch."""
        skipped = batch.pop(SKIPPED, None)
        for index in [] if skipped is None else skipped.tolist():
            path = paths[index]
            if path not in self.reported:
                self.reported.add(path)
                print(f"warning: skipping unreadable image {path}: {_read_error(path)}", file=sys.stderr, flush=True)
        return batch


def _read_error(path: Path) -> str:
    """Why ``path`` cannot be read (the decoder's message)."""
    try:
        read_image(path)
    except Exception as exc:  # the message is the report
        return str(exc) or type(exc).__name__
    return "it failed to decode in a loader process"
