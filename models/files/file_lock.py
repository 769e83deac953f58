"""An exclusive lock between processes on a lock file, so that parallel processes (torchrun ranks, two runs started
at once) build a cached dataset once: the first builds while the others wait, then find it built."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (created with its folder; POSIX ``flock``, a no-op where
    that is unavailable) for the duration of the ``with`` block."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
