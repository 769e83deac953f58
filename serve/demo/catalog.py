"""The demo's catalogue (no gradio, no torch): model files under the runs folder, example images."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta


SEARCH_DEPTH = 3  # how deep under the runs folder to look for run folders (runs/compare/<run>/ is depth 2)
DEFAULT_EXAMPLES = 8


def find_models(runs_dir: str | Path, max_depth: int = SEARCH_DEPTH) -> dict[str, Path]:
    """Model files under ``runs_dir`` (``best.pt`` and exports), keyed by their relative path; newest run first."""
    from serve.model_files import models_in_folder

    root = Path(runs_dir)
    if not root.is_dir():
        return {}
    folders: list[tuple[float, Path]] = []
    for current, dirs, _files in os.walk(root):
        here = Path(current)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "export") if depth < max_depth else []
        models = models_in_folder(here)
        if models:
            folders.append((max(p.stat().st_mtime for p in models), here))
    found: dict[str, Path] = {}
    for _mtime, folder in sorted(folders, key=lambda item: (-item[0], str(item[1]))):
        for path in models_in_folder(folder):
            found[path.relative_to(root).as_posix()] = path
    return found


@dataclass
class ExampleSet:
    """Example images for the demo, the true labels of those that have them (by file content), and a note."""

    images: list[Path] = field(default_factory=list)
    labels: dict[str, list[str]] = field(default_factory=dict)  # sha1 of the file -> true labels
    note: str = ""

    def truth_for(self, data: bytes) -> list[str] | None:
        """The true labels of an example image given its bytes (``None`` for any other image)."""
        if not self.labels:
            return None
        return self.labels.get(hashlib.sha1(data).hexdigest())


def _read_labels_csv(folder: Path) -> list[tuple[Path, list[str], str]]:
    """``(image path, labels, split)`` rows of a dataset folder's ``labels.csv`` (the package's CSV format)."""
    rows = []
    with open(folder / "labels.csv", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            labels = [x for x in (row.get("labels") or "").split(";") if x]
            rows.append((folder / row["image"], labels, (row.get("split") or "train").strip()))
    return rows


def _pick_covering(rows: list[tuple[Path, list[str], str]], limit: int) -> list[tuple[Path, list[str]]]:
    """Up to ``limit`` rows chosen greedily so that together they show as many different classes as possible."""
    chosen: list[tuple[Path, list[str]]] = []
    seen: set[str] = set()
    pool = [(p, labels) for p, labels, _ in rows if p.is_file()]
    while pool and len(chosen) < limit:
        best = max(range(len(pool)), key=lambda i: (len(set(pool[i][1]) - seen), -i))
        path, labels = pool.pop(best)
        chosen.append((path, labels))
        seen.update(labels)
    return chosen


def _builtin_folders(meta: ModelMeta | None) -> list[Path]:
    """Generated built-in dataset folders in the cache, the model's own dataset first; nothing is generated."""
    from models.data.cache_folders import builtin_folder, generated_builtin_folders
    from models.data.registry import parse_builtin_argument

    folders = []
    source = str((meta.data or {}).get("source", "")) if meta is not None else ""
    if source.startswith("builtin"):
        with contextlib.suppress(ValueError):
            folders.append(builtin_folder(*parse_builtin_argument(source.partition(":")[2])))
    folders += generated_builtin_folders()
    classes = list(meta.classes) if meta is not None else None
    usable = []
    for folder in dict.fromkeys(folders):
        if not (folder / ".complete").is_file():
            continue
        if classes is not None and (folder / "classes.txt").read_text().split() != classes:
            continue
        usable.append(folder)
    return usable


def find_examples(
    meta: ModelMeta | None, folder: str | Path | None = None, limit: int = DEFAULT_EXAMPLES
) -> ExampleSet:
    """Example images of ``folder`` (with its labels), else cached built-in test images; never generates data."""
    from models.files.folder_walk import find_images

    if limit <= 0:
        return ExampleSet(note="examples disabled")
    if folder is not None:
        folder = Path(folder)
        if (folder / "labels.csv").is_file():
            rows = _read_labels_csv(folder)
            picked = _pick_covering([r for r in rows if r[2] == "test"] or rows, limit)
        else:
            picked = [(p, []) for p in find_images(folder)[:limit]]
        return _example_set(picked, f"from {folder}")
    for dataset in _builtin_folders(meta):
        rows = [r for r in _read_labels_csv(dataset) if r[2] == "test"][: 40 * limit]
        picked = _pick_covering(rows, limit)
        if picked:
            return _example_set(picked, f"test images of the built-in dataset ({dataset.name})")
    from models.data.cache_folders import cache_root

    return ExampleSet(
        note=f"no example images: the built-in dataset is not generated under {cache_root()} "
        "(`python -m models.sources.builtin --preset default` makes it in about a minute), or pass --examples DIR")


def _example_set(picked: list[tuple[Path, list[str]]], where: str) -> ExampleSet:
    labels = {hashlib.sha1(p.read_bytes()).hexdigest(): names for p, names in picked if names}
    note = f"{len(picked)} {where}" + ("; their true labels are shown with the scores" if labels else "")
    return ExampleSet(images=[p for p, _ in picked], labels=labels, note=note)
