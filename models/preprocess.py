"""The one image preprocessing used by training evaluation, export checks, the tagger and the demo.

Decoding goes through PIL rather than ``torchvision.io.decode_image``: torchvision returns palette PNGs as
raw palette indices and CMYK JPEGs as four raw channels in its "unchanged" mode, while PIL converts both
correctly and also covers BMP/TIFF. Everything after decoding is torchvision tensor ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.transforms.v2 import functional as F

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def to_rgb(image: Image.Image) -> Image.Image:
    """Return ``image`` as 8-bit RGB: EXIF orientation applied, alpha composited onto white,
    palette / CMYK / greyscale / 16-bit converted."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        image = Image.fromarray(np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB") if image.mode != "RGB" else image


def read_image(path: str | Path) -> torch.Tensor:
    """Decode an image file to a ``uint8`` RGB tensor ``(3, H, W)`` (see :func:`to_rgb` for conversions).

    Raises ``OSError`` (or PIL's ``DecompressionBombError``) for unreadable files.
    """
    with Image.open(path) as img:
        img.load()
        rgb = to_rgb(img)
    return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1).contiguous()


def resize_uint8(image: torch.Tensor, image_size: int) -> torch.Tensor:
    """Resize a ``uint8 (3, H, W)`` image to ``image_size x image_size`` (bilinear, antialiased)."""
    return F.resize(image, [image_size, image_size], interpolation=F.InterpolationMode.BILINEAR, antialias=True)


def normalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``uint8 (..., 3, H, W)`` -> float32 normalised with ``mean``/``std`` (given for the 0..1 range)."""
    x = image.to(torch.float32).div_(255.0)
    return F.normalize(x, mean=list(mean), std=list(std))


class EvalTransform:
    """Path or uint8 image -> model input ``float32 (3, S, S)``; exactly what evaluation and serving use."""

    def __init__(self, image_size: int, mean: Sequence[float], std: Sequence[float]) -> None:
        self.image_size = int(image_size)
        self.mean = tuple(mean)
        self.std = tuple(std)

    def __call__(self, image: torch.Tensor | str | Path) -> torch.Tensor:
        if not isinstance(image, torch.Tensor):
            image = read_image(image)
        return normalize(resize_uint8(image, self.image_size), self.mean, self.std)


class TrainTransform(EvalTransform):
    """The papers' training transform: the eval resize plus a random horizontal flip (p = 0.5)."""

    def __call__(self, image: torch.Tensor | str | Path) -> torch.Tensor:
        x = super().__call__(image)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x
