"""Sorting images into folders by tag (``--sort-into DIR``) by link or copy (:data:`LINK_MODES`); a re-run adds what is
missing, and an entry that is another file is an error, never overwritten."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from models.files.atomic_writes import atomic_path
from models.registry import Row, Table


def _copy(image: Path, entry: Path) -> None:
    with atomic_path(entry) as tmp:
        shutil.copy2(image, tmp)


def _symlink(image: Path, entry: Path) -> None:
    entry.symlink_to(image)


#: How an image is placed in a tag folder (``--sort-mode``): name, help, ``place(image, entry)``.
LINK_MODES: Table[Callable[[Path, Path], None]] = Table("link mode", [
    Row("symlink", "a symbolic link to the image", _symlink),
    Row("hardlink", "a hard link (the same file system only)", os.link),
    Row("copy", "a copy", _copy),
])
DEFAULT_LINK_MODE = "symlink"
DEFAULT_UNTAGGED = "_untagged"


class TagFolderError(OSError):
    """An image could not be placed in a tag folder (the message says which and why)."""


@dataclass(frozen=True)
class TagFolders:
    """Where and how to sort images: ``root``, ``how`` (:data:`LINK_MODES`) and the untagged folder's name."""

    root: Path
    how: str = DEFAULT_LINK_MODE
    untagged: str = DEFAULT_UNTAGGED

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        LINK_MODES.row(self.how)  # an unknown mode: the one message listing them
        folder_name(self.untagged)  # validates


def folder_name(tag: str) -> str:
    """The folder name of a tag: path separators become ``_``; names that cannot be folders are refused."""
    name = tag.replace("/", "_").replace("\\", "_").strip()
    if name in ("", ".", "..") or "\0" in name:
        raise ValueError(f"tag {tag!r} cannot be a folder name")
    return name


def _same_image(entry: Path, image: Path) -> bool:
    """True when ``entry`` already is ``image`` (the link target, the same inode, or identical bytes)."""
    if entry.is_symlink():
        return Path(os.readlink(entry)) == image
    if not entry.is_file():
        return False
    if os.path.samefile(entry, image):
        return True
    if entry.stat().st_size != image.stat().st_size:
        return False
    with entry.open("rb") as a, image.open("rb") as b:
        while True:
            x, y = a.read(1 << 20), b.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def place(image: Path, rel: str, tags: Sequence[str], spec: TagFolders) -> int:
    """Put ``image`` into each tag's folder; returns the entries created. Raises :class:`TagFolderError`."""
    image = image.resolve()
    created = 0
    for tag in dict.fromkeys(tags or [spec.untagged]):
        entry = spec.root / folder_name(tag) / rel
        if entry.exists() or entry.is_symlink():
            if _same_image(entry, image):
                continue
            raise TagFolderError(f"{entry} exists and is not {image}: not overwritten")
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            LINK_MODES[spec.how](image, entry)
        except OSError as exc:
            hint = " (hard links need the same file system: use --sort-mode symlink or copy)" \
                if spec.how == "hardlink" else ""
            raise TagFolderError(f"cannot {spec.how} {image} to {entry}: {exc.strerror or exc}{hint}") from exc
        created += 1
    return created
