"""The cache of a dataset built once from drawings (the Open Clip Art Library, the Tux Paint stamps): a folder per
digest of the source and the rule, its rasters and a ``manifest.json`` that is written last, so a folder without a
valid manifest is built (again) under a lock, and an interrupted build resumes."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.data.spec_options import split_spec_options
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages
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


def pixels_digest(path: Path) -> str:
    """A digest of an image file's RGB pixels and size: equal for identical rasters (a drawing filed twice)."""
    from PIL import Image

    with Image.open(path) as image:
        data = np.asarray(image.convert("RGB"))
    digest = hashlib.blake2b(data.tobytes(), digest_size=16)
    digest.update(f"{data.shape}".encode())
    return digest.hexdigest()


def grouped_splits(groups: Sequence[str], salt: str, fractions: Sequence[tuple[str, float]]) -> list[str]:
    """The split of each image with the given ``groups`` (images of a group never straddle two splits): groups
    ranked by a hash of ``salt:group``, filled into the first split until it holds its fraction of the images, then
    the next; the last split takes the rest."""
    sizes = Counter(groups)
    order = sorted(sizes, key=lambda g: hashlib.blake2b(f"{salt}:{g}".encode(), digest_size=16).hexdigest())
    split_of: dict[str, str] = {}
    filled, bound, position = 0, fractions[0][1] * len(groups), 0
    for group in order:
        while position < len(fractions) - 1 and filled >= bound:
            position += 1
            bound += fractions[position][1] * len(groups)
        split_of[group] = fractions[position][0]
        filled += sizes[group]
    return [split_of[g] for g in groups]


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


#: The options of a drawing dataset's spec, and the view that keeps one folder label per train and val image.
SPEC_OPTIONS = ("view", "min-count")
FOLDER_VIEW = "folders"


def parse_spec(kind: str, argument: str, views: Sequence[str], min_count: int) -> tuple[str, str, int]:
    """``DIR[?view=V][&min-count=N]`` of a drawing dataset -> (DIR, view, min count); ``views[0]`` (the full-label
    view) and ``min_count`` when not given."""
    path, options = split_spec_options(argument, SPEC_OPTIONS, kind)
    view = options.get("view", views[0]) or views[0]
    if view not in views:
        raise DataError(f"{kind}:{argument}: unknown view {view!r} (use view={FOLDER_VIEW}, or no view for the full "
                        "labels)")
    text = options.get("min-count", str(min_count))
    if not text.isdigit() or int(text) < 1:
        raise DataError(f"{kind}:{argument}: min-count must be a positive integer, got {text!r}")
    return path.strip(), view, int(text)


def dataset_name(kind: str, argument: str) -> str:
    """The dataset name of a drawing spec without loading: ``kind``, or ``kind-folders`` for the folder view."""
    try:
        _, options = split_spec_options(argument, SPEC_OPTIONS, kind)
    except DataError:
        return kind
    return f"{kind}-{FOLDER_VIEW}" if options.get("view") == FOLDER_VIEW else kind


def view_splits(kind: str, source: str, view: str, full_view: str, min_count: int, default_min_count: int,
                classes: list[str], parts: dict[str, LabelledImages]) -> DatasetSplits:
    """The :class:`DatasetSplits` of one view of a drawing dataset: named as :func:`dataset_name`, its ``source``
    the normalised spec; every split complete in the full-label view, only test in the folder view (its train and
    val labels are one folder each, as a user's own data)."""
    if not len(parts["train"]):
        raise DataError(f"{kind}: {source}: the {view} view has no training image")
    options = [f"view={view}"] if view != full_view else []
    if int(min_count) != default_min_count:
        options.append(f"min-count={int(min_count)}")
    folders = view == FOLDER_VIEW
    return DatasetSplits(
        name=f"{kind}-{FOLDER_VIEW}" if folders else kind,
        source=f"{kind}:{source}" + (f"?{'&'.join(options)}" if options else ""), classes=classes,
        train=parts["train"], val=parts["val"] if len(parts["val"]) else None,
        test=parts["test"] if len(parts["test"]) else None,
        complete_splits=("test",) if folders else ALL_SPLITS,
    )


def command_line_parser(prog: str, description: str, root_help: str, min_count: int, label: str,
                        rule_help: str) -> argparse.ArgumentParser:
    """The ``python -m models.data.<drawings>`` parser: the source folder, ``--min-count``, ``--cache``, ``--rule``
    and ``--quiet`` (a dataset adds its own options)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("root", nargs="?", default=None, metavar="DIR", help=root_help)
    parser.add_argument("--min-count", type=int, default=min_count,
                        help=f"least number of images a {label} needs to be a class (default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="cache root (default: $SPML_CACHE, else ~/.cache/spml)")
    parser.add_argument("--rule", action="store_true", help=rule_help)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def rule_lines(tables: dict[str, dict[str, str]]) -> str:
    """``--rule``'s listing: each table's title, then one ``  key: value`` line per entry."""
    return "".join(f"{title}:\n" + "".join(f"  {k}: {v}\n" for k, v in table.items())
                   for title, table in tables.items())
