"""The cache of a dataset built once from drawings (the Open Clip Art Library, the Tux Paint stamps): a folder per
digest of the source and the rule, its rasters and a ``manifest.json`` that is written last, so a folder without a
valid manifest is built (again) under a lock, and an interrupted build resumes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.data.types import DataError, LabelledImages
from models.files.atomic_writes import atomic_write_text
from models.files.file_lock import file_lock

#: The manifest of a cache folder, and the version of its format (a change rebuilds every cache).
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def cache_parent(kind: str, cache_dir: str | Path | None) -> Path:
    """``<cache_dir>/<kind>``; ``cache_dir`` defaults to ``$SPML_CACHE``, else ``~/.cache/spml``."""
    if cache_dir is None:
        from models.data.builtin import cache_root  # lazy: builtin imports the scene generator

        cache_dir = cache_root()
    return Path(cache_dir).expanduser() / kind


def _read(folder: Path, digest: str) -> dict[str, Any] | None:
    """The folder's manifest when it is complete, of this format and digest, and its rasters exist; else None."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or manifest.get("digest") != digest:
        return None
    return manifest if all((folder / image["file"]).is_file() for image in manifest.get("images", [])) else None


def cached_manifest(kind: str, source: object, parent: Path, digest: str,
                    build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """``(parent/digest, manifest)``, calling ``build(folder)`` (which writes the rasters and returns the manifest,
    with ``format`` :data:`MANIFEST_FORMAT` and ``digest``) under a lock when the folder has no valid manifest; a
    :class:`DataError` naming ``kind`` and ``source`` when nothing is left."""
    folder = parent / digest
    manifest = _read(folder, digest)
    if manifest is not None:
        return folder, manifest
    with file_lock(parent / f".{digest}.lock"):
        manifest = _read(folder, digest)
        if manifest is not None:  # another process built it while we waited
            return folder, manifest
        manifest = build(folder)
        if not manifest["images"]:
            raise DataError(f"{kind}: {source}: no image is left after cleaning (min-count "
                            f"{manifest['rule']['min_count']}); left out: {manifest['counts']['left_out']}")
        atomic_write_text(folder / MANIFEST_NAME, json.dumps(manifest, indent=1, ensure_ascii=False))
    return folder, manifest


def labelled(rows: Sequence[tuple[Path, Sequence[str]]], classes: Sequence[str]) -> LabelledImages:
    """Images and their label names as :class:`LabelledImages` over ``classes``."""
    index = {name: i for i, name in enumerate(classes)}
    labels = np.zeros((len(rows), len(classes)), dtype=np.uint8)
    for row, (_, names) in enumerate(rows):
        labels[row, [index[name] for name in names]] = 1
    return LabelledImages([path for path, _ in rows], labels, list(classes))


def class_lines(manifest: dict[str, Any], width: int) -> list[str]:
    """The report's lines of images per class (all, train, val, test), the most frequent first."""
    per: dict[str, Counter[str]] = {name: Counter() for name in manifest["classes"]}
    for image in manifest["images"]:
        for name in image["labels"]:
            per[name][image["split"]] += 1
    lines = ["classes (images: all / train / val / test):"]
    for name in sorted(per, key=lambda n: (-sum(per[n].values()), n)):
        c = per[name]
        lines.append(f"  {name:<{width}} {sum(c.values()):>5} {c['train']:>5} {c['val']:>5} {c['test']:>5}")
    return lines
