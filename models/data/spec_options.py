"""Options inside a dataset spec, ``kind:PATH?key=value&flag``, parsed the same way for every kind."""

from __future__ import annotations

from collections.abc import Collection

from models.data.types import DataError


def split_spec_options(argument: str, known: Collection[str], kind: str) -> tuple[str, dict[str, str]]:
    """``PATH?key=value&flag`` -> ``(PATH, {key: value, flag: ""})``; ``DataError`` for a key not in ``known``."""
    path, _, query = argument.partition("?")
    options: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in known:
            accepted = ", ".join(sorted(known)) or "none"
            raise DataError(f"{kind}:{argument}: unknown option {key!r} (accepted: {accepted})")
        options[key] = value.strip()
    return path, options
