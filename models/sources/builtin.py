"""The built-in procedural multi-label dataset: presets, generation into the cache (byte-identical whatever the number
of workers) and ``python -m models.sources.builtin --preset default --seed 0``."""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from models.data.cache_folders import builtin_folder
from models.data.types import DataError, LabelledImages, ObjectTable
from models.files.file_lock import file_lock
from models.registry import Row, Table, UnknownName
from models.sources.builtin_attributes import DENSE_CLASS_NAMES, generate_dense_image
from models.sources.builtin_scenes import SPLITS, SUPERSAMPLE, generate_image, labelled_objects
from models.sources.shapes import CLASS_NAMES

__all__ = ["BUILTIN_PRESETS", "BuiltinPreset", "builtin_objects", "ensure_builtin", "label_statistics",
           "read_label_matrix"]

JPEG_QUALITY = 90


@dataclass(frozen=True)
class BuiltinPreset:
    """A named size of the built-in dataset; ``attributes``: the dense variant with attribute labels."""

    name: str
    image_size: int
    n_train: int
    n_test: int
    attributes: bool = False

    @property
    def classes(self) -> tuple[str, ...]:
        """The preset's class names, in label order."""
        return DENSE_CLASS_NAMES if self.attributes else tuple(CLASS_NAMES)


#: Images are seeded by ``(seed, split, index)`` only, so ``small`` is exactly the first 2,000 training images of
#: ``default`` with the same 2,000 test images: the regime where a network memorises its assumed negatives within
#: a CPU budget, measured on the same test set as ``default``. The ``dense-*`` presets are the same images (same
#: seed) labelled with 7 attributes on top of the 20 shapes: about 6.4 positives per image instead of 2.8.
BUILTIN_PRESETS: Table[BuiltinPreset] = Table("builtin preset", [
    Row(p.name, f"{p.n_train:,} training, {p.n_test:,} test images of {p.image_size} px"
        + (", 7 attributes" if p.attributes else ""), p)
    for p in (
    BuiltinPreset("tiny", 64, 200, 80),
    BuiltinPreset("small", 96, 2000, 2000),
    BuiltinPreset("default", 96, 16000, 2000),
    BuiltinPreset("large", 448, 30000, 6000),
    BuiltinPreset("dense-tiny", 64, 200, 80, attributes=True),
    BuiltinPreset("dense-small", 96, 2000, 2000, attributes=True),
    BuiltinPreset("dense", 96, 16000, 2000, attributes=True),
)])


# --------------------------------------------------------------------------------------------------------
# Statistics


