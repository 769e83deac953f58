"""What the HTTP service does, apart from HTTP: :class:`ApiSettings` (the options of ``serve api``) and
:class:`TaggingService` (one loaded model, images decoded in memory in a bounded pool, batched scoring, the tagger's
:class:`~serve.outputs.stage.TagSelector`). Every refusal is a :class:`RequestError` with its HTTP status."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch

from models.runtimes import OnnxRuntimeBackend
from serve import DEFAULT_MAX_PIXELS
from serve.api import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_IMAGES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_UPLOAD_MB,
    DEFAULT_MAX_WAIT_MS,
)
from serve.api.batching import Batcher, QueueFull
from serve.api.metrics import ApiMetrics
from serve.images import ImageError, ImagePreprocessor
from serve.outputs.caption_rules import CaptionRules, combine
from serve.outputs.selection_modes import parse_mode
from serve.outputs.stage import TagSelector
from serve.predictor import Predictor
from serve.tagging.job import TagChoice

#: The HTTP status of each kind of unusable image (:data:`serve.images.IMAGE_ERROR_KINDS`).
IMAGE_STATUS = {"too-large": 413, "not-an-image": 415, "missing": 404, "unreadable": 422}
#: Seconds allowed to fetch one ``--allow-urls`` image.
URL_TIMEOUT_S = 10.0
#: One image's model input or its model row, for a scorer: ``async (3, S, S) -> (C,)``.
Scorer = Callable[[np.ndarray], Awaitable[np.ndarray]]


def default_decode_threads() -> int:
    """Decoding threads by default: one per CPU, at most 8 (each holds at most one decoded image)."""
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class ApiSettings:
    """The service's options, by their command-line names: the model and runtime, the default tag choice (a request may
    override it), batching, request limits, decoding threads, the inputs allowed besides uploads and the ``api_key``."""

    model: str
    backend: str | None = None
    device: str | None = None
    threads: int | None = None
    choice: TagChoice = field(default_factory=TagChoice)
    max_batch: int = DEFAULT_MAX_BATCH
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    max_queue: int = DEFAULT_MAX_QUEUE
    max_images: int = DEFAULT_MAX_IMAGES
    max_upload_bytes: int = int(DEFAULT_MAX_UPLOAD_MB * 1024 * 1024)
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    decode_threads: int = field(default_factory=default_decode_threads)
    allow_paths: tuple[Path, ...] = ()
    allow_urls: bool = False
    api_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "max_images", "max_upload_bytes", "decode_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_wait_ms < 0:
            raise ValueError("--max-wait-ms must be >= 0")
        object.__setattr__(self, "allow_paths", tuple(Path(p).expanduser().resolve() for p in self.allow_paths))


class RequestError(Exception):
    """A request the service refuses or cannot answer: the HTTP ``status`` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class TaggingService:
    """One loaded model serving tag requests; ``scorer`` defaults to a :class:`~serve.api.batching.Batcher`."""

    def __init__(self, settings: ApiSettings, predictor: Predictor, scorer: Scorer | None = None) -> None:
        if predictor.backend != "torch":  # torch only resizes here, on each decoding thread: one thread each, inline
            torch.set_num_threads(1)  # (its default pool, shared by those threads, oversubscribes the cores)
        self.settings = settings
        self.predictor = predictor
        self.preprocess = ImagePreprocessor(predictor.transform, settings.max_pixels)
        self.decode_pool = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
        self.batcher = Batcher(self.run_batch, settings.max_batch, settings.max_wait_ms / 1000, settings.max_queue)
        self.scorer = scorer
        self.metrics = ApiMetrics(lambda: self.batcher.depth)
        self.ready = False
        self._http: Any = None  # an httpx.AsyncClient for --allow-urls, made on first use

    @classmethod
    def load(cls, settings: ApiSettings, scorer: Scorer | None = None) -> TaggingService:
        """Load the model of ``settings`` (the exceptions of :meth:`Predictor.load`)."""
        predictor = Predictor.load(settings.model, settings.backend, settings.device, max_pixels=settings.max_pixels,
                                   threads=settings.threads)
        runtime = predictor.runtime
        if isinstance(runtime, OnnxRuntimeBackend) and runtime.session.get_providers() == ["CPUExecutionProvider"]:
            # intra-op threads that sleep between batches: busy-waiting ones take the decoding threads' cores
            predictor.runtime = OnnxRuntimeBackend.load(runtime.path, threads=settings.threads, spinning=False)
        return cls(settings, predictor, scorer)

    @property
    def healthy(self) -> bool:
        """False once the local batching loop has stopped (the process should be replaced)."""
        return self.scorer != self.batcher.submit or self.batcher.alive

    async def start(self) -> None:
        """Start batching (unless a scorer was given) and warm the model up with one blank image; then ready."""
        if self.scorer is None:
            self.batcher.start()
            self.scorer = self.batcher.submit
        size = self.predictor.meta.image_size
        blank = await self._in_pool(self.preprocess, np.zeros((size, size, 3), np.uint8))
        await self.score(blank)
        self.ready = True
        self.metrics.ready.set(1)

    async def stop(self) -> None:
        """Not ready any more; stop batching, close the URL client and the decoding threads."""
        self.ready = False
        self.metrics.ready.set(0)
        if self.scorer == self.batcher.submit:
            await self.batcher.close()
        if self._http is not None:
            await self._http.aclose()
        self.decode_pool.shutdown(wait=False)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value carries the API key (always, without a key)."""
        key = self.settings.api_key
        if not key:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    def run_batch(self, images: np.ndarray) -> np.ndarray:
        """The model's sigmoid rows for a batch of inputs, counted in the metrics (runs on the model thread)."""
        start = time.perf_counter()
        try:
            rows = self.predictor.scores_from_inputs(images)
        except Exception:
            self.metrics.model_errors.inc()
            raise
        self.metrics.batch_size.observe(len(images))
        self.metrics.model_seconds.observe(time.perf_counter() - start)
        return rows

    def selector(self, select: str | None = None, threshold: float | None = None, max_tags: int | None = None,
                 min_score: float | None = None, rules: CaptionRules | None = None) -> TagSelector:
        """A request's tag selection: the server's with the request's values (422 :class:`RequestError` if bad)."""
        base = self.settings.choice
        try:
            mode = base.mode
            if select is not None:
                name, k = parse_mode(select)
                mode = dataclasses.replace(mode, mode=name, k=k)
            if max_tags is not None:
                mode = dataclasses.replace(mode, max_tags=max_tags)
            if min_score is not None:
                mode = dataclasses.replace(mode, min_score=min_score)
            combined = combine(base.rules, rules) if rules is not None else base.rules
            combined.check_classes(self.predictor.classes)
            thresholds = self.predictor.thresholds(base.threshold if threshold is None else threshold, base.per_class)
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        return TagSelector(list(self.predictor.classes), thresholds, mode, combined)

    def local_path(self, text: str) -> Path:
        """The file a request's path names, inside an ``allow_paths`` folder (403 otherwise; 404: not a file)."""
        roots = self.settings.allow_paths
        if not roots:
            raise RequestError(403, "this server reads no local paths (start it with --allow-paths DIR)")
        path = Path(text)
        resolved = (path if path.is_absolute() else roots[0] / path).resolve()
        if not any(resolved.is_relative_to(root) for root in roots):
            raise RequestError(403, f"{text}: outside the folders this server may read")
        if not resolved.is_file():
            raise RequestError(404, f"{text}: no such file")
        return resolved

    async def fetch(self, url: str) -> bytes:
        """The bytes at an http(s) ``url`` (``allow_urls`` only; at most ``max_upload_bytes``), in memory."""
        if not self.settings.allow_urls:
            raise RequestError(403, "this server fetches no URLs (start it with --allow-urls)")
        if urlsplit(url).scheme not in ("http", "https"):
            raise RequestError(422, f"{url}: only http and https URLs are fetched")
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(follow_redirects=True, timeout=URL_TIMEOUT_S)
        limit, data = self.settings.max_upload_bytes, bytearray()
        try:
            async with self._http.stream("GET", url) as response:
                if response.status_code != 200:
                    raise RequestError(422, f"{url}: the server answered HTTP {response.status_code}")
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise RequestError(413, f"{url}: larger than the limit of {limit:,} bytes")
        except httpx.HTTPError as exc:
            raise RequestError(422, f"{url}: cannot fetch it ({type(exc).__name__}: {exc})") from None
        return bytes(data)

    async def _in_pool(self, fn: Callable[[Any], np.ndarray], arg: Any) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, fn, arg)

    async def decode(self, name: str, image: bytes | Path) -> np.ndarray:
        """One image's model input, decoded on a decoding thread (:class:`RequestError` 413, 415 or 422)."""
        try:
            return await self._in_pool(self.preprocess, image)
        except ImageError as exc:
            raise RequestError(IMAGE_STATUS.get(exc.kind, 422), f"{name}: {exc.reason}") from None

    async def score(self, image: np.ndarray) -> np.ndarray:
        """One input's model row through the batching scorer (503 when the queue is full or its batch failed)."""
        assert self.scorer is not None, "start() the service first"
        try:
            return await self.scorer(image)
        except QueueFull as exc:
            raise RequestError(503, f"overloaded: {exc}") from None
        except Exception as exc:
            raise RequestError(503, f"the model failed on this request's batch ({type(exc).__name__}: {exc}); "
                               "the service goes on: try again") from None

    async def tag(self, images: Sequence[tuple[str, bytes | Path]], selector: TagSelector) -> list[dict[str, Any]]:
        """The records of named images, all decoded before any is scored: one bad image refuses the request."""
        if not self.ready:
            raise RequestError(503, "the model is not ready yet")
        if not images:
            raise RequestError(422, "no image in the request")
        if len(images) > self.settings.max_images:
            raise RequestError(413, f"{len(images)} images in one request; at most {self.settings.max_images}")
        try:
            inputs = await asyncio.gather(*(self.decode(name, image) for name, image in images))
        except RequestError:
            self.metrics.images.labels("refused").inc(len(images))
            raise
        rows = await asyncio.gather(*(self.score(x) for x in inputs))
        self.metrics.images.labels("tagged").inc(len(images))
        records = [selector(name, row) for (name, _), row in zip(images, rows, strict=True)]
        return [{"name": r["path"], "scores": r["scores"], "tags": r["tags"]} for r in records]

    def describe(self) -> dict[str, Any]:
        """``GET /v1/model``: the model, its classes, the default tag choice, the limits and the inputs accepted."""
        s = self.settings
        return {
            "model": self.predictor.describe(),
            "classes": list(self.predictor.classes),
            "defaults": self.selector().to_dict(),
            "limits": {"max_images": s.max_images, "max_upload_bytes": s.max_upload_bytes,
                       "max_pixels": s.max_pixels, "max_batch": s.max_batch, "max_wait_ms": s.max_wait_ms,
                       "max_queue": s.max_queue},
            "inputs": {"upload": True, "paths": bool(s.allow_paths), "urls": s.allow_urls}}
