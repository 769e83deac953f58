"""Tagging engines: where a plan's images are turned into scores. One module per engine in this package, found by
its file name (adding an engine is adding one file); :data:`DEFAULT_ENGINE` is used when none is named.

An engine only turns image keys into scores or errors. Everything else (what to tag, thresholds, the journal,
sidecars, the run file, resuming) is :mod:`serve.tagging`'s pipeline, the same for every engine. An engine module
defines::

    def score(job: serve.tagging.job.TagJob, plan: serve.tagging.plan.TagPlan,
              report: Callable[[str], None]) -> Iterator[list[Result]]

yielding one list of :class:`Result` per finished batch (each key of ``plan.todo`` exactly once, in any
order), and may define ``check_available()`` (raise :class:`EngineUnavailableError` when its package is
missing). Engines load the model themselves (``job.model`` on ``job.device``), or use ``job.predictor`` when
one is given; ``report`` prints a line for the user (start-up, warnings). Importing this package is light:
an engine module is imported only when chosen, so the local engine never imports Ray.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ENGINE = "local"


class EngineUnavailableError(RuntimeError):
    """The engine's package is not installed (the message says what to install)."""


@dataclass(frozen=True)
class Result:
    """What an engine returns for one image: its sigmoid scores ``(C,)`` float32, or why it could not be used."""

    key: str
    scores: np.ndarray | None
    error: str | None = None


def engine_names() -> list[str]:
    """The registered engines: the modules of this package (no engine is imported)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def get_engine(name: str) -> ModuleType:
    """The engine module registered as ``name``, checked usable (its ``check_available``, when it has one).
    Raises ``ValueError`` for unknown names, :class:`EngineUnavailableError` when its package is missing."""
    if name not in engine_names():
        raise ValueError(f"unknown engine {name!r}; available: {', '.join(engine_names())}")
    module = importlib.import_module(f"{__name__}.{name}")
    check = getattr(module, "check_available", None)
    if check is not None:
        check()
    return module
