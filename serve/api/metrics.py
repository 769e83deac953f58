"""The service's Prometheus metrics (``GET /metrics``): requests, latency, images, model batches, queue depth."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ApiMetrics", "RequestMetrics"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ApiMetrics:
    """The metrics of one service; ``depth`` reads the number of images waiting for the model."""

    def __init__(self, depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("spml_api_requests", "HTTP requests answered, by path and status",
                                ["path", "status"], registry=r)
        self.latency = Histogram("spml_api_request_seconds", "HTTP request latency, by path", ["path"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.images = Counter("spml_api_images", "images received: tagged, or refused (bad input, limits)",
                              ["outcome"], registry=r)
        self.batch_size = Histogram("spml_api_batch_size", "images per model call (one call per batch)",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.model_seconds = Histogram("spml_api_model_seconds", "seconds per model call",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.model_errors = Counter("spml_api_model_errors", "model calls that raised (their images answered 503)",
                                    registry=r)
        Gauge("spml_api_queue_depth", "images waiting for the model", registry=r).set_function(depth)
        self.ready = Gauge("spml_api_ready", "1 when the model is loaded and warmed up", registry=r)

    def text(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: each HTTP request counted by route (``other``: none matched) and status, with its latency."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: ApiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """Pass the request on, keeping its response status."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            path = str(getattr(route, "path", "other"))
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - start)
