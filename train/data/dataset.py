"""The torch ``Dataset`` over a :class:`LabelledImages`: decoded, transformed images plus label rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from models.preprocess import read_image
from train.data.types import LabelledImages


class ImageLabelDataset(Dataset[dict[str, torch.Tensor]]):
    """Items are dicts: ``images`` (transformed float tensor), ``observed`` and ``full`` (float (C,) label
    rows; observed = full when no observed matrix is given) and ``index`` (the row number), plus one entry per
    extra view (``views``: key -> transform of the same decoded image, e.g. LAC's strong view)."""

    def __init__(
        self,
        images: LabelledImages,
        transform: Callable[[torch.Tensor], torch.Tensor],
        observed: np.ndarray | None = None,
        views: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        self.paths: list[Path] = list(images.paths)
        self.full = torch.from_numpy(images.labels.astype(np.float32))
        self.observed = self.full if observed is None else torch.from_numpy(np.asarray(observed, dtype=np.float32))
        if self.observed.shape != self.full.shape:
            raise ValueError("observed labels must have the same shape as the full labels")
        self.transform = transform
        # every transform of this package resizes the whole image to its ``image_size`` first, so large JPEGs
        # may be decoded at reduced scale (models.preprocess.decode_scaled); others get full-size images
        self.decode_side: int | None = getattr(transform, "decode_side", None)
        self.views = dict(views or {})
        clash = set(self.views) & {"images", "observed", "full", "index"}
        if clash:
            raise ValueError(f"extra view names clash with batch keys: {sorted(clash)}")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path = self.paths[index]
        try:
            image = read_image(path, self.decode_side)
        except Exception as exc:
            raise OSError(f"cannot read image {path}: {exc}") from exc
        item = {
            "images": self.transform(image),
            "observed": self.observed[index],
            "full": self.full[index],
            "index": torch.tensor(index, dtype=torch.long),
        }
        for key, view in self.views.items():
            item[key] = view(image)
        return item
