"""Shared fixtures. Every test session gets its own dataset cache (``SPML_CACHE``) and runs folder
(``SPML_RUNS``), so tests never read or write the user's ``~/.cache/spml`` or ``./runs``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("spml-cache")
    old = {k: os.environ.get(k) for k in ("SPML_CACHE", "SPML_RUNS")}
    os.environ["SPML_CACHE"] = str(cache)
    os.environ["SPML_RUNS"] = str(tmp_path_factory.mktemp("spml-runs"))
    yield cache
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def builtin_cache(_isolated_cache: Path) -> Path:
    """The session cache folder, with the tiny built-in dataset generated in it (once)."""
    from train.data.builtin import ensure_builtin

    ensure_builtin("tiny", seed=0, cache_dir=_isolated_cache, progress=False)
    return _isolated_cache
