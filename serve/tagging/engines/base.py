"""What a tagging engine is: an :class:`Engine` in :data:`ENGINES` whose ``score`` yields finished batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from models.registry import Registry
from serve.outputs.records import Result

__all__ = ["ENGINES", "Engine", "EngineUnavailableError"]


class EngineUnavailableError(RuntimeError):
    """The engine's package is not installed (the message says what to install)."""


class Engine:
    """A tagging engine: its ``name``, a line of ``description``, :meth:`score` and :meth:`check_available`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @staticmethod
    def score(job: Any, plan: Any, report: Callable[[str], None]) -> Iterator[list[Result]]:
        """Score ``plan.todo`` (see the module docstring)."""
        raise NotImplementedError

    @staticmethod
    def check_available() -> Any:
        """Raise :class:`EngineUnavailableError` when the engine's package is missing (default: nothing needed)."""


#: The tagging engines by name.
ENGINES: Registry[type[Engine]] = Registry("engine")
