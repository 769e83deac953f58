"""The one walk of a folder tree, so every stage that lists files sees the same ones: hidden entries skipped, links to
files listed, links to folders not entered, unlistable folders reported; sorted by relative POSIX path."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from models.files.image_extensions import is_image_name


def is_hidden(name: str) -> bool:
    """True for a hidden entry (its name starts with ``.``), which the walk skips."""
    return name.startswith(".")


@dataclass
class FolderListing:
    """What :func:`walk_folder` found below ``root`` (see the module docstring for the rule)."""

    root: Path
    files: list[Path] = field(default_factory=list)  # sorted by relative POSIX path
    hidden: list[Path] = field(default_factory=list)  # hidden files, skipped (hidden folders are not entered)
    linked_folders: list[Path] = field(default_factory=list)  # symbolic links to folders, not entered
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # (folder, reason) of folders not listed

    def relative(self, path: Path) -> str:
        """``path`` relative to the root, ``/``-separated (``.`` for the root itself)."""
        return path.relative_to(self.root).as_posix()

    def images(self) -> list[Path]:
        """The files whose extension is an image's (:mod:`models.files.image_extensions`), in listing order."""
        return [p for p in self.files if is_image_name(p.name)]

    def ignored(self) -> list[Path]:
        """The files that are not images by their extension, then the hidden files."""
        return [p for p in self.files if not is_image_name(p.name)] + self.hidden


def walk_folder(root: str | Path, on_folder: Callable[[int], None] | None = None) -> FolderListing:
    """Walk ``root`` by the module's rule; ``on_folder`` gets each folder's entry count (for progress)."""
    root = Path(root)
    listing = FolderListing(root)
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as found:
                entries = list(found)
        except OSError as exc:
            listing.unreadable.append((folder, exc.strerror or str(exc)))
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                real_folder = entry.is_dir(follow_symlinks=False)
                linked_folder = not real_folder and entry.is_symlink() and entry.is_dir()
            except OSError:
                real_folder = linked_folder = False
            if is_hidden(entry.name):
                if not real_folder and not linked_folder:
                    listing.hidden.append(path)
            elif real_folder:
                pending.append(path)
            elif linked_folder:
                listing.linked_folders.append(path)
            else:
                listing.files.append(path)
        if on_folder is not None:
            on_folder(len(entries))
    listing.files.sort(key=listing.relative)
    listing.hidden.sort(key=listing.relative)
    listing.linked_folders.sort(key=listing.relative)
    return listing


def find_images(root: str | Path) -> list[Path]:
    """The image files below ``root`` (by extension), sorted by relative POSIX path: :func:`walk_folder`'s rule."""
    return walk_folder(root).images()
