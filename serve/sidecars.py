"""Sidecar text files: one file of tags per image, next to it or in a mirrored tree."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.atomic_files import atomic_write_text
from models.image_files import IMAGE_EXTENSIONS
from serve.records import DEFAULT_SEPARATOR, split_tags

DEFAULT_SIDECAR_EXT = ".txt"


@dataclass(frozen=True)
class SidecarSpec:
    """Sidecar text files: ``ext`` (with its dot), tag ``separator``, and ``folder`` (``None``: next to each
    image; else a tree mirroring the input folder's)."""

    ext: str = DEFAULT_SIDECAR_EXT
    separator: str = DEFAULT_SEPARATOR
    folder: Path | None = None

    def __post_init__(self) -> None:
        if not self.ext.startswith(".") or len(self.ext) < 2 or "/" in self.ext or os.sep in self.ext:
            raise ValueError(f"sidecar extension must look like .txt, got {self.ext!r}")
        if self.ext.lower() in IMAGE_EXTENSIONS:
            raise ValueError(f"sidecar extension {self.ext} is an image extension: it would overwrite images")
        if not self.separator:
            raise ValueError("the tag separator must not be empty")


def sidecar_paths(folder: Path, images: Sequence[Path], spec: SidecarSpec) -> dict[Path, Path]:
    """Sidecar file of each image: ``a.jpg`` -> ``a.txt`` (under ``spec.folder`` if set, mirroring the tree).
    Images whose names would share a sidecar (``a.jpg`` and ``a.png``) keep their suffix: ``a.jpg.txt``."""
    base = spec.folder if spec.folder is not None else folder

    def short(image: Path) -> Path:
        return base / image.relative_to(folder).with_suffix(spec.ext)

    counts = Counter(short(p) for p in images)
    return {p: short(p) if counts[short(p)] == 1 else base / image_rel_with_ext(folder, p, spec.ext) for p in images}


def image_rel_with_ext(folder: Path, image: Path, ext: str) -> Path:
    """``sub/a.jpg`` -> ``sub/a.jpg<ext>``: the sidecar name used when stems collide."""
    rel = image.relative_to(folder)
    return rel.with_name(rel.name + ext)


def merge_tags(existing: Sequence[str], new: Sequence[str]) -> list[str]:
    """``existing`` followed by the tags of ``new`` not already in it (each tag once)."""
    out = list(dict.fromkeys(existing))
    out.extend(t for t in new if t not in out)
    return out


def write_sidecar(path: Path, tags: Sequence[str], spec: SidecarSpec, append: bool) -> None:
    """Write the tags to ``path`` atomically; with ``append``, after the tags already there (no duplicates)."""
    if append and path.is_file():
        tags = merge_tags(split_tags(path.read_text(encoding="utf-8"), spec.separator), tags)
    atomic_write_text(path, spec.separator.join(tags) + "\n")
