"""The HTTP side of the service: :func:`build_app`, the FastAPI app over a :class:`~serve.api.service.TaggingService`
(``/v1/tag``, ``/v1/model``, ``/healthz``, ``/readyz``, ``/metrics``), and :func:`run_local`, the ``local`` engine.
Request bodies are read in memory, bounded by ``max_upload_bytes`` (413 beyond it)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from serve.api.metrics import CONTENT_TYPE, RequestMetrics
from serve.api.service import ApiSettings, RequestError, TaggingService
from serve.outputs.caption_rules import make_rules

#: Bytes of an over-size body still read (and dropped) so that the client hears the 413 before the connection
#: closes; a body declared larger than the limit plus this is refused at once.
DRAIN_BYTES = 64 * 1024 * 1024


class ImageTags(BaseModel):
    """One image's answer: its name (upload file name, path or URL), every class score and its tags."""

    name: str
    scores: dict[str, float]
    tags: list[str]


class TagAnswer(BaseModel):
    """``POST /v1/tag``'s answer: one result per image, in request order."""

    results: list[ImageTags]


class Refusal(BaseModel):
    """Every error's answer: what was wrong."""

    detail: str


#: The request bodies ``POST /v1/tag`` takes (written out: the endpoint reads the body itself, bounded).
TAG_BODY = {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
    "image/*": {"schema": {"type": "string", "format": "binary"}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "application/json": {"schema": {"type": "object", "properties": {
        "paths": {"type": "array", "items": {"type": "string"},
                  "description": "files under the server's --allow-paths folders"},
        "urls": {"type": "array", "items": {"type": "string"}, "description": "http(s) URLs, with --allow-urls"}}}},
}}
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": Refusal, "description": text} for code, text in (
    (401, "no or wrong API key"), (403, "a path or URL this server does not read"), (404, "no such file"),
    (413, "too large: the body, an image's pixels, or too many images"), (415, "not an image"),
    (422, "corrupt image or bad option"), (503, "not ready, overloaded, or the model failed this batch"))}


