"""The HTTP inference service, ``python -m serve api`` (:mod:`serve.commands.api`): one FastAPI app
(:mod:`serve.api.app`) over one :class:`~serve.api.service.TaggingService` (the loaded model, decoding, the request
limits, the tags of ``serve tag``), run by an engine of :data:`serve.commands.api.API_ENGINES`: ``local`` (uvicorn,
one process, the :class:`~serve.api.batching.Batcher`) or ``ray`` (Ray Serve replicas wrapping the same app, Ray's
``@serve.batch``; :mod:`serve.api.ray_serve`). Why these, and how to run them: docs/deploy.md. This module holds
the service's defaults and imports nothing (the command line reads it).
"""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_UPLOAD_MB = 20.0
#: The environment variable that holds the API key (safer than ``--api-key`` on a command line others can list).
API_KEY_ENV = "SPML_API_KEY"
