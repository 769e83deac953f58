"""Read the plain-text annotation files of official dataset releases (CUB, NUS-WIDE) with clear errors."""

from __future__ import annotations

from pathlib import Path

from train.data.types import DataError

__all__ = ["read_lines", "read_table"]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (BOM accepted, line ends removed); unreadable -> ``DataError``."""
    try:
        return Path(path).read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: undecodable bytes (expected UTF-8 text): {exc.reason}") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read file: {exc.strerror or exc}") from exc


def read_table(path: Path, fields: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    """Read a whitespace-separated table whose lines start with ``fields`` (extra fields are ignored, blank
    lines skipped); return ``(line number, first len(fields) values)`` pairs. A short line -> ``DataError``."""
    rows: list[tuple[int, list[str]]] = []
    for lineno, raw in enumerate(read_lines(path), start=1):
        parts = raw.split(None, len(fields))
        if not parts:
            continue
        if len(parts) < len(fields):
            raise DataError(f"{path}:{lineno}: expected {' '.join(fields)}, found {raw.strip()!r}")
        rows.append((lineno, parts[: len(fields)]))
    return rows
