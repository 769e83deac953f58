"""Tagging engines: how ``python -m serve tag`` runs a :class:`TagJob`. One module per engine, one registry.

- ``local`` (:mod:`serve.engines.local`): this machine, decode threads ahead of one model; the default.
- ``ray`` (:mod:`serve.engines.ray_engine`): a Ray cluster (or a local Ray instance) with Ray Data: streaming
  reads, decoding in tasks, a pool of model actors on GPUs or CPUs, retries.

An engine module defines ``run(job, predictor, warn) -> serve.tag.TagSummary``; it is imported only when
chosen, so the local engine never imports Ray. Adding an engine is one module plus one line in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve.sidecars import SidecarSpec
    from serve.sources import Partition

#: Engine name -> module defining ``run``.
ENGINES: dict[str, str] = {"local": "serve.engines.local", "ray": "serve.engines.ray_engine"}
DEFAULT_ENGINE = "local"


class EngineUnavailableError(RuntimeError):
    """The engine's package is not installed (the message says what to install)."""


@dataclass
class TagJob:
    """Everything a tagging run needs besides the loaded model: what to read, where to write, how to run."""

    source: str
    model: Path
    output: Path
    backend: str | None = None
    device: str | None = None
    errors: Path | None = None
    threshold: float | None = None
    per_class: Mapping[str, float] | None = None
    top_k: int | None = None
    sidecar: SidecarSpec | None = None
    existing: str = "skip"
    batch_size: int = 16
    workers: int | None = None  # local: decode threads; ray: model actors
    max_pixels: int | None = None
    progress: bool = True
    partition: Partition | None = None
    address: str | None = None  # ray: cluster address (None: start a local instance)
    gpus_per_worker: float = 0.0  # ray: GPUs per model actor


def get_engine(name: str) -> ModuleType:
    """The engine module registered as ``name``, checked usable (its ``check_available``, when it has one).
    Raises ``ValueError`` for unknown names, :class:`EngineUnavailableError` when its package is missing."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
    module = importlib.import_module(ENGINES[name])
    check = getattr(module, "check_available", None)
    if check is not None:
        check()
    return module
