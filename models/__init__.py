"""The bottom layer, shared by every stage: the data, the network, its metadata and files, preprocessing, evaluation,
the inference runtimes, ``registry`` and ``command_line`` (docs/layout.md maps them). It imports no other package of
this project; the names below load their module (and torch) on first use."""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module defining it, imported on first access.
_EXPORTS = {
    "ModelMeta": "models.checkpoint",
    "load_checkpoint": "models.checkpoint",
    "save_checkpoint": "models.checkpoint",
    "MultiLabelNet": "models.network",
    "build_model": "models.network",
    "model_from_meta": "models.network"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