def label_statistics(labels: np.ndarray) -> dict[str, Any]:
    """Summarise an ``(N, C)`` label matrix: images, labels per image, class frequencies, most/least ratio."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be a 2-D (N, C) matrix, got shape {labels.shape}")
    per_image = labels.sum(axis=1)
    freq = labels.mean(axis=0) if len(labels) else np.zeros(labels.shape[1])
    ratio = float(freq.max() / freq.min()) if len(freq) and freq.min() > 0 else math.inf
    return {
        "n_images": len(labels),
        "mean_labels": float(per_image.mean()) if len(labels) else 0.0,
        "min_labels": int(per_image.min()) if len(labels) else 0,
        "max_labels": int(per_image.max()) if len(labels) else 0,
        "class_frequency": [float(f) for f in freq],
        "max_min_ratio": ratio}


def read_label_matrix(folder: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """A generated dataset folder read back: ``(classes, labels (N, C) uint8, splits)`` in ``labels.csv`` order."""
    folder = Path(folder)
    classes = (folder / "classes.txt").read_text().split()
    index = {name: i for i, name in enumerate(classes)}
    rows, splits = [], []
    with open(folder / "labels.csv", newline="") as f:
        for row in csv.DictReader(f):
            vec = np.zeros(len(classes), dtype=np.uint8)
            for name in row["labels"].split(";"):
                vec[index[name]] = 1
            rows.append(vec)
            splits.append(row["split"])
    labels = np.stack(rows) if rows else np.zeros((0, len(classes)), dtype=np.uint8)
    return classes, labels, splits


# --------------------------------------------------------------------------------------------------------
# Generation into the cache


def _generate_chunk(folder: str, seed: int, split: str, start: int, stop: int, preset: BuiltinPreset) -> list[str]:
    """Worker: write images ``start:stop`` of ``split`` into ``folder``; returns their ';'-joined labels."""
    out = []
    generate = generate_dense_image if preset.attributes else generate_image
    for index in range(start, stop):
        img, labels = generate(seed, split, index, preset.image_size)
        img.save(Path(folder) / "images" / split / f"{index:06d}.jpg", format="JPEG", quality=JPEG_QUALITY)
        out.append(";".join(preset.classes[c] for c in np.flatnonzero(labels)))
    return out


def _write_dataset(folder: Path, preset: BuiltinPreset, seed: int, workers: int, progress: bool) -> None:
    for split in SPLITS:
        (folder / "images" / split).mkdir(parents=True, exist_ok=True)
    sizes = {"train": preset.n_train, "test": preset.n_test}
    total = preset.n_train + preset.n_test
    chunk = max(8, min(100, math.ceil(total / (max(workers, 1) * 8))))
    tasks = [(split, s, min(s + chunk, n)) for split, n in sizes.items() for s in range(0, n, chunk)]
    results: dict[tuple[str, int], list[str]] = {}
    bar = tqdm(total=total, desc=f"builtin {preset.name}", unit="img", file=sys.stderr, disable=not progress)
    with bar:
        if workers <= 1:
            for split, start, stop in tasks:
                results[split, start] = _generate_chunk(str(folder), seed, split, start, stop, preset)
                bar.update(stop - start)
        else:
            pool = ProcessPoolExecutor(max_workers=workers)
            try:
                futures = {pool.submit(_generate_chunk, str(folder), seed, split, start, stop, preset):
                           (split, start, stop) for split, start, stop in tasks}
                for fut in as_completed(futures):
                    split, start, stop = futures[fut]
                    results[split, start] = fut.result()
                    bar.update(stop - start)
            finally:
                # On an error or Ctrl-C, drop the queued chunks instead of finishing them.
                pool.shutdown(wait=True, cancel_futures=True)

    (folder / "classes.txt").write_text("".join(f"{name}\n" for name in preset.classes))
    with open(folder / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["image", "labels", "split"])
        for split, start, _stop in tasks:
            for offset, label_str in enumerate(results[split, start]):
                writer.writerow([f"images/{split}/{start + offset:06d}.jpg", label_str, split])
    (folder / ".complete").write_text(f"preset={preset.name} seed={seed}\n")


def _objects_chunk(seed: int, indices: list[int], image_size: int) -> list[tuple[np.ndarray, list[Any]]]:
    """Worker: :func:`labelled_objects` of training images ``indices``."""
    return [labelled_objects(seed, "train", index, image_size) for index in indices]


def builtin_objects(preset: str, seed: int, train: LabelledImages) -> ObjectTable:
    """The :class:`ObjectTable` of the built-in training images, regenerated from their seeds without painting."""
    spec = BUILTIN_PRESETS[preset]
    indices = [int(path.stem) for path in train.paths]
    chunks = [indices[start:start + 200] for start in range(0, len(indices), 200)]
    workers = _default_workers(spec)
    bar = tqdm(total=len(indices), desc="builtin objects", unit="img", file=sys.stderr, disable=None,
               leave=False)  # shown on a terminal
    results: list[tuple[np.ndarray, list[Any]]] = []
    with bar, (ProcessPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext()) as pool:
        parts = (pool.map(_objects_chunk, [seed] * len(chunks), chunks, [spec.image_size] * len(chunks))
                 if pool is not None else (_objects_chunk(seed, chunk, spec.image_size) for chunk in chunks))
        for part in parts:
            results.extend(part)
            bar.update(len(part))
    for row, (labels, _objects) in enumerate(results):
        if not np.array_equal(labels, train.labels[row]):
            raise DataError(f"{train.paths[row]}: its labels differ from the generator's; regenerate the built-in "
                            "data (delete its cache folder)")
    canvas = float(SUPERSAMPLE * spec.image_size)
    return ObjectTable.from_rows([objects for _labels, objects in results], [(canvas, canvas)] * len(results))


def _default_workers(preset: BuiltinPreset) -> int:
    if preset.n_train + preset.n_test <= 500:
        return 1  # process start-up would cost more than it saves
    try:
        cpus = len(os.sched_getaffinity(0))  # the CPUs this process may run on (containers, taskset)
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def ensure_builtin(preset: str = "default", seed: int = 0, cache_dir: Path | None = None, workers: int | None = None,
                   progress: bool = True) -> Path:
    """The built-in dataset's folder, generated first if missing; ``workers`` never changes the files."""
    try:
        BUILTIN_PRESETS.row(preset)
    except UnknownName as exc:
        raise DataError(str(exc)) from None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"built-in dataset seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    spec = BUILTIN_PRESETS[preset]
    folder = builtin_folder(preset, seed, cache_dir)
    parent = folder.parent
    if (folder / ".complete").is_file():
        return folder
    parent.mkdir(parents=True, exist_ok=True)
    with file_lock(parent / f".{folder.name}.lock"):
        if (folder / ".complete").is_file():  # another process finished it while we waited
            return folder
        # Holding the lock, any temp folder of ours is left over from an interrupted run.
        for stale in parent.glob(f".{folder.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():
            shutil.rmtree(folder)  # incomplete: interrupted or written by something else
        tmp = parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            n_workers = _default_workers(spec) if workers is None else max(1, int(workers))
            _write_dataset(tmp, spec, seed, n_workers, progress)
            try:
                os.replace(tmp, folder)
            except OSError:
                if not (folder / ".complete").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder


# --------------------------------------------------------------------------------------------------------
# Command line


def _format_statistics(stats: dict[str, Any], classes: list[str]) -> str:
    lines = [
        f"images: {stats['n_images']}",
        f"labels per image: mean {stats['mean_labels']:.3f}, min {stats['min_labels']}, "
        f"max {stats['max_labels']}",
        f"class frequency max/min ratio: {stats['max_min_ratio']:.2f}",
        "class frequencies (fraction of images):"]
    order = np.argsort(stats["class_frequency"])[::-1]
    lines += [f"  {classes[i]:<15} {stats['class_frequency'][i]:.3f}" for i in order]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Generate (if needed) a built-in dataset and print its folder and label statistics; the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m models.sources.builtin",
        description="Generate the built-in procedural multi-label shapes dataset (no download) into the "
        "cache, unless it is there already, then print its folder and label statistics.",
        epilog="Presets: " + "; ".join(
            f"{p.name}: {p.image_size}px, {p.n_train} train + {p.n_test} test" for p in BUILTIN_PRESETS.values()
        ))
    parser.add_argument("--preset", default="default", choices=list(BUILTIN_PRESETS),
                        help="dataset size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed, >= 0 (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="cache root; the dataset goes to DIR/builtin/<preset>-seed<seed>-v<version>/ "
                        "(default: $SPML_CACHE, else ~/.cache/spml)")
    parser.add_argument("--workers", type=int, default=None,
                        help="generating processes (default: min(cpu count, 8); 1 for tiny)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    try:
        folder = ensure_builtin(args.preset, args.seed, args.out, args.workers, progress=not args.quiet)
    except DataError as exc:
        parser.error(str(exc))
    elapsed = time.perf_counter() - started
    classes, labels, splits = read_label_matrix(folder)
    print(folder)
    print(f"ready in {elapsed:.1f}s")
    for split in SPLITS:
        rows = np.array([s == split for s in splits])
        print(f"\n[{split}]")
        print(_format_statistics(label_statistics(labels[rows]), classes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
