"""Which files are images: the one list of image file extensions (no heavy imports, for quick command lines)."""

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
