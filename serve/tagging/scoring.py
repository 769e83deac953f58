"""Step 2 of the tagging pipeline, the one scoring loop: items -> result batches, ``workers`` threads decoding a bounded
window ahead of the model, so memory follows ``batch_size`` and ``workers``, never the image count."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serve.outputs.records import Result
from serve.tagging.sources import Item, read_location

if TYPE_CHECKING:
    from serve.images import ImagePreprocessor

#: Preprocessed ``float32 (N, 3, S, S)`` -> sigmoid scores ``float32 (N, C)``: one model call.
Scorer = Callable[[np.ndarray], np.ndarray]


def default_workers() -> int:
    """Decode threads used when none are given: the CPU count, capped at 8."""
    return max(1, min(8, os.cpu_count() or 1))


def decode_window(batch_size: int, workers: int) -> int:
    """How many items are decoded ahead of the batch: two batches, or two per decode thread."""
    return max(2 * batch_size, 2 * workers)


def decode_item(preprocess: ImagePreprocessor, item: Item) -> tuple[np.ndarray | None, str | None]:
    """``(decoded uint8 (3, S, S), None)`` or ``(None, reason)`` for one item; one bad file must not stop a run."""
    from serve.images import ImageError

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
        return preprocess.decode(image), None
    except ImageError as exc:
        return None, exc.reason
    except FileNotFoundError:
        return None, "file not found (a broken symlink, or deleted during the run)"
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        return None, f"{type(exc).__name__}: {exc}"


def decode_ahead(
    items: Iterable[Item], preprocess: ImagePreprocessor, pool: Executor, window: int
) -> Iterator[tuple[Item, np.ndarray | None, str | None]]:
    """Yield ``(item, decoded or None, error or None)`` in order, decoding up to ``window`` ahead on ``pool``."""
    it = iter(items)
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
        for _, fut in pending:
            fut.cancel()


def score_items(items: Iterable[Item], scorer: Scorer, preprocess: ImagePreprocessor, batch_size: int,
                workers: int | None = None, pool: Executor | None = None) -> Iterator[list[Result]]:
    """Score ``items``: one list of results per model batch, in input order."""
    n_workers = workers or default_workers()
    window = decode_window(batch_size, n_workers)
    own = ThreadPoolExecutor(n_workers, thread_name_prefix="decode") if pool is None else None
    with own if own is not None else nullcontext():
        results: list[Result] = []
        batch: list[tuple[int, np.ndarray]] = []

        def flush() -> list[Result]:
            if batch:
                scores = scorer(preprocess.normalize(np.stack([image for _, image in batch])))
                for (index, _), row in zip(batch, scores, strict=True):
                    results[index] = Result(results[index].key, row)
            done = list(results)
            results.clear()
            batch.clear()
            return done

        for item, image, error in decode_ahead(items, preprocess, pool or own, window):  # type: ignore[arg-type]
            if image is None:
                results.append(Result(item.key, None, error or "unknown error"))
            else:
                batch.append((len(results), image))
                results.append(Result(item.key, None))
            if len(batch) == batch_size or len(results) >= 4 * batch_size:  # the latter: many failures in a row
                yield flush()
        if results:
            yield flush()
