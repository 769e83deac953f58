"""Every file under a folder as a set of relative paths, for existence checks on large image sets.

Checking 269,648 NUS-WIDE paths with one ``stat`` call each is slow on network disks; one walk of the tree into
a set of relative paths answers the same question with one directory read per folder. The walk is the one folder
walk of every stage (:mod:`models.files.folder_walk`), with its rule: hidden entries skipped, symbolic links to
folders not entered.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from models.files.folder_walk import walk_folder

__all__ = ["scan_files"]


def scan_files(root: Path, desc: str, progress: bool | None = None) -> set[str]:
    """Return the paths (relative to ``root``, ``/``-separated) of every file under ``root`` by the one folder
    walk's rule (:mod:`models.files.folder_walk`); an unreadable folder is skipped. A tqdm bar on stderr counts the
    entries read (shown when ``progress`` is True, or by default when stderr is a terminal)."""
    with tqdm(desc=desc, unit="file", file=sys.stderr, disable=None if progress is None else not progress,
              leave=False) as bar:
        listing = walk_folder(Path(root), on_folder=bar.update)
    return {listing.relative(path) for path in listing.files}
