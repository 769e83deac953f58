"""The output stage of the tagging pipeline: scores -> selected tags -> records -> output writers.

The only step between an engine's results and the files a run leaves, with a small interface:

- a *selection* function ``(key, scores (C,)) -> record`` (:class:`Selection`: the classes at or above their
  threshold, highest first, at most ``top_k``); a record is ``{"path", "scores", "tags"}`` (see
  :mod:`serve.records`);
- a list of *writers* (:class:`OutputWriter`): each receives every finished batch's records and failures, in
  the order batches finish, and is told when the run has completed (:meth:`OutputWriter.finish`).

The default writers (:func:`serve.tag.default_outputs`): :class:`SidecarWriter` (one text file per image, as each
batch finishes), :class:`RunFileWriter` (the run file, sorted by path, written from the journal at the end) and
:class:`ErrorsWriter`. Another output is one more writer; another way to choose tags is another selection
function; engines are not involved. Records of images tagged by an earlier, interrupted run reach the run file
through the journal, not through the writers (their sidecars were written by that run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from serve.records import tag_record, write_errors, write_run_file
from serve.sidecars import SidecarSpec, write_sidecar

if TYPE_CHECKING:
    from serve.engines import Result
    from serve.journal import Journal

#: One image's output record: ``{"path": key, "scores": {class: p}, "tags": [class, ...]}``.
Record = dict[str, Any]
#: ``(key, scores (C,)) -> Record``: how tags are chosen from an image's scores.
Select = Callable[[str, np.ndarray], Record]


@dataclass(frozen=True)
class Selection:
    """The tags of an image: the classes whose (rounded) score is at or above their own threshold, highest score
    first, at most ``top_k`` (:func:`serve.records.tag_record`)."""

    classes: list[str]
    thresholds: np.ndarray
    top_k: int | None = None

    def __call__(self, key: str, scores: np.ndarray) -> Record:
        """The record of image ``key`` with sigmoid ``scores`` ``(C,)``."""
        return tag_record(key, scores, self.classes, self.thresholds, self.top_k)


class OutputWriter(Protocol):
    """One output of a run."""

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Take a finished batch: its records and its ``(key, reason)`` failures."""
        ...

    def finish(self) -> None:
        """The run has completed (not called when it stops early): write what is written at the end."""
        ...


@dataclass
class OutputStage:
    """Selection + writers: what :func:`serve.tag.run_plan` does with each batch an engine returns."""

    select: Select
    writers: list[OutputWriter] = field(default_factory=list)

    def records(self, results: Iterable[Result]) -> tuple[list[Record], list[tuple[str, str]]]:
        """A batch of engine results -> (records of the scored images, ``(key, reason)`` of the failed ones)."""
        records: list[Record] = []
        failed: list[tuple[str, str]] = []
        for result in results:
            if result.scores is None:
                failed.append((result.key, result.error or "unknown error"))
            else:
                records.append(self.select(result.key, result.scores))
        return records, failed

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Give a batch to every writer, in order."""
        for writer in self.writers:
            writer.write(records, failed)

    def finish(self) -> None:
        """Tell every writer that the run has completed."""
        for writer in self.writers:
            writer.finish()


class SidecarWriter:
    """One text file of tags per image (``spec``), written atomically as its batch finishes; ``append`` adds new
    tags to an existing file instead of replacing it."""

    def __init__(self, spec: SidecarSpec, paths: Mapping[str, Path], append: bool) -> None:
        self.spec, self.paths, self.append = spec, paths, append

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Write the sidecar of every record."""
        for rec in records:
            write_sidecar(self.paths[rec["path"]], rec["tags"], self.spec, append=self.append)

    def finish(self) -> None:
        """Nothing left to write."""


class RunFileWriter:
    """The run file: the records of this run plus the ``kept`` ones of earlier runs, sorted by path, written
    atomically at the end from the ``journal`` (which holds them all, so no record is kept in memory)."""

    def __init__(
        self, path: Path, journal: Journal, classes: Sequence[str], separator: str, kept: Iterable[str]
    ) -> None:
        self.path, self.journal, self.classes, self.separator = path, journal, list(classes), separator
        self.keys = set(kept)

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Remember which images this run tagged (their records are in the journal)."""
        self.keys.update(rec["path"] for rec in records)

    def finish(self) -> None:
        """Write the run file, sorted by path."""
        write_run_file(self.path, self.journal.records(sorted(self.keys)), self.classes, self.separator)


class ErrorsWriter:
    """The errors file (``path<TAB>reason``): this run's failures (after ``initial`` ones, e.g. folders that
    could not be listed), written at the end when there are any or when an older errors file must be replaced."""

    def __init__(self, path: Path, initial: Sequence[tuple[str, str]] = ()) -> None:
        self.path = path
        self.failed: list[tuple[str, str]] = list(initial)

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Collect the failures."""
        self.failed.extend(failed)

    def finish(self) -> None:
        """Write the errors file (an old one from an earlier run is replaced, empty when nothing failed)."""
        if self.failed or self.path.exists():
            write_errors(self.path, self.failed)
