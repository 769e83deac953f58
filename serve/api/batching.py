"""Dynamic batching for the one-process service: :class:`Batcher` gathers single images from concurrent requests into
model batches (up to ``max_batch``, waiting at most ``max_wait_s``), runs the model on one worker thread and answers
each image's future; a failing batch fails its own images only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class QueueFull(RuntimeError):
    """More images are waiting than the batcher accepts (the service answers 503)."""


class Batcher:
    """Batches calls to ``run(images (N, ...)) -> rows (N, ...)``; :meth:`submit` one image, await its row."""

    def __init__(self, run: Callable[[np.ndarray], np.ndarray], max_batch: int, max_wait_s: float,
                 max_queue: int) -> None:
        if max_batch < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError("max_batch and max_queue must be >= 1, max_wait_s >= 0")
        self.run, self.max_batch, self.max_wait_s, self.max_queue = run, max_batch, max_wait_s, max_queue
        self._queue: asyncio.Queue[tuple[np.ndarray, asyncio.Future[np.ndarray]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")

    @property
    def depth(self) -> int:
        """Images waiting for a batch."""
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def alive(self) -> bool:
        """True while the batching loop runs."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def close(self) -> None:
        """Stop the loop (images still queued are failed) and the model thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(RuntimeError("the service is shutting down"))
        self._model_thread.shutdown(wait=True)

    async def submit(self, image: np.ndarray) -> np.ndarray:
        """The model's row for one image, batched (:class:`QueueFull` past ``max_queue``; its batch's exception)."""
        if self._queue is None or not self.alive:
            raise RuntimeError("the batcher is not running")
        if self._queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self._queue.qsize()} images are waiting already; try again shortly")
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((image, future))
        return await future

    async def _gather(self) -> list[tuple[np.ndarray, asyncio.Future[np.ndarray]]]:
        """The next batch: the first waiting image, then more until ``max_batch`` or ``max_wait_s`` has passed."""
        assert self._queue is not None
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except asyncio.TimeoutError:
                break
        return [(image, future) for image, future in batch if not future.done()]  # callers that gave up: dropped

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            if not batch:
                continue
            try:
                rows = await loop.run_in_executor(self._model_thread, self.run, np.stack([b[0] for b in batch]))
            except Exception as exc:  # the model failed this batch: its callers hear it, the loop goes on
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), row in zip(batch, rows, strict=True):
                if not future.done():
                    future.set_result(row)
