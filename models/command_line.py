"""The one command-line shape of ``train``, ``export`` and ``serve``: exit codes, :class:`UsageError`,
:class:`CommandFailed` and :func:`run_command`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of every command: done; failed (the work, or part of it); bad usage; interrupted (Ctrl-C)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    INTERRUPTED = 130


class UsageError(ValueError):
    """A bad command line or input named on it (an option value, a missing file); exit status 2."""


class CommandFailed(RuntimeError):
    """The command could not do its work (a model that does not load, a check that fails); exit status 1."""


def run_command(prog: str, body: Callable[[], int | None], interrupted: str | Callable[[], str] = "interrupted") -> int:
    """Run ``body`` and return its exit code: a :class:`UsageError` / :class:`CommandFailed` prints ``PROG: error:
    MESSAGE`` and returns 2 / 1, Ctrl-C prints ``PROG: INTERRUPTED`` and returns 130."""
    lead = f"{prog}: " if prog else ""
    try:
        code = body()
    except UsageError as exc:
        print(f"{lead}error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except CommandFailed as exc:
        print(f"{lead}error: {exc}", file=sys.stderr)
        return int(ExitCode.FAILED)
    except KeyboardInterrupt:
        print(f"\n{lead}{interrupted() if callable(interrupted) else interrupted}", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    return int(ExitCode.OK if code is None else code)
