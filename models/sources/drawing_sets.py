"""The build side shared by the drawing sets (the read side is :mod:`models.data.drawing_cache`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from models.data.cache_folders import cache_parent
from models.data.drawing_cache import MANIFEST_NAME, read_manifest
from models.data.types import DataError, LabelledImages
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.files.file_lock import file_lock
from models.sources.drawings import raster_of_file

T = TypeVar("T")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def fold(text: str, runs: re.Pattern[str] | None = None, joiner: str = "", quotes: str = "") -> str:
    """A keyword as a label: NFKC, stripped, lower case, each run of ``runs`` as one ``joiner``."""
    word = unicodedata.normalize("NFKC", text).strip().strip(quotes).lower()
    return runs.sub(joiner, word) if runs is not None else word


def files_below(root: Path, suffixes: tuple[str, ...], info: Callable[[str], T]) -> list[tuple[str, T]]:
    """``(relative path, info(path))`` of every file below ``root`` with one of ``suffixes``, sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith(".") or not name.lower().endswith(suffixes):
                continue
            path = os.path.join(folder, name)
            try:
                found.append((Path(path).relative_to(root).as_posix(), info(path)))
            except OSError:
                continue
    return sorted(found, key=lambda entry: entry[0])


def source_folder(root: Path | str | None, default: Path, inner: str) -> Path:
    """The absolute source folder (``default`` when blank), or its ``inner`` sub-folder when it has one."""
    given = root is not None and str(root).strip() != ""
    path = (Path(str(root).strip()).expanduser() if given else default).absolute()
    return path / inner if (path / inner).is_dir() else path


def listing_digest(rows: Iterable[Sequence[object]]) -> str:
    """A digest of a source listing: one ``\\0``-joined line per row (path, size, mtime, ...)."""
    digest = hashlib.blake2b(digest_size=16)
    for row in rows:
        digest.update(("\0".join(map(str, row)) + "\n").encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def cache_key(payload: dict[str, Any]) -> str:
    """A cache folder's name: the digest of ``payload`` (the rule, the source and its listing) as sorted JSON."""
    return hashlib.blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=8).hexdigest()


def check_min_count(kind: str, min_count: object) -> int:
    """``min_count`` as a positive int; a :class:`DataError` naming ``kind`` otherwise."""
    if isinstance(min_count, bool) or int(min_count) < 1:  # type: ignore[call-overload]
        raise DataError(f"{kind}: min-count must be a positive integer, got {min_count!r}")
    return int(min_count)  # type: ignore[call-overload]


def raster_name(name: str, identity: str) -> str:
    """A raster's file name: ``name`` made safe (60 characters at most) and a digest of ``identity``."""
    return f"{_NAME_UNSAFE.sub('_', name)[:60]}-{hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()}.png"


def failure(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters) of an exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def save_png(image: Any, path: Path) -> None:
    """Write a PIL image as the PNG ``path``, atomically (temp file + rename: an interrupted build resumes)."""
    with atomic_path(path, suffix=".png") as tmp:
        image.save(tmp, format="PNG")


def write_raster(path: Path, drawing: Path, dataset: str) -> str:
    """Rasterise ``drawing`` into ``path``: ``""`` or why it failed (``DataError`` if cairosvg is missing)."""
    try:
        image = raster_of_file(drawing, dataset)
    except DataError:
        raise
    except Exception as exc:  # PIL and cairosvg raise many types on bad files
        return failure(exc)
    save_png(image, path)
    return ""


def progress_bar(items: Sequence[T], desc: str, unit: str, progress: bool | None) -> Iterable[T]:
    """``items`` with a progress bar on stderr (``progress`` None: only on a terminal)."""
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, disable=None if progress is None else not progress)


def cached_manifest(kind: str, source: object, cache_dir: Path | None, digest: str,
                    build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """``(<cache_dir>/<kind>/<digest>, manifest)``, built under a lock when missing."""
    parent = cache_parent(kind, cache_dir)
    folder = parent / digest
    manifest = read_manifest(folder, digest)
    if manifest is not None:
        return folder, manifest
    with file_lock(parent / f".{digest}.lock"):
        manifest = read_manifest(folder, digest)
        if manifest is not None:  # another process built it while we waited
            return folder, manifest
        manifest = build(folder)
        if not manifest["images"]:
            raise DataError(f"{kind}: {source}: no image is left after cleaning (min-count "
                            f"{manifest['rule']['min_count']}); left out: {manifest['counts']['left_out']}")
        atomic_write_text(folder / MANIFEST_NAME, json.dumps(manifest, indent=1, ensure_ascii=False))
    return folder, manifest


def pixels_digest(path: Path) -> str:
    """A digest of an image file's RGB pixels and size: equal for identical rasters (a drawing filed twice)."""
    from PIL import Image

    with Image.open(path) as image:
        data = np.asarray(image.convert("RGB"))
    digest = hashlib.blake2b(data.tobytes(), digest_size=16)
    digest.update(f"{data.shape}".encode())
    return digest.hexdigest()


def grouped_splits(groups: Sequence[str], salt: str, fractions: Sequence[tuple[str, float]]) -> list[str]:
    """The split of each image, whole groups ranked by a hash of ``salt:group`` filling each split in turn."""
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


def command_line_parser(prog: str, description: str, root_help: str, min_count: int, label: str,
                        rule_help: str) -> argparse.ArgumentParser:
    """The ``python -m models.sources.<drawings>`` parser with the options every drawing set shares."""
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


def frequent(counter: Counter[str], min_count: int) -> tuple[list[str], dict[str, int]]:
    """The classes (the labels on at least ``min_count`` images, sorted) and every label's count, most first."""
    return (sorted(label for label, n in counter.items() if n >= min_count),
            dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))))


def reason_counts(left_out: list[dict[str, Any]], reasons: Sequence[str]) -> dict[str, int]:
    """How many entries of ``left_out`` give each of ``reasons``, in that order."""
    return {reason: sum(1 for entry in left_out if entry["reason"] == reason) for reason in reasons}


def split_counts(parts: dict[str, LabelledImages], noun: str = "images") -> str:
    """``1,234 images (train 740, val 247, test 247)``."""
    return (f"{sum(len(p) for p in parts.values()):,} {noun} ("
            + ", ".join(f"{s} {len(p):,}" for s, p in parts.items()) + ")")


def labels_per_image(parts: dict[str, LabelledImages]) -> str:
    """The mean number of labels per image over ``parts``, with two decimals."""
    labels = sum(int(p.labels.sum()) for p in parts.values())
    return f"{labels / max(1, sum(len(p) for p in parts.values())):.2f}"


def images_line(manifest: dict[str, Any]) -> str:
    """The report's line of images per split, classes and labels per image."""
    images = manifest["images"]
    by_split = Counter(image["split"] for image in images)
    labels = sum(len(image["labels"]) for image in images)
    return (f"images: {len(images):,} (train {by_split['train']:,}, val {by_split['val']:,}, test "
            f"{by_split['test']:,}); classes: {len(manifest['classes'])} (min count {manifest['rule']['min_count']}); "
            f"labels per image: {labels / max(1, len(images)):.2f}")


def run_command(ensure: Callable[[], tuple[Path, dict[str, Any]]],
                report: Callable[[Path, dict[str, Any]], None]) -> int:
    """A drawing set's command line: build the cache if needed and report it; exit 2 on a ``DataError``."""
    try:
        started = time.perf_counter()
        folder, manifest = ensure()
        print(f"ready in {time.perf_counter() - started:.1f} s")
        report(folder, manifest)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
