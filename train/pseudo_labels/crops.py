"""AEVLP's "dynamic augmented multi-focus" pseudo-labelling (Fsoft-AIC/AEVLP): CLIP scores of the whole image and a ``g
x g`` grid of tiles, reduced to their max, min and mean per class, combined by :func:`select_aevlp` (docs/methods.md,
"AEVLP")."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the references normalise CLIP's input with ImageNet's statistics
IMAGENET_STD = (0.229, 0.224, 0.225)

Box = tuple[int, int, int, int]


def grid_boxes(width: int, height: int, grid: int) -> list[Box]:
    """The ``grid x grid`` tiles of an image as PIL boxes, row by row (at least one pixel wide and high)."""
    tile_w, tile_h = max(1, width // grid), max(1, height // grid)
    boxes = []
    for y in range(grid):
        for x in range(grid):
            left, upper = min(x * tile_w, width - 1), min(y * tile_h, height - 1)
            right = max(left + 1, min(width, (x + 1) * tile_w))
            lower = max(upper + 1, min(height, (y + 1) * tile_h))
            boxes.append((left, upper, right, lower))
    return boxes


_MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)
_STD = np.array(IMAGENET_STD, dtype=np.float32)


def clip_input(image: Image.Image, size: tuple[int, int]) -> torch.Tensor:
    """One view as the references feed CLIP: bilinear squash to ``size``, ImageNet-normalised ``(3, H, W)`` float32."""
    resized = np.asarray(image.resize((size[1], size[0]), Image.BILINEAR), dtype=np.float32)
    normalised = (resized / np.float32(255) - _MEAN) / _STD
    return torch.from_numpy(np.ascontiguousarray(normalised.transpose(2, 0, 1)))


def aevlp_views(image: Image.Image, grid: int, size: tuple[int, int]) -> torch.Tensor:
    """The whole image and its ``grid x grid`` crops as CLIP inputs: ``(1 + grid^2, 3, H, W)``."""
    views = [image] + [image.crop(box) for box in grid_boxes(image.width, image.height, grid)]
    return torch.stack([clip_input(view, size) for view in views])


def aggregate_views(scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """``(N, 1 + g^2, C)`` softmax scores of the views -> the whole image's ``global`` and the crops'
    ``crop_max``, ``crop_min``, ``crop_mean`` (each ``(N, C)``)."""
    crops = scores[:, 1:]
    return {"global": scores[:, 0], "crop_max": crops.max(dim=1)[0], "crop_min": crops.min(dim=1)[0],
            "crop_mean": crops.mean(dim=1)}


def select_aevlp(scores: dict[str, np.ndarray], observed: np.ndarray, top_k: int, threshold: float, eta: float,
                 negative_ratio: float) -> np.ndarray:
    """AEVLP's pseudo-positives ``(N, C)`` bool from the aggregated view scores (:func:`aggregate_views`) and the
    observed labels (1 observed positive), as ``get_pseudo_labels`` computes them (float32, torch.topk)."""
    sim_global = torch.from_numpy(np.asarray(scores["global"], dtype=np.float32))
    alpha = torch.from_numpy(np.asarray(scores["crop_max"], dtype=np.float32))
    beta = torch.from_numpy(np.asarray(scores["crop_min"], dtype=np.float32))
    avg = torch.from_numpy(np.asarray(scores["crop_mean"], dtype=np.float32))
    labels = torch.from_numpy(np.asarray(observed, dtype=np.float32))
    n, c = sim_global.shape
    if n == 0:
        return np.zeros((0, c), dtype=bool)
    single_pos_pro = torch.max(sim_global * labels, dim=1)[0]
    gate = torch.minimum(single_pos_pro, torch.tensor(eta)).unsqueeze(1).repeat(1, c)
    gamma = (alpha > gate).to(sim_global.dtype)
    sim_ag = alpha * gamma + beta * (1 - gamma)
    sim_final = 1 / 2 * (sim_global + sim_ag)
    sim = 1 / 2 * (sim_global + avg)
    values, indices = torch.topk(sim_final, k=min(top_k, c), dim=1)
    pseudo = torch.zeros_like(sim_final, dtype=torch.int)
    pseudo.scatter_(1, indices, (values >= threshold).int())
    num_negatives = int(negative_ratio * c)
    if num_negatives > 0:
        _, lowest = torch.topk(sim, k=num_negatives, largest=False, dim=1)
        pseudo.scatter_(-1, lowest, torch.zeros_like(lowest, dtype=torch.int))
    return pseudo.numpy().astype(bool)
