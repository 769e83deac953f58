"""Tag every image in a folder tree with a trained model; one JSON line per image.

Pipeline: scan the folder (sorted, recursive, symlinked folders not followed) -> decode + preprocess in a
thread pool (:class:`~models.preprocess.EvalTransform` from the model's metadata), a bounded window ahead of
the model so decoding overlaps inference -> batches through the runtime -> sigmoid -> thresholds -> JSONL,
written to a temp file and renamed into place at the end.

Output line: ``{"path": "sub/a.jpg", "scores": {class: p, ...}, "tags": [class, ...]}`` with ``path``
relative to the folder (POSIX separators), every class's probability rounded to 6 decimals, and the tags
being the classes whose (rounded) probability is >= their threshold, highest score first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from export.metadata import atomic_path
from models.checkpoint import ModelMeta
from models.preprocess import IMAGE_EXTENSIONS, EvalTransform
from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD
from serve.runtimes import Runtime, load_runtime


def default_workers() -> int:
    """Decode threads used when none are given: the CPU count, capped at 8."""
    return max(1, min(8, os.cpu_count() or 1))


def scan_folder(folder: str | Path) -> tuple[list[Path], int]:
    """Walk ``folder`` recursively without following symlinked folders.

    Returns (files whose suffix is in IMAGE_EXTENSIONS, case-insensitive, sorted by their relative POSIX
    path; number of other files, which are ignored).
    """
    folder = Path(folder)
    images: list[Path] = []
    other = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in files:
            if Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                images.append(Path(root) / name)
            else:
                other += 1
    images.sort(key=lambda p: p.relative_to(folder).as_posix())
    return images, other


def find_images(folder: str | Path) -> list[Path]:
    """The image files under ``folder`` in tagging order (see :func:`scan_folder`)."""
    return scan_folder(folder)[0]


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def class_thresholds(meta: ModelMeta, threshold: float | None = None) -> np.ndarray:
    """Per-class thresholds ``(C,)``: ``threshold`` for all if given, else ``meta.thresholds``, else 0.5."""
    n = len(meta.classes)
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        return np.full(n, float(threshold))
    if meta.thresholds is not None:
        if len(meta.thresholds) != n:
            raise ValueError(f"model metadata has {len(meta.thresholds)} thresholds for {n} classes")
        return np.asarray(meta.thresholds, dtype=np.float64)
    return np.full(n, DEFAULT_THRESHOLD)


def tag_record(rel_path: str, probs: np.ndarray, classes: list[str], thresholds: np.ndarray) -> dict[str, Any]:
    """One output record from a probability row ``(C,)``: rounded scores of all classes + tags."""
    rounded = [round(float(p), 6) for p in probs]
    chosen = [i for i, p in enumerate(rounded) if p >= thresholds[i]]
    chosen.sort(key=lambda i: (-rounded[i], i))
    return {
        "path": rel_path,
        "scores": {c: p for c, p in zip(classes, rounded, strict=True)},
        "tags": [classes[i] for i in chosen],
    }


def _decode(transform: EvalTransform, path: Path) -> tuple[np.ndarray | None, str | None]:
    try:
        return transform(path).numpy(), None
    except Exception as exc:  # one bad file must not stop the run: PIL raises OSError, SyntaxError, ValueError...
        return None, f"{type(exc).__name__}: {exc}"


def decode_ahead(
    paths: Iterable[Path], transform: EvalTransform, workers: int, window: int
) -> Iterator[tuple[Path, np.ndarray | None, str | None]]:
    """Yield ``(path, array or None, error or None)`` in input order, decoding up to ``window`` files ahead
    in ``workers`` threads (so decoding continues while the caller runs the model)."""
    it = iter(paths)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="decode")
    pending: deque[tuple[Path, Future[tuple[np.ndarray | None, str | None]]]] = deque()
    try:
        for path in it:
            pending.append((path, pool.submit(_decode, transform, path)))
            if len(pending) >= window:
                break
        while pending:
            path, fut = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(_decode, transform, nxt)))
            array, error = fut.result()
            yield path, array, error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class TagSummary:
    """Result of :func:`tag_folder`."""

    folder: Path
    output: Path
    tagged: int
    failed: list[tuple[str, str]] = field(default_factory=list)  # (relative path, reason)
    ignored: int = 0  # files without an image extension
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every image file was tagged."""
        return not self.failed and self.tagged > 0

    def line(self) -> str:
        """One-line human summary."""
        rate = self.tagged / self.seconds if self.seconds > 0 else 0.0
        parts = [f"tagged {self.tagged} images in {self.seconds:.1f} s ({rate:.1f} img/s) -> {self.output}"]
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        if self.ignored:
            parts.append(f"{self.ignored} non-image files ignored")
        return "; ".join(parts)


def tag_folder(
    folder: str | Path,
    model: Runtime | str | Path,
    output: str | Path = DEFAULT_OUTPUT,
    *,
    threshold: float | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
) -> TagSummary:
    """Tag every image under ``folder`` with ``model`` (a loaded runtime or a model path) into ``output``.

    Unreadable images are skipped and reported through ``warn`` (default: stderr) and in the summary.
    Raises ``FileNotFoundError`` (no folder), ``ValueError`` (bad threshold / batch size, model output not
    logits) and whatever the runtime raises on load. ``output`` is replaced atomically at the end; when the
    folder holds no image files nothing is written.
    """
    start = time.perf_counter()
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"folder not found: {folder}")
    if batch_size < 1:
        raise ValueError("batch size must be >= 1")
    runtime = load_runtime(model) if isinstance(model, (str, Path)) else model
    meta = runtime.meta
    if meta.output != "logits":
        raise ValueError(f"model output is {meta.output!r}; the tagger expects logits")
    thresholds = class_thresholds(meta, threshold)
    paths, ignored = scan_folder(folder)
    summary = TagSummary(folder=folder, output=Path(output), tagged=0, ignored=ignored)
    if not paths:
        summary.seconds = time.perf_counter() - start
        return summary

    transform = EvalTransform(meta.image_size, meta.mean, meta.std)
    n_workers = workers if workers is not None else default_workers()
    bar = tqdm(total=len(paths), unit="img", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    classes = list(meta.classes)

    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as fh:

        def flush(batch_paths: list[Path], arrays: list[np.ndarray]) -> None:
            logits = runtime.predict_logits(np.stack(arrays))
            if logits.shape != (len(arrays), len(classes)):
                raise ValueError(f"model returned shape {logits.shape}, expected ({len(arrays)}, {len(classes)})")
            for path, probs in zip(batch_paths, sigmoid(logits), strict=True):
                rel = path.relative_to(folder).as_posix()
                fh.write(json.dumps(tag_record(rel, probs, classes, thresholds), ensure_ascii=False) + "\n")
            summary.tagged += len(arrays)
            bar.update(len(arrays))

        batch_paths: list[Path] = []
        arrays: list[np.ndarray] = []
        try:
            window = max(2 * batch_size, 4 * n_workers)
            for path, array, error in decode_ahead(paths, transform, n_workers, window):
                if array is None:
                    rel = path.relative_to(folder).as_posix()
                    summary.failed.append((rel, error or "unknown error"))
                    report(f"skipped {rel}: {error}")
                    bar.update(1)
                    continue
                batch_paths.append(path)
                arrays.append(array)
                if len(arrays) == batch_size:
                    flush(batch_paths, arrays)
                    batch_paths, arrays = [], []
            if arrays:
                flush(batch_paths, arrays)
        finally:
            bar.close()
    summary.seconds = time.perf_counter() - start
    return summary
