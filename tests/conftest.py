"""Shared fixtures: an isolated dataset cache with the tiny built-in dataset generated once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def builtin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the tiny built-in dataset; ``SPML_CACHE`` points at it for the whole session."""
    from train.data.builtin import ensure_builtin

    cache = tmp_path_factory.mktemp("spml-cache")
    os.environ["SPML_CACHE"] = str(cache)
    ensure_builtin("tiny", seed=0, cache_dir=cache, progress=False)
    return cache