async def _body(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The request body's chunks, at most ``limit`` bytes (:class:`RequestError` 413 beyond it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + DRAIN_BYTES:
        raise RequestError(413, f"request body of {int(declared):,} bytes; the limit is {limit:,}")
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            yield chunk
        elif size > limit + DRAIN_BYTES:
            break
    if size > limit:
        raise RequestError(413, f"request body over the limit of {limit:,} bytes")


async def read_images(request: Request, service: TaggingService) -> list[tuple[str, bytes | Path]]:
    """The named images of a ``POST /v1/tag`` body (multipart, raw image, or allowed JSON paths / urls), in memory."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    limit = service.settings.max_upload_bytes
    if kind == "multipart/form-data":
        parser = MultiPartParser(request.headers, _body(request, limit), max_files=float("inf"))
        parser.spool_max_size = limit + 1  # each file stays in memory: nothing a request sends is written to disk
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise RequestError(400, f"bad multipart body: {exc.message}") from None
        files = [value for _, value in form.multi_items() if isinstance(value, UploadFile)]
        return [(f.filename or "upload", await f.read()) for f in files]
    body = b"".join([chunk async for chunk in _body(request, limit)])
    if kind != "application/json":
        return [("body", body)] if body else []
    try:
        doc = json.loads(body)
        paths, urls = doc.get("paths", []), doc.get("urls", [])
        if not all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in (paths, urls)):
            raise ValueError("paths and urls must be lists of strings")
    except (ValueError, AttributeError) as exc:
        raise RequestError(422, f'expected {{"paths": [...]}} or {{"urls": [...]}}: {exc}') from None
    if len(paths) + len(urls) > service.settings.max_images:
        raise RequestError(413, f"{len(paths) + len(urls)} images in one request; at most "
                           f"{service.settings.max_images}")
    fetched = await asyncio.gather(*(service.fetch(url) for url in urls))
    return [(p, service.local_path(p)) for p in paths] + list(zip(urls, fetched, strict=True))


def build_app(service: TaggingService) -> FastAPI:
    """The FastAPI app of ``service``: started (batching, warm-up) and stopped with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title="spml tagging service", lifespan=lifespan,
                  description="Multi-label image tagging with one exported model: every class score and the tags "
                  "chosen as by `python -m serve tag`. /v1 and /metrics need `Authorization: Bearer KEY` when "
                  "the server has an API key; /healthz, /readyz and this description stay open.")
    app.add_middleware(RequestMetrics, metrics=service.metrics)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:
        headers = {503: {"Retry-After": "1"}, 401: {"WWW-Authenticate": "Bearer"}}.get(exc.status)
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    def api_key(authorization: Annotated[str | None, Header(description="Bearer KEY, when the server has a key")]
                = None) -> None:
        if not service.authorized(authorization):
            raise RequestError(401, "missing or wrong API key: send Authorization: Bearer KEY")

    guarded = [Depends(api_key)]

    @app.post("/v1/tag", dependencies=guarded, responses={200: {"model": TagAnswer}, **ERRORS},
              openapi_extra={"requestBody": TAG_BODY}, summary="Tag images")
    async def tag(
        request: Request,
        select: Annotated[str | None, Query(description="thresholds, mcut or top-k:K (default: the server's)")] = None,
        threshold: Annotated[float | None, Query(ge=0, le=1, description="one threshold for every class")] = None,
        max_tags: Annotated[int | None, Query(ge=1, description="at most N tags, highest first")] = None,
        min_score: Annotated[float | None, Query(ge=0, le=1, description="no tag scoring below X")] = None,
        exclude: Annotated[list[str] | None, Query(description="classes left out (caption rules are added to "
                                                   "the server's)")] = None,
        exclude_re: Annotated[list[str] | None, Query(description="regular expressions of classes left out")] = None,
        replace: Annotated[list[str] | None, Query(description="OLD=NEW: class OLD written as NEW")] = None,
        first: Annotated[list[str] | None, Query(description="words put before every other tag")] = None,
        spaces: Annotated[bool, Query(description="underscores as spaces")] = False,
        escape: Annotated[bool, Query(description="escape parentheses")] = False,
        weights: Annotated[bool, Query(description="each tag with its score, (tag:0.83)")] = False,
    ) -> JSONResponse:
        """Every class score and the tags of each image: multipart files, one raw image body, or JSON `{"paths": [...]}`
        / `{"urls": [...]}` where allowed. One unusable image refuses the whole request (4xx naming it)."""
        lists = [exclude or [], exclude_re or [], replace or [], first or []]
        try:
            rules = make_rules(*lists, spaces, escape, weights) if any(lists) or spaces or escape or weights else None
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        selector = service.selector(select, threshold, max_tags, min_score, rules)
        images = await read_images(request, service)
        return JSONResponse({"results": await service.tag(images, selector)})

    @app.get("/v1/model", dependencies=guarded, summary="The model, its classes and the defaults")
    async def model() -> dict[str, Any]:
        return service.describe()

    @app.get("/healthz", summary="The process is alive (open)", responses={503: {"model": Refusal}})
    async def healthz() -> JSONResponse:
        ok = service.healthy
        return JSONResponse({"status": "ok" if ok else "batching stopped"}, status_code=200 if ok else 503)

    @app.get("/readyz", summary="The model is loaded and warmed up (open)", responses={503: {"model": Refusal}})
    async def readyz() -> JSONResponse:
        ready = service.ready and service.healthy
        return JSONResponse({"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503)

    @app.get("/metrics", dependencies=guarded, summary="Prometheus metrics (text format)",
             response_class=Response)
    async def metrics() -> Response:
        return Response(service.metrics.text(), media_type=CONTENT_TYPE)

    return app


def run_local(settings: ApiSettings, host: str, port: int) -> None:
    """The ``local`` engine: serve :func:`build_app` with uvicorn on ``host:port`` (``OSError``: port not bound)."""
    import socket

    import uvicorn

    service = TaggingService.load(settings)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))  # OSError (port in use, unknown address) before anything starts
    print(f"model {service.predictor.path}: {len(service.predictor.classes)} classes, "
          f"{service.predictor.device_description}; serving on http://{host}:{port} (engine local, batches of up "
          f"to {settings.max_batch}, waiting at most {settings.max_wait_ms:g} ms); API description at /docs",
          file=sys.stderr)
    config = uvicorn.Config(build_app(service), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except SystemExit:  # uvicorn's answer to a failed start-up (its message is above)
        raise RuntimeError("the service did not start") from None
