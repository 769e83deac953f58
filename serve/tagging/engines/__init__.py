"""Tagging engines, one module each, registered with ``@ENGINES.register``."""

from __future__ import annotations

import importlib
import pkgutil

from serve.tagging.engines.base import ENGINES, Engine, EngineUnavailableError

__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "EngineUnavailableError", "engine_names", "get_engine"]

DEFAULT_ENGINE = "local"

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base" and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def engine_names() -> list[str]:
    """The registered engines."""
    return ENGINES.names()


def get_engine(name: str) -> type[Engine]:
    """The usable engine ``name``: ``ValueError`` if unknown, :class:`EngineUnavailableError` if missing."""
    chosen = ENGINES[name]
    chosen.check_available()
    return chosen
