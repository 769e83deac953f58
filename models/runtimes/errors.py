"""Why a model could not be loaded: one readable line each, no traceback needed."""

from __future__ import annotations

from typing import Any


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why (no need to read a traceback)."""


class ModelSpecError(ModelLoadError):
    """The request itself is wrong: no such file or run, unsupported suffix, unknown backend or device."""


class BackendUnavailableError(ModelLoadError):
    """The runtime or accelerator the model needs is not installed or not usable on this machine."""


def import_optional(module: str, hint: str) -> Any:
    """The top-level ``module``, imported; else ``ModuleNotFoundError`` naming the runtime and the pip ``hint``."""
    try:
        return __import__(module)  # through builtins.__import__, as an import statement (import hooks see it)
    except ImportError as exc:
        raise ModuleNotFoundError(f"the {module} runtime needs the {module} package ({exc}); install it with: "
                                  f"{hint}") from exc
