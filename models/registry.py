"""The two ways something is registered: a :class:`Table` for a closed list (choices, help, the one "unknown X" message)
and a :class:`Registry` for plug-ins registered by decorator; both read-only mappings."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Listing", "Registry", "Row", "Table", "UnknownName", "unknown_message"]

V = TypeVar("V")


class UnknownName(KeyError, ValueError):
    """A name not in a table or registry (the message lists the known ones); a ``ValueError`` and a ``KeyError``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def unknown_message(what: str, name: str, known: Iterable[str]) -> str:
    """The one message for a name that is not there: ``unknown WHAT 'name'; choose from a, b, c``."""
    return f"unknown {what} {name!r}; choose from {', '.join(known)}"


@dataclass(frozen=True)
class Row(Generic[V]):
    """One entry: its ``name``, a line of ``help`` and its ``value``."""

    name: str
    help: str
    value: V


class Listing(Mapping[str, V], Generic[V]):
    """What a table and a registry share: named rows, a read-only mapping of name -> value with one error message."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._rows: dict[str, Row[V]] = {}

    def _add(self, row: Row[V]) -> None:
        if not row.name or row.name in self._rows:
            raise ValueError(f"{self.what} name {row.name!r} is empty or registered twice")
        self._rows[row.name] = row

    def row(self, name: str) -> Row[V]:
        """The row named ``name``; :class:`UnknownName` listing the known names otherwise."""
        try:
            return self._rows[name]
        except KeyError:
            raise UnknownName(unknown_message(self.what, name, self.names())) from None

    def __getitem__(self, name: str) -> V:
        return self.row(name).value

    def __contains__(self, name: object) -> bool:
        return name in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def names(self) -> list[str]:
        """Every name, in the listing's order."""
        return list(self._rows)

    def rows(self) -> list[Row[V]]:
        """Every row, in the listing's order."""
        return list(self._rows.values())

    def help_text(self, separator: str = "; ") -> str:
        """``name: help`` for every row (for ``--help``)."""
        return separator.join(f"{row.name}: {row.help}" if row.help else row.name for row in self._rows.values())

    def cli_help(self) -> str:
        """:meth:`help_text` for an ``argparse`` help string (``%`` doubled)."""
        return self.help_text().replace("%", "%%")


class Table(Listing[V]):
    """A closed list, written as rows in one place: ``Table("optimizer", [Row("adam", "Adam", make_adam), ...])``."""

    def __init__(self, what: str, rows: Iterable[Row[V]]) -> None:
        super().__init__(what)
        for row in rows:
            self._add(row)

    def __setitem__(self, name: str, value: V) -> None:
        """Add or replace a row's value (for tests, e.g. pytest's ``monkeypatch.setitem``; the help is kept)."""
        old = self._rows.get(name)
        self._rows[name] = Row(name, old.help if old is not None else "", value)

    def __delitem__(self, name: str) -> None:
        self._rows.pop(name)


class Registry(Listing[V]):
    """Open plug-ins: ``@REGISTRY.register`` on a class with ``name`` and ``description`` adds it (or one instance, with
    ``instances``), in registration order unless ``order`` sorts it."""

    def __init__(self, what: str, order: Callable[[Row[V]], Any] | None = None, instances: bool = False) -> None:
        super().__init__(what)
        self.order = order
        self.instances = instances

    def register(self, cls: Any) -> Any:
        """Class decorator: add ``cls`` (or ``cls()``) under ``cls.name``; returns ``cls``."""
        value = cls() if self.instances else cls
        self._add(Row(str(getattr(cls, "name", "")), str(getattr(cls, "description", "")), value))
        if self.order is not None:
            self._rows = {row.name: row for row in sorted(self._rows.values(), key=self.order)}
        return cls


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) importing each public name from ``exports[name]`` on first use."""

    def resolve(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return resolve
