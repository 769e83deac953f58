"""The HTTP inference service, ``python -m serve api`` (:mod:`serve.commands.api`): one FastAPI app
(:mod:`serve.api.app`) over one :class:`~serve.api.service.TaggingService` (the loaded model, decoding, the request
limits, the tags of ``serve tag``), run by an engine of :data:`API_ENGINES`: ``local`` (uvicorn, one process, the
:class:`~serve.api.batching.Batcher`) or ``ray`` (Ray Serve replicas wrapping the same app, Ray's ``@serve.batch``).
Why these, and how to run them: docs/deploy.md. This module imports nothing heavy (the command line reads it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from models.registry import Row, Table

if TYPE_CHECKING:
    from serve.api.service import ApiSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_UPLOAD_MB = 20.0
#: The environment variable that holds the API key (safer than ``--api-key`` on a command line others can list).
API_KEY_ENV = "SPML_API_KEY"


def _run_local(settings: ApiSettings, host: str, port: int, cluster: dict[str, Any]) -> None:
    from serve.api.app import run_local

    run_local(settings, host, port)


def _run_ray(settings: ApiSettings, host: str, port: int, cluster: dict[str, Any]) -> None:
    from serve.api.ray_serve import run_ray

    run_ray(settings, host, port, **cluster)


#: Where the service runs: the value serves ``settings`` on ``host:port`` until stopped.
API_ENGINES: Table[Any] = Table("service engine", [
    Row("local", "one process on this machine: uvicorn, the app's own dynamic batching", _run_local),
    Row("ray", "Ray Serve replicas on a Ray cluster (or a local instance), Ray's batching, autoscaling", _run_ray),
])
