"""The local tagging engine's core: tag every image of a SOURCE on this machine into a run file and sidecars.

Pipeline: :class:`serve.sources.Source` lists the items (a folder, a list file or WebDataset shards, optionally
one ``--shard K/N`` part) -> :func:`plan_tagging` decides per item under the ``existing`` policy (skip =
resume, overwrite, append) -> decode + preprocess in a thread pool (:func:`decode_item`: the one
:class:`serve.predictor.ImagePreprocessor`, with its pixel-count check), a bounded window ahead of the model so
decoding overlaps inference -> batches through the runtime -> sigmoid -> per-class thresholds
(:func:`serve.thresholds.resolve_thresholds`) -> :func:`serve.records.tag_record` -> one sidecar text file per
image (folders only; written atomically as each batch finishes) and the run file (written atomically at the end,
sorted by path). Record formats: :mod:`serve.records`. Images that cannot be used go to the errors file, never
into the run file.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT
from serve.records import (
    DEFAULT_SEPARATOR,
    OutputConflictError,
    default_errors_path,
    read_run_file,
    tag_record,
    write_errors,
    write_run_file,
)
from serve.runtimes import Runtime
from serve.sidecars import SidecarSpec, sidecar_paths, write_sidecar
from serve.sources import Item, Partition, Source, read_location
from serve.thresholds import resolve_thresholds

if TYPE_CHECKING:
    from serve.predictor import Predictor

#: Largest image accepted (width x height), checked from the header before decoding: Pillow's own limit.
DEFAULT_MAX_PIXELS = 89_478_485
#: What to do with images whose outputs exist already (see :func:`tag_folder`).
EXISTING_POLICIES = ("skip", "overwrite", "append")
DEFAULT_EXISTING = "skip"


def default_workers() -> int:
    """Decode threads used when none are given: the CPU count, capped at 8."""
    return max(1, min(8, os.cpu_count() or 1))


# --------------------------------------------------------------------------------------------------------
# Planning: what to tag, what is done


@dataclass
class TagPlan:
    """The items to tag (streaming for shards) and the keys skipped as already done, decided before any model
    is loaded."""

    source: Source
    todo: Iterable[Item]
    total: int | None  # len(todo) when known (folders)
    done: list[str]
    previous: dict[str, dict[str, Any]]  # records of the existing run file, by key
    sidecars: dict[str, Path]  # key -> sidecar file ({} without sidecars)
    scan_errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ignored(self) -> int:
        """Files without an image extension (folder sources)."""
        return self.source.ignored


def plan_tagging(
    source: str | Path | Source,
    output: str | Path,
    existing: str = DEFAULT_EXISTING,
    sidecar: SidecarSpec | None = None,
    partition: Partition | None = None,
    journal: Mapping[str, dict[str, Any]] | None = None,
) -> TagPlan:
    """Split the items of ``source`` into to-do and done under the ``existing`` policy: with ``skip``, an item
    is done when its sidecar exists (with sidecars) or its key is in the existing run file (without). Reads the
    existing run file (plus ``journal``: records of an interrupted run), whose records of skipped items are kept.
    Sidecars need a folder source."""
    if existing not in EXISTING_POLICIES:
        raise ValueError(f"existing must be one of {', '.join(EXISTING_POLICIES)}, got {existing!r}")
    src = source if isinstance(source, Source) else Source.open(source, partition)
    if sidecar is not None and src.kind != "folder":
        raise ValueError(f"sidecars need a folder SOURCE; {src.spec} is a {src.kind} source")
    separator = sidecar.separator if sidecar is not None else DEFAULT_SEPARATOR
    previous = {**read_run_file(Path(output), separator), **(journal or {})} if existing == "skip" else {}
    sidecars: dict[str, Path] = {}
    if src.kind == "folder":
        paths = src.folder_images()
        if sidecar is not None:
            sidecars = {
                p.relative_to(src.folder).as_posix(): s for p, s in sidecar_paths(src.folder, paths, sidecar).items()
            }
        items: Iterable[Item] = [Item(p.relative_to(src.folder).as_posix(), str(p)) for p in paths]
    else:
        items = src.items()
    plan = TagPlan(src, [], None, [], previous, sidecars, src.scan_errors)

    def is_done(key: str) -> bool:
        return existing == "skip" and (sidecars[key].is_file() if sidecar is not None else key in previous)

    if isinstance(items, list):
        plan.done = [i.key for i in items if is_done(i.key)]
        plan.todo = [i for i in items if not is_done(i.key)]
        plan.total = len(plan.todo)
    else:
        plan.done = [k for k in previous if existing == "skip" and src.partition.keeps(_partition_name(src, k))]
        plan.todo = (i for i in items if not is_done(i.key))
    return plan


def _partition_name(source: Source, key: str) -> str:
    """The name a key is partitioned by: its shard file for shard sources, else the key itself."""
    return key.split("/", 1)[0] if source.kind == "shards" else key


# --------------------------------------------------------------------------------------------------------
# Decoding ahead of the model


def decode_item(preprocess: Callable[[Any], np.ndarray], item: Item) -> tuple[np.ndarray | None, str | None]:
    """``(model input, None)`` or ``(None, reason)`` for one item; one bad file must not stop the run."""
    from serve.predictor import ImageError

    if item.error is not None:
        return None, item.error
    try:
        if item.data is not None or "://" in item.location:
            image: Any = item.data if item.data is not None else read_location(item.location)
            if not image:
                return None, "empty file (0 bytes)"
        else:
            image = Path(item.location)
            if image.stat().st_size == 0:
                return None, "empty file (0 bytes)"
            if not os.access(image, os.R_OK):
                return None, "permission denied"
        return np.asarray(preprocess(image)), None
    except ImageError as exc:
        return None, exc.reason
    except FileNotFoundError:
        return None, "file not found (a broken symlink, or deleted during the run)"
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        return None, f"{type(exc).__name__}: {exc}"


def decode_ahead(
    items: Iterable[Item], preprocess: Callable[[Any], np.ndarray], workers: int, window: int
) -> Iterator[tuple[Item, np.ndarray | None, str | None]]:
    """Yield ``(item, array or None, error or None)`` in input order, decoding up to ``window`` items ahead
    in ``workers`` threads (so decoding continues while the caller runs the model)."""
    it = iter(items)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="decode")
    pending: deque[tuple[Item, Future[tuple[np.ndarray | None, str | None]]]] = deque()
    try:
        for item in it:
            pending.append((item, pool.submit(decode_item, preprocess, item)))
            if len(pending) >= window:
                break
        while pending:
            item, fut = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(decode_item, preprocess, nxt)))
            array, error = fut.result()
            yield item, array, error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------------------------------------
# Tagging


@dataclass
class TagSummary:
    """Result of :func:`tag_folder`."""

    source: str
    output: Path
    tagged: int
    failed: list[tuple[str, str]] = field(default_factory=list)  # (relative path, reason)
    ignored: int = 0  # files without an image extension
    seconds: float = 0.0
    skipped: int = 0  # already done under --existing skip
    errors_file: Path | None = None  # where the failures were listed

    @property
    def ok(self) -> bool:
        """True when every image file was tagged (now or, under ``skip``, before)."""
        return not self.failed and self.tagged + self.skipped > 0

    def line(self) -> str:
        """One-line human summary."""
        rate = self.tagged / self.seconds if self.seconds > 0 else 0.0
        parts = [f"tagged {self.tagged} images in {self.seconds:.1f} s ({rate:.1f} img/s) -> {self.output}"]
        if self.skipped:
            parts.append(f"{self.skipped} already done (skipped; --existing overwrite redoes them)")
        if self.failed:
            parts.append(f"{len(self.failed)} failed (listed in {self.errors_file})")
        if self.ignored:
            parts.append(f"{self.ignored} non-image files ignored")
        return "; ".join(parts)


def as_predictor(
    model: Predictor | Runtime | str | Path, device: str | None = None, max_pixels: int | None = None
) -> Predictor:
    """A :class:`~serve.predictor.Predictor` from a loaded one, a runtime, or a model path (loaded on ``device``).
    Raises ``ValueError`` when the model does not output logits."""
    from serve.predictor import Predictor

    if isinstance(model, Predictor):
        return model
    if isinstance(model, (str, Path)):
        return Predictor.load(model, device=device, max_pixels=max_pixels)
    if model.meta.output != "logits":
        raise ValueError(f"model output is {model.meta.output!r}; the tagger expects logits")
    return Predictor(model, path=getattr(model, "path", None), max_pixels=max_pixels)


def check_previous(
    previous: Mapping[str, dict[str, Any]], keys: Iterable[str], classes: list[str], output: Path
) -> None:
    """Raise :class:`OutputConflictError` when a kept record of the run file has other classes than the model."""
    for key in keys:
        rec = previous.get(key)
        if rec is not None and list(rec["scores"]) != classes:
            raise OutputConflictError(
                f"{output} was written by a model with other classes; use --existing overwrite or another --output"
            )


def tag_folder(
    folder: str | Path | Source,
    model: Predictor | Runtime | str | Path,
    output: str | Path = DEFAULT_OUTPUT,
    *,
    threshold: float | None = None,
    per_class: Mapping[str, float] | None = None,
    top_k: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    existing: str = DEFAULT_EXISTING,
    sidecar: SidecarSpec | None = None,
    errors: str | Path | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    device: str | None = None,
    partition: Partition | None = None,
) -> TagSummary:
    """Tag every image of ``folder`` (a folder, list file or shard pattern, or a :class:`~serve.sources.Source`)
    with ``model`` (a Predictor, a loaded runtime, or a model path), on this machine.

    Writes the run file ``output`` (CSV when it ends in .csv, else JSONL; sorted by path) atomically at the end,
    and with ``sidecar`` one text file per image as each batch finishes (atomic too). ``existing``: ``skip``
    leaves images already done (see :func:`plan_tagging`) and keeps their run-file records, ``overwrite`` redoes
    everything, ``append`` redoes everything and adds new tags to existing sidecars without duplicates.
    ``partition``: tag only one ``--shard K/N`` part. Thresholds: :func:`serve.thresholds.resolve_thresholds`.
    Images that cannot be used (unreadable, empty, not an image, over ``max_pixels``) are reported through
    ``warn`` (default: stderr) and listed in ``errors`` (default: :func:`default_errors_path`), never tagged.
    Raises ``FileNotFoundError`` (no source), ``ValueError`` (bad option, model output not logits,
    :class:`OutputConflictError`) and whatever the runtime raises. Without image files nothing is written.
    """
    start = time.perf_counter()
    if batch_size < 1:
        raise ValueError("batch size must be >= 1")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be >= 1")
    output = Path(output)
    plan = plan_tagging(folder, output, existing, sidecar, partition)
    predictor = as_predictor(model, device, max_pixels)
    from serve.predictor import ImagePreprocessor

    classes = list(predictor.classes)
    thresholds = resolve_thresholds(predictor.meta, threshold, per_class)
    check_previous(plan.previous, plan.done, classes, output)
    summary = TagSummary(plan.source.spec, output, 0, list(plan.scan_errors), plan.ignored, skipped=len(plan.done))
    summary.errors_file = Path(errors) if errors is not None else default_errors_path(output)
    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    for rel, reason in plan.scan_errors:
        report(f"skipped {rel}: {reason}")
    records = {k: plan.previous[k] for k in plan.done if k in plan.previous}
    bar = tqdm(total=plan.total, unit="img", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    preprocess = ImagePreprocessor(predictor.transform, max_pixels)

    def flush(batch: list[Item], arrays: list[np.ndarray]) -> None:
        probs = predictor.scores_from_inputs(np.stack(arrays))
        for item, row in zip(batch, probs, strict=True):
            rec = tag_record(item.key, row, classes, thresholds, top_k)
            records[rec["path"]] = rec
            if sidecar is not None:
                write_sidecar(plan.sidecars[item.key], rec["tags"], sidecar, append=existing == "append")
        summary.tagged += len(arrays)
        bar.update(len(arrays))

    try:
        n_workers = workers if workers is not None else default_workers()
        window = max(2 * batch_size, 4 * n_workers)
        batch: list[Item] = []
        arrays: list[np.ndarray] = []
        for item, array, error in decode_ahead(plan.todo, preprocess, n_workers, window):
            if array is None:
                summary.failed.append((item.key, error or "unknown error"))
                report(f"skipped {item.key}: {error}")
                bar.update(1)
                continue
            batch.append(item)
            arrays.append(array)
            if len(arrays) == batch_size:
                flush(batch, arrays)
                batch, arrays = [], []
        if arrays:
            flush(batch, arrays)
    finally:
        bar.close()
    if summary.tagged or summary.failed or summary.skipped:
        write_run_file(output, records.values(), classes, sidecar.separator if sidecar else DEFAULT_SEPARATOR)
    if summary.failed or summary.errors_file.exists():
        write_errors(summary.errors_file, summary.failed)
    summary.seconds = time.perf_counter() - start
    return summary
