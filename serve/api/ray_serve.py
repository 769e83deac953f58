"""The ``ray`` engine of ``serve api``: Ray Serve replicas (:class:`TaggerReplica`) each serving the same FastAPI app
over its own :class:`~serve.api.service.TaggingService`, batched by ``@serve.batch``, scaled between ``--replicas`` and
``--max-replicas``. Imported only by that engine (it needs ``ray[serve]``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
from ray import serve

from serve.api import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_MS
from serve.api.app import build_app
from serve.api.service import ApiSettings, TaggingService

#: The Ray Serve application's name and the deployment's.
APP_NAME = "spml"
DEPLOYMENT_NAME = "spml-tagger"
#: No per-request log lines (Ray writes its logs to files: a request leaves nothing on disk).
LOGGING = {"enable_access_log": False, "log_level": "WARNING"}


@serve.deployment(name=DEPLOYMENT_NAME, logging_config=LOGGING, health_check_period_s=5)
@serve.ingress()
class TaggerReplica:
    """One replica: the service with its model, images batched by ``@serve.batch``, the model off the event loop."""

    def __init__(self, settings: ApiSettings) -> None:
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.service = TaggingService.load(settings, scorer=self.score)
        self.score.set_max_batch_size(settings.max_batch)
        self.score.set_batch_wait_timeout_s(settings.max_wait_ms / 1000)

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH, batch_wait_timeout_s=DEFAULT_MAX_WAIT_MS / 1000)
    async def score(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """The model rows of a batch Ray gathered (one image per call of ``self.score(image)``)."""
        run = self.service.run_batch
        return list(await asyncio.get_running_loop().run_in_executor(self.model_thread, run, np.stack(images)))

    def __serve_build_asgi_app__(self) -> Any:
        """The replica's ASGI app (Ray builds it after ``__init__``)."""
        return build_app(self.service)

    def check_health(self) -> None:
        """Ray's health check: a replica whose service cannot answer is replaced."""
        if not self.service.healthy:
            raise RuntimeError("the tagging service stopped")


def deployment_options(settings: ApiSettings, replicas: int, max_replicas: int | None, cpus: float,
                       gpus: float) -> dict[str, Any]:
    """Ray Serve options of the deployment: ``replicas`` (autoscaling up to ``max_replicas``), their ``cpus`` and
    ``gpus``, and ``max_queue`` requests per replica plus as many in Ray's queue before a 503."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": cpus, "num_gpus": gpus},
        "max_ongoing_requests": settings.max_queue,
        "max_queued_requests": settings.max_queue}
    if max_replicas:
        options["autoscaling_config"] = {"min_replicas": replicas, "max_replicas": max_replicas,
                                         "target_ongoing_requests": settings.max_batch}
    else:
        options["num_replicas"] = replicas
    return options


def run_ray(settings: ApiSettings, host: str, port: int, address: str | None = None, replicas: int = 1,
            max_replicas: int | None = None, cpus_per_replica: int | None = None,
            gpus_per_replica: float = 0.0) -> None:
    """Serve ``settings`` with Ray Serve on ``host:port`` until Ctrl-C, then remove the application."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    signal.signal(signal.SIGTERM, _interrupt)  # docker stop, kill: the same clean exit as Ctrl-C
    most = max(replicas, max_replicas or 0)
    cpus = cpus_per_replica or max(1, int(ray.cluster_resources().get("CPU", os.cpu_count() or 1)) // most)
    settings = replace(settings, threads=settings.threads or cpus, decode_threads=cpus)
    if gpus_per_replica and settings.device is None:
        settings = replace(settings, device="cuda")
    serve.start(http_options={"host": host, "port": port}, logging_config=LOGGING)
    app = TaggerReplica.options(**deployment_options(settings, replicas, max_replicas, cpus, gpus_per_replica))
    serve.run(app.bind(settings), name=APP_NAME, route_prefix="/")
    scaling = f"{replicas}-{max_replicas} replicas (autoscaling)" if max_replicas else f"{replicas} replica(s)"
    print(f"model {settings.model}: serving on http://{host}:{port} (engine ray, {scaling}, {cpus} CPU(s)"
          f"{f' and {gpus_per_replica:g} GPU(s)' if gpus_per_replica else ''} each, batches of up to "
          f"{settings.max_batch}); API description at /docs; Ctrl-C stops it", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    finally:
        serve.delete(APP_NAME)
        if started and address is None:  # the local instance this process started
            serve.shutdown()
            ray.shutdown()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
