"""What a tagging engine is, and their registry :data:`ENGINES`: a scoring function
``score(job, plan, report) -> Iterator[list[Result]]`` registered with :func:`engine`, yielding the results of each
finished batch (each key of ``plan.todo`` once, in any order); it loads ``job.model`` itself, or uses
``job.predictor``. Everything else is the pipeline's (:mod:`serve.tagging.run`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from models.registry import Registry
from serve.outputs.records import Result

__all__ = ["ENGINES", "Engine", "EngineUnavailableError", "engine"]

Score = Callable[..., Iterator[list[Result]]]


class EngineUnavailableError(RuntimeError):
    """The engine's package is not installed (the message says what to install)."""


def _always_available() -> None:
    """An engine that needs nothing beyond the package."""


@dataclass(frozen=True)
class Engine:
    """A registered engine: its ``name``, a line of ``description``, its scoring function and its availability check."""

    name: str
    description: str
    score: Score
    check_available: Callable[[], Any] = _always_available


#: The tagging engines by name.
ENGINES: Registry[Engine] = Registry("engine")


def engine(name: str, description: str, check_available: Callable[[], Any] | None = None) -> Callable[[Any], Any]:
    """Decorator registering a scoring function as the engine ``name`` (returns the function unchanged)."""

    def register(score: Score) -> Score:
        ENGINES.register(Engine(name, description, score, check_available or _always_available))
        return score

    return register
