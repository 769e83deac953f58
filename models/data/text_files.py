"""Read the plain-text annotation files of official dataset releases (CUB, NUS-WIDE) with clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from models.data.types import DataError

__all__ = ["iter_lines", "read_lines", "read_table"]


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file one at a time (BOM accepted, line ends removed); ``DataError`` if unreadable."""
    try:
        with Path(path).open(encoding="utf-8-sig", newline=None) as handle:
            for line in handle:
                yield line.rstrip("\n")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: undecodable bytes (expected UTF-8 text): {exc.reason}") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read file: {exc.strerror or exc}") from exc


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (BOM accepted, line ends removed); unreadable -> ``DataError``."""
    return list(iter_lines(path))


def read_table(path: Path, fields: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    """``(line number, first values)`` of each line of a whitespace-separated table; ``DataError`` on a short line."""
    rows: list[tuple[int, list[str]]] = []
    for lineno, raw in enumerate(read_lines(path), start=1):
        parts = raw.split(None, len(fields))
        if not parts:
            continue
        if len(parts) < len(fields):
            raise DataError(f"{path}:{lineno}: expected {' '.join(fields)}, found {raw.strip()!r}")
        rows.append((lineno, parts[: len(fields)]))
    return rows
