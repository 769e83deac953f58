"""Sidecar files, one per image and format, next to it or in a mirrored tree (``a.jpg`` -> ``a.txt``, ``a.json``,
``a.jpg.xmp``; images sharing a stem keep their suffix)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.files.atomic_writes import atomic_write_text
from models.files.image_extensions import IMAGE_EXTENSIONS
from serve.outputs.records import DEFAULT_SEPARATOR
from serve.outputs.sidecar_formats import SIDECAR_FORMATS

DEFAULT_SIDECAR_EXT = ".txt"
DEFAULT_FORMATS = ("txt",)


@dataclass(frozen=True)
class SidecarSpec:
    """Sidecar files: ``formats``, the ``txt`` ``ext`` and ``separator``, and ``folder`` (None: beside images)."""

    ext: str = DEFAULT_SIDECAR_EXT
    separator: str = DEFAULT_SEPARATOR
    folder: Path | None = None
    formats: tuple[str, ...] = DEFAULT_FORMATS

    def __post_init__(self) -> None:
        if not self.ext.startswith(".") or len(self.ext) < 2 or "/" in self.ext or os.sep in self.ext:
            raise ValueError(f"sidecar extension must look like .txt, got {self.ext!r}")
        if self.ext.lower() in IMAGE_EXTENSIONS:
            raise ValueError(f"sidecar extension {self.ext} is an image extension: it would overwrite images")
        if not self.separator:
            raise ValueError("the tag separator must not be empty")
        if not self.formats:
            raise ValueError(f"sidecar formats must be some of {', '.join(SIDECAR_FORMATS)}, got none")
        fixed = {f: SIDECAR_FORMATS[f].suffix for f in self.formats}  # an unknown format: the one message
        clash = [f for f, suffix in fixed.items() if suffix is not None and suffix == self.ext.lower()]
        if any(suffix is None for suffix in fixed.values()) and clash:
            raise ValueError(f"sidecar extension {self.ext} is the {clash[0]} sidecars' own: choose another")

    def ext_of(self, fmt: str) -> str:
        """The suffix a sidecar of format ``fmt`` adds."""
        return SIDECAR_FORMATS[fmt].suffix or self.ext


def sidecar_paths(folder: Path, images: Sequence[Path], spec: SidecarSpec) -> dict[Path, dict[str, Path]]:
    """The sidecar file of each image in each format, under ``spec.folder`` when set."""
    base = spec.folder if spec.folder is not None else folder
    out: dict[Path, dict[str, Path]] = {p: {} for p in images}
    for fmt in spec.formats:
        ext = spec.ext_of(fmt)
        if SIDECAR_FORMATS[fmt].after_image_name:
            for p in images:
                out[p][fmt] = base / image_rel_with_ext(folder, p, ext)
            continue
        short = {p: base / p.relative_to(folder).with_suffix(ext) for p in images}
        counts = Counter(short.values())
        for p in images:
            out[p][fmt] = short[p] if counts[short[p]] == 1 else base / image_rel_with_ext(folder, p, ext)
    return out


def image_rel_with_ext(folder: Path, image: Path, ext: str) -> Path:
    """``sub/a.jpg`` -> ``sub/a.jpg<ext>``: the sidecar name used when stems collide (and always for XMP)."""
    rel = image.relative_to(folder)
    return rel.with_name(rel.name + ext)


def write_sidecars(paths: Mapping[str, Path], tags: Sequence[str], scores: Mapping[str, float],
                   extra: Mapping[str, Any], spec: SidecarSpec, append: bool) -> None:
    """Write one image's sidecars atomically, updating existing ones (tags replaced, or merged with ``append``). Raises
    ``ValueError`` naming a ``json`` / ``xmp`` file that cannot be read as one."""
    for fmt, path in paths.items():
        existing = path.read_text(encoding="utf-8") if path.is_file() else None
        try:
            text = SIDECAR_FORMATS[fmt].render(existing, tags, scores, extra, spec.separator, append)
        except ValueError as exc:
            raise ValueError(f"existing sidecar {path} cannot be updated: {exc}") from None
        atomic_write_text(path, text)
