"""LAC's strong training view (docs/methods.md, "LAC") on ``uint8 (3, H, W)`` tensors: two random RandAugment ops,
normalised and resized like the weak view so the two can be batched."""

from __future__ import annotations

import random

import torch
from torchvision.transforms import v2

from models.preprocess import EvalTransform


def cutout(image: torch.Tensor, factor: float = 0.5) -> torch.Tensor:
    """One random-colour rectangle of ``factor`` size painted onto a copy of a ``uint8`` image (CutoutPIL)."""
    _, h, w = image.shape
    ch, cw = int(factor * h + 0.5), int(factor * w + 0.5)
    yc, xc = random.randrange(h), random.randrange(w)
    y1, y2 = max(0, yc - ch // 2), min(h, yc + ch // 2)
    x1, x2 = max(0, xc - cw // 2), min(w, xc + cw // 2)
    out = image.clone()
    colour = torch.tensor([random.randrange(256) for _ in range(3)], dtype=image.dtype)
    out[:, y1:y2, x1:x2] = colour[:, None, None]
    return out


class RandomPairAugment:
    """Two RandAugment draws, each applied with probability ``p`` at a random level in ``[1, max_level]``."""

    def __init__(self, draws: int = 2, p: float = 0.5, max_level: int = 9, levels: int = 10) -> None:
        self.draws, self.p, self.max_level, self.levels = draws, p, max_level, levels

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for _ in range(self.draws):
            if random.random() < self.p:
                level = random.randint(1, self.max_level)
                image = v2.RandAugment(num_ops=1, magnitude=level, num_magnitude_bins=self.levels)(image)
        return image


class StrongTransform:
    """LAC's strong view: ``uint8 (3, H, W)`` in, augmented and normalised ``float32 (3, S, S)`` out."""

    def __init__(self, preprocessing: EvalTransform) -> None:
        self.preprocessing = preprocessing
        self.randaugment = RandomPairAugment()
        self.colour = v2.Compose([
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            v2.RandomGrayscale(p=0.2),
        ])

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        x = self.preprocessing.resize(image)
        if random.random() < 0.5:
            x = x.flip(-1)
        x = self.colour(self.randaugment(cutout(x)))
        return self.preprocessing.normalize(x)
