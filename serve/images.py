"""Any image a caller has (:data:`ImageInput`) -> ``uint8`` RGB (:func:`load_rgb`) -> the model's input
(:class:`ImagePreprocessor`), the same for the tagger, the predictor and the demo; failures are :class:`ImageError`."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from models.preprocess import EvalTransform, decode_scaled, read_image, to_rgb
from serve import DEFAULT_MAX_PIXELS

#: What :meth:`Predictor.scores` and :meth:`Predictor.predict` accept as one image: a file path, encoded file
#: bytes, a PIL image, a ``uint8`` array ``(H, W)`` / ``(H, W, 1|3|4)`` (grey / RGB / RGBA), or a ``uint8``
#: tensor ``(3, H, W)`` (RGB, as :func:`models.preprocess.read_image` returns).
ImageInput = str | os.PathLike | bytes | Image.Image | np.ndarray | torch.Tensor

#: What was wrong with an image (:attr:`ImageError.kind`), for callers that answer differently (the HTTP service).
IMAGE_ERROR_KINDS = ("too-large", "not-an-image", "missing", "unreadable")


class ImageError(ValueError):
    """An input image could not be used: a short ``reason``, the ``source``, and the ``kind``
    (:data:`IMAGE_ERROR_KINDS`)."""

    def __init__(self, source: str, reason: str, kind: str = "unreadable") -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason
        self.kind = kind


def _describe(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return str(image)
    if isinstance(image, Image.Image):
        return f"PIL image {image.mode} {image.size[0]}x{image.size[1]}"
    if isinstance(image, (np.ndarray, torch.Tensor)):
        return f"{type(image).__name__} {tuple(image.shape)} {image.dtype}"
    return type(image).__name__


def _check_pixels(source: str, width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageError(
            source,
            f"image too large: {width}x{height} = {width * height:,} pixels, the limit is {max_pixels:,} "
            "(refused as a possible decompression bomb)", "too-large")


def _decode_error(source: str, exc: BaseException) -> ImageError:
    """A readable :class:`ImageError` for an exception raised while opening / decoding an image."""
    if isinstance(exc, ImageError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return ImageError(source, "file not found", "missing")
    if isinstance(exc, IsADirectoryError):
        return ImageError(source, "is a folder, not an image file", "missing")
    if isinstance(exc, UnidentifiedImageError):
        return ImageError(source, "not an image (or a format Pillow cannot read)", "not-an-image")
    if isinstance(exc, Image.DecompressionBombError):
        return ImageError(source, f"image too large, refused as a possible decompression bomb ({exc})", "too-large")
    if isinstance(exc, MemoryError):
        return ImageError(source, "image too large to decode in memory", "too-large")
    text = str(exc).strip()
    if "truncated" in text.lower():
        return ImageError(source, f"truncated image: the file ends before the image data does ({text})")
    return ImageError(source, f"corrupt or unsupported image data ({type(exc).__name__}: {text})")


def _rgb_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> ``uint8 (3, H, W)`` through :func:`models.preprocess.to_rgb`, as :func:`read_image` does."""
    return torch.from_numpy(np.asarray(to_rgb(image)).copy()).permute(2, 0, 1).contiguous()


def load_rgb(
    image: ImageInput, max_pixels: int | None = DEFAULT_MAX_PIXELS, decode_side: int | None = None
) -> torch.Tensor:
    """Any :data:`ImageInput` -> ``uint8`` RGB ``(3, H, W)``, EXIF-oriented, alpha onto white. ``max_pixels`` (None:
    off) is checked from the header before decoding; ``decode_side`` lets JPEGs decode at reduced scale. Raises
    :class:`ImageError`, or ``TypeError`` for other inputs."""
    source = _describe(image)
    try:
        if isinstance(image, (str, os.PathLike)):
            with Image.open(image) as header:  # header only: refuse huge images before decoding them
                _check_pixels(source, *header.size, max_pixels)
            return read_image(image, decode_side)
        if isinstance(image, (bytes, bytearray, memoryview)):
            with Image.open(io.BytesIO(bytes(image))) as img:
                _check_pixels(source, *img.size, max_pixels)
                return _rgb_tensor(decode_scaled(img, decode_side))
        if isinstance(image, Image.Image):
            _check_pixels(source, *image.size, max_pixels)
            return _rgb_tensor(image)
        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
                raise TypeError(f"tensor images must be uint8 (3, H, W) RGB, got {source}")
            _check_pixels(source, int(image.shape[2]), int(image.shape[1]), max_pixels)
            return image.contiguous()
        if isinstance(image, np.ndarray):
            ok_shape = image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3, 4))
            if image.dtype != np.uint8 or not ok_shape:
                raise TypeError(f"array images must be uint8 (H, W) or (H, W, 1|3|4), got {source}")
            _check_pixels(source, image.shape[1], image.shape[0], max_pixels)
            arr = image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image
            return _rgb_tensor(Image.fromarray(np.ascontiguousarray(arr)))
    except TypeError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, struct.error, DecompressionBombError...
        raise _decode_error(source, exc) from None
    raise TypeError(f"unsupported image input {source}: pass a path, bytes, a PIL image or a uint8 array")


@dataclass(frozen=True)
class ImagePreprocessor:
    """Any :data:`ImageInput` -> model input ``float32 (3, S, S)``; picklable. :meth:`decode` (-> resized ``uint8``) and
    :meth:`normalize` can run apart with the same values."""

    transform: EvalTransform
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def decode(self, image: ImageInput) -> np.ndarray:
        """One image decoded and resized to ``uint8 (3, S, S)`` (:class:`ImageError` / ``TypeError``)."""
        rgb = load_rgb(image, self.max_pixels, self.transform.decode_side)
        return self.transform.resize(rgb).numpy()

    def normalize(self, images: np.ndarray) -> np.ndarray:
        """Decoded ``uint8 (..., 3, S, S)`` -> model input ``float32`` (the model's mean and std)."""
        tensor = torch.from_numpy(np.ascontiguousarray(images))
        return self.transform.normalize(tensor).numpy()

    def __call__(self, image: ImageInput) -> np.ndarray:
        """One image preprocessed: :meth:`decode` then :meth:`normalize` (:class:`ImageError` / ``TypeError``)."""
        return self.normalize(self.decode(image))
