"""The output stage of the tagging pipeline: a selection (:class:`TagSelector`: scores -> record) and the writers
(:class:`OutputWriter`) that take every finished batch. Selection works on the stored (rounded) scores, so a record's
tags can be chosen again exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serve.outputs import selection_modes
from serve.outputs.caption_rules import CaptionRules, rules_from_dict
from serve.outputs.records import Result, tag_record, write_errors, write_run_file
from serve.outputs.run_manifest import write_manifest
from serve.outputs.sidecars import SidecarSpec, write_sidecars
from serve.outputs.tag_folders import TagFolders, place

#: One image's output record: ``{"path": key, "scores": {class: p}, "tags": [tag, ...]}``.
Record = dict[str, Any]


class StoredRecords(Protocol):
    """Where a run keeps its images' records (the tagging journal, :class:`serve.tagging.journal.Journal`)."""

    def records(self, keys: Iterable[str]) -> Iterable[Record]:
        """The stored records of ``keys``."""
        ...
#: ``(key, scores (C,)) -> Record``: how tags are chosen from an image's scores.
Select = Callable[[str, np.ndarray], Record]


@dataclass(frozen=True)
class TagSelector:
    """The tags of an image: the classes ``mode`` chooses, highest first, written with the caption ``rules``;
    ``thresholds`` are needed by the ``thresholds`` mode only."""

    classes: list[str]
    thresholds: np.ndarray | None = None
    mode: selection_modes.Selection = field(default_factory=selection_modes.Selection)
    rules: CaptionRules = field(default_factory=CaptionRules)

    def __call__(self, key: str, scores: np.ndarray) -> Record:
        """The record of image ``key`` with sigmoid ``scores`` ``(C,)``."""
        return tag_record(key, scores, self.classes, self.thresholds, self.mode, self.rules)

    def chosen(self, scores: Mapping[str, float]) -> list[str]:
        """The classes selected from a record's stored ``scores`` (before caption rules), highest first."""
        row = np.array([scores[c] for c in self.classes], dtype=np.float64)
        return [self.classes[i] for i in selection_modes.select_classes(row, self.thresholds, self.mode)]

    def reselect(self, record: Mapping[str, Any]) -> Record:
        """``record`` with its tags chosen again, exactly, from its stored scores."""
        return self(str(record["path"]), np.array([record["scores"][c] for c in self.classes], dtype=np.float64))

    def labels(self, record: Mapping[str, Any]) -> list[str]:
        """The tag names of a record for tag folders: its selected classes with exclude, replace and spaces."""
        return self.rules.labels(self.chosen(record["scores"]))

    def to_dict(self) -> dict[str, Any]:
        """What decides the tags, JSON-able (read back by :meth:`from_dict`)."""
        values = None
        if self.mode.uses_thresholds and self.thresholds is not None:
            values = {c: float(t) for c, t in zip(self.classes, self.thresholds, strict=True)}
        return {"selection": self.mode.to_dict(), "thresholds": values, "caption_rules": self.rules.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], classes: Sequence[str]) -> TagSelector:
        """The :class:`TagSelector` of :meth:`to_dict` for ``classes`` (``ValueError`` on a bad document)."""
        values = doc.get("thresholds")
        thresholds = np.array([float(values[c]) for c in classes]) if isinstance(values, dict) else None
        mode = selection_modes.selection_from_dict(doc["selection"])
        return cls(list(classes), thresholds, mode, rules_from_dict(doc.get("caption_rules") or {}))


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
    """Selection + writers: what :func:`serve.tagging.run.run_plan` does with each batch an engine returns."""

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
    """The sidecar files of each image, written as its batch finishes (``append``: merge the tags)."""

    def __init__(
        self, spec: SidecarSpec, paths: Mapping[str, Mapping[str, Path]], select: TagSelector, append: bool
    ) -> None:
        self.spec, self.paths, self.select, self.append = spec, paths, select, append

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Write the sidecars of every record."""
        describe = self.select.mode.describe()
        for rec in records:
            extra = {"selected": self.select.chosen(rec["scores"]), "selection": describe}
            write_sidecars(self.paths[rec["path"]], rec["tags"], rec["scores"], extra, self.spec, self.append)

    def finish(self) -> None:
        """Nothing left to write."""


class TagFolderWriter:
    """Places each image into ``DIR/<tag>/`` per tag as its batch finishes, and the ``kept`` earlier ones at the end."""

    def __init__(self, spec: TagFolders, folder: Path, select: TagSelector, journal: StoredRecords,
                 kept: Iterable[str]) -> None:
        self.spec, self.folder, self.select, self.journal = spec, folder, select, journal
        self.kept = sorted(kept)
        self.created = 0

    def _place(self, records: Iterable[Mapping[str, Any]]) -> None:
        for rec in records:
            self.created += place(self.folder / rec["path"], rec["path"], self.select.labels(rec), self.spec)

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Place every record's image."""
        self._place(records)

    def finish(self) -> None:
        """Place the images of earlier runs (already there after a plain re-run: nothing is added)."""
        self._place(self.journal.records(self.kept))


class RunFileWriter:
    """The run file (this run's records plus the ``kept`` ones, re-selected), sorted by path and written atomically from
    the ``journal`` at the end, then its manifest."""

    def __init__(self, path: Path, journal: StoredRecords, select: TagSelector, separator: str, kept: Iterable[str],
                 manifest: Mapping[str, Any] | None = None) -> None:
        self.path, self.journal, self.select, self.separator = path, journal, select, separator
        self.kept = set(kept)
        self.keys = set(self.kept)
        self.manifest = dict(manifest or {})

    def write(self, records: Sequence[Record], failed: Sequence[tuple[str, str]]) -> None:
        """Remember which images this run tagged (their records are in the journal)."""
        self.keys.update(rec["path"] for rec in records)
        self.kept.difference_update(rec["path"] for rec in records)

    def finish(self) -> None:
        """Write the run file, sorted by path, and its manifest."""
        records = (self.select.reselect(r) if r["path"] in self.kept else r
                   for r in self.journal.records(sorted(self.keys)))
        write_run_file(self.path, records, self.select.classes, self.separator)
        write_manifest(self.path, {**self.manifest, "images": len(self.keys)})


class ErrorsWriter:
    """The errors file (``path<TAB>reason``), written at the end when there are failures or an old one."""

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
