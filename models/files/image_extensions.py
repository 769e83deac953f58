"""Which files are images: the one list of image file extensions (no heavy imports, for quick command lines)."""

from __future__ import annotations

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def is_image_name(name: str) -> bool:
    """True when the file name ``name`` has an image extension (any case)."""
    dot = name.rfind(".")
    return dot > 0 and name[dot:].lower() in IMAGE_EXTENSIONS
