"""The HTTP inference service, ``python -m serve api``: one FastAPI app over one
:class:`~serve.api.service.TaggingService`, run by the ``local`` engine (uvicorn and the
:class:`~serve.api.batching.Batcher`) or ``ray`` (Ray Serve replicas); docs/deploy.md. This module holds the service's
defaults and imports nothing."""

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
