"""Every file under a folder as a set of relative paths: one directory read per folder instead of one ``stat`` per
path."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from models.files.folder_walk import walk_folder

__all__ = ["scan_files"]


def scan_files(root: Path, desc: str, progress: bool | None = None) -> set[str]:
    """The relative paths of every file under ``root`` by the one folder walk (``progress``: a tqdm bar)."""
    with tqdm(desc=desc, unit="file", file=sys.stderr, disable=None if progress is None else not progress,
              leave=False) as bar:
        listing = walk_folder(Path(root), on_folder=bar.update)
    return {listing.relative(path) for path in listing.files}
