"""What a tagging engine is, and their registry: :data:`ENGINES`, filled by the :func:`engine` decorator.

An engine only turns image keys into scores or errors. Everything else (what to tag, thresholds, the journal,
sidecars, the run file, resuming) is :mod:`serve.tagging`'s pipeline, the same for every engine. An engine is a
scoring function decorated with :func:`engine`::

    @engine("local", "this machine ...")
    def score(job: TagJob, plan: TagPlan, report: Callable[[str], None]) -> Iterator[list[Result]]

yielding one list of :class:`~serve.outputs.records.Result` per finished batch (each key of ``plan.todo`` exactly
once, in any order). ``check_available`` (optional) raises :class:`EngineUnavailableError` when its package is
missing. Engines load the model themselves (``job.model`` on ``job.run.device``), or use ``job.predictor`` when one is
given; ``report`` prints a line for the user (start-up, warnings).
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
    check_available: Callable[[], None] = _always_available


#: The tagging engines by name.
ENGINES: Registry[Engine] = Registry("engine")


def engine(name: str, description: str, check_available: Callable[[], None] | None = None) -> Callable[[Any], Any]:
    """Decorator registering a scoring function as the engine ``name`` (returns the function unchanged)."""

    def register(score: Score) -> Score:
        ENGINES.register(Engine(name, description, score, check_available or _always_available))
        return score

    return register
