"""Drawings as training images: flattened on white, cropped, resized to :data:`RASTER_SIZE` px on the longest side (SVGs
rendered with cairosvg)."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from models.data.types import DataError

__all__ = ["BACKGROUND_TOLERANCE", "CROP_MARGIN", "DEFAULT_PAGE", "MAX_RENDER_SIZE", "RASTER_SIZE", "RENDER_SIZE",
           "BlankDrawing", "cairosvg_svg2png", "content_box", "crop_to_content", "on_white", "open_checked",
           "raster_of_bitmap", "raster_of_file", "raster_of_svg", "render_svg"]

#: Longest side of the cached rasters (px).
RASTER_SIZE = 256
#: Margin around the drawing's bounding box, as a fraction of the box's longest side.
CROP_MARGIN = 0.04
#: A pixel is background when every channel is within this of white (255).
BACKGROUND_TOLERANCE = 8
#: Longest side of the page in the first rendering of an SVG (px), and the most a second, closer one may use.
RENDER_SIZE = 512
MAX_RENDER_SIZE = 4096
#: The page (user units, px) of an SVG that gives no size or a relative one (``width="100%"``).
DEFAULT_PAGE = 1000


def cairosvg_svg2png(dataset: str) -> Callable[..., bytes]:
    """cairosvg's ``svg2png``, imported on first use; a :class:`DataError` naming the fix when missing."""
    try:
        import cairosvg  # lazy: only a build renders SVGs
    except (ImportError, OSError) as exc:  # OSError: cairocffi finds no libcairo
        raise DataError(
            f"{dataset}: rendering the SVG drawings needs cairosvg ({type(exc).__name__}: {exc}); install it with "
            "`pip install cairosvg` (or `pip install -e '.[openclipart]'`); it needs the system's cairo library "
            "too (Debian/Ubuntu: `apt-get install libcairo2`). Only the first load renders; later loads read the "
            "cache."
        ) from exc
    return cairosvg.svg2png


def on_white(image: Image.Image) -> Image.Image:
    """``image`` flattened onto a white background, as RGB."""
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def open_checked(source: Path | io.BytesIO) -> Image.Image:
    """Open and decode an image under PIL's decompression-bomb limit (its warning counts as an error), on white."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(source) as image:
            image.load()
            return on_white(image)


def content_box(image: Image.Image, tolerance: int = BACKGROUND_TOLERANCE) -> tuple[int, int, int, int] | None:
    """The PIL box of the non-white pixels of an RGB ``image`` (beyond ``tolerance``), or None."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    mask = (pixels < 255 - tolerance).any(axis=2)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return None
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def crop_to_content(image: Image.Image, box: tuple[int, int, int, int], margin: float = CROP_MARGIN,
                    size: int = RASTER_SIZE) -> Image.Image:
    """Crop ``image`` to ``box`` plus a white ``margin`` and resize its longest side to ``size`` px."""
    left, top, right, bottom = box
    width, height = right - left, bottom - top
    pad = math.ceil(margin * max(width, height))
    canvas = Image.new("RGB", (width + 2 * pad, height + 2 * pad), (255, 255, 255))
    canvas.paste(image.crop(box), (pad, pad))
    scale = size / max(canvas.size)
    target = (max(1, round(canvas.width * scale)), max(1, round(canvas.height * scale)))
    return canvas.resize(target, Image.Resampling.LANCZOS)


def raster_of_bitmap(path: Path) -> Image.Image:
    """The cropped raster of a bitmap drawing; ``ValueError`` when nothing is drawn on white."""
    image = open_checked(path)
    box = content_box(image)
    if box is None:
        raise ValueError("nothing visible (blank)")
    return crop_to_content(image, box)


def render_svg(svg2png: Callable[..., bytes], path: Path, longest: int, portrait: bool | None) -> Image.Image:
    """Render ``path`` with its page's longest side ``longest`` px, on white (``portrait`` None: unknown)."""
    def render(**size: int) -> Image.Image:
        data = svg2png(url=str(path), parent_width=DEFAULT_PAGE, parent_height=DEFAULT_PAGE, **size)
        return open_checked(io.BytesIO(data))

    if portrait:
        return render(output_height=longest)
    image = render(output_width=longest)
    if portrait is None and image.height > image.width:
        image = render(output_height=longest)
    return image


class BlankDrawing(ValueError):
    """An SVG that renders without error but shows nothing on white."""


def raster_of_svg(svg2png: Callable[..., bytes], path: Path) -> Image.Image:
    """The cropped raster of an SVG, closer when small on its page; :class:`BlankDrawing` when blank."""
    page = render_svg(svg2png, path, RENDER_SIZE, None)
    box = content_box(page)
    if box is None:
        raise BlankDrawing("nothing visible on white (white lines only, or a linked image that is missing)")
    extent = max(box[2] - box[0], box[3] - box[1])
    if extent < RASTER_SIZE and max(page.size) < MAX_RENDER_SIZE:
        longest = min(MAX_RENDER_SIZE, math.ceil(max(page.size) * RASTER_SIZE / extent))
        closer = render_svg(svg2png, path, longest, page.height > page.width)
        closer_box = content_box(closer)
        if closer_box is not None:
            page, box = closer, closer_box
    return crop_to_content(page, box)


def raster_of_file(path: Path, dataset: str) -> Image.Image:
    """The cropped raster of a drawing file: SVGs rendered with cairosvg, others read as bitmaps."""
    if path.suffix.lower() == ".svg":
        return raster_of_svg(cairosvg_svg2png(dataset), path)
    return raster_of_bitmap(path)
