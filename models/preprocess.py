"""The one image preprocessing of training, evaluation, export, the tagger and the demo (:class:`EvalTransform`,
:func:`read_image`), through PIL; large JPEGs are decoded at reduced scale when still :data:`DECODE_MARGIN` times the
input size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image, ImageOps
from PIL.JpegImagePlugin import JpegImageFile
from torchvision.transforms.v2 import RandomResizedCrop
from torchvision.transforms.v2 import functional as F

from models.registry import Row, Table

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta

#: JPEGs are decoded at reduced scale only while keeping at least this many times the network input per side.
DECODE_MARGIN = 2


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB: EXIF orientation applied, alpha onto white, other modes converted."""
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


def decode_scaled(image: Image.Image, decode_side: int | None) -> Image.Image:
    """Load an opened PIL ``image``; a JPEG at least twice ``decode_side`` is decoded at the smallest 1/2, 1/4 or 1/8
    scale keeping both sides >= ``decode_side``. Returns ``image``, loaded."""
    if decode_side is not None and isinstance(image, JpegImageFile):  # also MPO, the camera JPEG variant
        image.draft(None, (decode_side, decode_side))
    image.load()
    return image


def read_image(path: str | Path, decode_side: int | None = None) -> torch.Tensor:
    """Decode an image file to a ``uint8`` RGB tensor ``(3, H, W)``, large JPEGs at reduced scale down to
    ``decode_side`` (None: full size); ``OSError`` for unreadable files."""
    with Image.open(path) as img:
        rgb = to_rgb(decode_scaled(img, decode_side))
    return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1).contiguous()


#: How images are resized: name, help, torchvision's mode.
INTERPOLATIONS: Table[F.InterpolationMode] = Table("interpolation", [
    Row("bilinear", "bilinear, antialiased", F.InterpolationMode.BILINEAR),
    Row("bicubic", "bicubic, antialiased (timm's pretrained configurations)", F.InterpolationMode.BICUBIC),
])


def resize_uint8(image: torch.Tensor, image_size: int, interpolation: str = "bilinear",
                 crop: float = 1.0) -> torch.Tensor:
    """Resize a ``uint8 (3, H, W)`` image to ``image_size`` square (antialiased, aspect not kept); ``crop`` < 1 resizes
    to ``image_size / crop`` and keeps the centre (timm's ``crop_pct``)."""
    mode = INTERPOLATIONS[interpolation]
    if not 0.0 < crop <= 1.0:
        raise ValueError(f"crop must be in (0, 1], got {crop}")
    side = image_size if crop >= 1.0 else round(image_size / crop)
    out = F.resize(image, [side, side], interpolation=mode, antialias=True)
    return out if side == image_size else F.center_crop(out, [image_size, image_size])


def normalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``uint8 (..., 3, H, W)`` -> float32 normalised with ``mean``/``std`` (given for the 0..1 range)."""
    x = image.to(torch.float32).div_(255.0)
    return F.normalize(x, mean=list(mean), std=list(std))


class EvalTransform:
    """Path or uint8 image -> model input ``float32 (3, S, S)`` with the model's preprocessing."""

    def __init__(self, image_size: int, mean: Sequence[float], std: Sequence[float], interpolation: str = "bilinear",
                 crop: float = 1.0) -> None:
        self.image_size = int(image_size)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        INTERPOLATIONS.row(interpolation)  # an unknown name: the one message listing them
        self.interpolation = interpolation
        self.crop = float(crop)

    @classmethod
    def for_meta(cls, meta: ModelMeta) -> EvalTransform:
        """The preprocessing of a model with metadata ``meta``."""
        return cls(meta.image_size, meta.mean, meta.std, meta.interpolation, meta.crop)

    @classmethod
    def like(cls, other: EvalTransform) -> EvalTransform:
        """This transform class with ``other``'s preprocessing (e.g. the training transform of an eval one)."""
        return cls(other.image_size, other.mean, other.std, other.interpolation, other.crop)

    @property
    def decode_side(self) -> int:
        """The smallest side a JPEG may be decoded at for this transform (:func:`decode_scaled`)."""
        return int(DECODE_MARGIN * self.image_size / min(self.crop, 1.0))

    def resize(self, image: torch.Tensor) -> torch.Tensor:
        """Decoded ``uint8 (3, H, W)`` -> ``uint8 (3, S, S)`` (:func:`resize_uint8` with this model's settings)."""
        return resize_uint8(image, self.image_size, self.interpolation, self.crop)

    def normalize(self, image: torch.Tensor) -> torch.Tensor:
        """``uint8 (..., 3, S, S)`` -> float32 with this model's mean and std."""
        return normalize(image, self.mean, self.std)

    def __call__(self, image: torch.Tensor | str | Path) -> torch.Tensor:
        if not isinstance(image, torch.Tensor):
            image = read_image(image, self.decode_side)
        return self.normalize(self.resize(image))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.image_size}, mean={self.mean}, std={self.std}, "
                f"interpolation={self.interpolation!r}, crop={self.crop:g})")


class TrainTransform(EvalTransform):
    """The papers' training transform: the eval resize plus a random horizontal flip (p = 0.5); with ``min_area`` < 1
    torchvision's random resized crop (a share of the area in ``[min_area, 1]``) replaces the resize."""

    min_area = 1.0

    def resize(self, image: torch.Tensor) -> torch.Tensor:
        if self.min_area >= 1.0:
            return super().resize(image)
        mode = INTERPOLATIONS[self.interpolation]
        return RandomResizedCrop(self.image_size, (self.min_area, 1.0), interpolation=mode, antialias=True)(image)

    def __call__(self, image: torch.Tensor | str | Path) -> torch.Tensor:
        x = super().__call__(image)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x
