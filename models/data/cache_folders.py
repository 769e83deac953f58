"""Where built datasets live; importable without the builders of :mod:`models.sources`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["GENERATOR_VERSION", "builtin_folder", "cache_parent", "cache_root", "generated_builtin_folders"]

#: The built-in generator's version (:mod:`models.sources.builtin_scenes`); bump it whenever generation changes
#: what is drawn or labelled: cached datasets of other versions are not reused.
GENERATOR_VERSION = 2


def cache_root() -> Path:
    """The package's cache folder: ``$SPML_CACHE`` if set, else ``~/.cache/spml``."""
    env = os.environ.get("SPML_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spml"


def cache_parent(kind: str, cache_dir: str | Path | None) -> Path:
    """``<cache_dir>/<kind>``; ``cache_dir`` defaults to :func:`cache_root`."""
    return Path(cache_dir if cache_dir is not None else cache_root()).expanduser() / kind


def builtin_folder(preset: str, seed: int, cache_dir: str | Path | None = None) -> Path:
    """Where the built-in dataset ``preset`` of ``seed`` is (or would be) generated under ``cache_dir``."""
    return cache_parent("builtin", cache_dir) / f"{preset}-seed{seed}-v{GENERATOR_VERSION}"


def generated_builtin_folders(cache_dir: str | Path | None = None) -> list[Path]:
    """The built-in datasets of this generator version already under ``cache_dir``, ``default`` first."""
    parent = builtin_folder("default", 0, cache_dir).parent
    found = [p for p in parent.glob(f"*-v{GENERATOR_VERSION}") if (p / ".complete").is_file()]
    return sorted(found, key=lambda p: (not p.name.startswith("default"), p.name))
