"""The journal of a tagging run (``<output>.partial``): JSON Lines, a :class:`JournalHeader` then a record or failure
per image, flushed per batch, so a killed run resumes losing only batches in flight; another model's is refused."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from models.files.atomic_writes import atomic_path
from serve.outputs.records import OutputConflictError

JOURNAL_FORMAT = "spml-tag-journal"
JOURNAL_VERSION = 1


def journal_path(output: str | Path) -> Path:
    """``out/tags.jsonl`` -> ``out/tags.jsonl.partial``: the journal of the run writing ``output``."""
    output = Path(output)
    return output.with_name(output.name + ".partial")


@dataclass(frozen=True)
class JournalHeader:
    """Which model produced a journal (file, SHA-256, classes) and the tag options (``tagging``, None when unknown)."""

    model: str
    sha256: str
    classes: tuple[str, ...]
    tagging: dict[str, Any] | None = field(default=None, compare=False)

    def line(self) -> str:
        """The header as the journal's first line (JSON, no newline)."""
        return json.dumps({"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION, **asdict(self)}, ensure_ascii=False)

    @classmethod
    def parse(cls, text: str) -> JournalHeader | None:
        """The header in a journal's first line, or ``None`` when the line is not one."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or doc.get("format") != JOURNAL_FORMAT:
            return None
        try:
            tagging = doc.get("tagging") if isinstance(doc.get("tagging"), dict) else None
            return cls(str(doc["model"]), str(doc["sha256"]), tuple(str(c) for c in doc["classes"]), tagging)
        except (KeyError, TypeError):
            return None

    def refuse_other(self, other: JournalHeader, path: Path) -> None:
        """Raise :class:`OutputConflictError` unless ``other`` (the journal's header) names the same model."""
        if other.classes != self.classes:
            why = f"a model with other classes ({len(other.classes)} classes, this model has {len(self.classes)})"
        elif other.sha256 != self.sha256:
            why = f"another model ({other.model}, whose content differs from {self.model})"
        else:
            return
        raise OutputConflictError(
            f"the journal {path} of an interrupted run was written by {why}: its results are not merged; "
            "rerun with the same model, or delete the journal (or use --existing overwrite) to start again")


@dataclass
class JournalContents:
    """What a journal holds: header (None if empty), each image's last record offset, failures, length."""

    header: JournalHeader | None
    offsets: dict[str, int]
    errors: dict[str, str]
    size: int = 0


def read_journal(path: Path) -> JournalContents:
    """Scan the journal at ``path`` once (missing: empty); :class:`OutputConflictError` without a header."""
    contents = JournalContents(None, {}, {})
    if not path.is_file():
        return contents
    with open(path, "rb") as fh:
        offset = 0
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # cut short by a kill: ignored, and dropped when the journal is reopened
            start, offset = offset, offset + len(raw)
            if contents.header is None:
                contents.header = JournalHeader.parse(raw.decode("utf-8"))
                if contents.header is None:
                    raise OutputConflictError(
                        f"{path} is not a tagging journal of this version (no header line); delete it, or use "
                        "--existing overwrite, to start again")
                contents.size = offset
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "scores" in rec:
                contents.offsets[str(rec["path"])] = start
                contents.errors.pop(str(rec["path"]), None)
            elif isinstance(rec, dict) and "error" in rec:
                contents.errors[str(rec["path"])] = str(rec["error"])
            contents.size = offset
    return contents


class Journal:
    """The journal of the run in progress: opened fresh (header written) or for appending after a kill."""

    def __init__(self, path: Path, header: JournalHeader, contents: JournalContents | None = None) -> None:
        """Start a fresh journal at ``path`` (``contents=None``) or continue one :func:`read_journal` read."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if contents is None or contents.header is None:
            with atomic_path(path) as tmp:
                tmp.write_text(header.line() + "\n", encoding="utf-8")
            self.offsets: dict[str, int] = {}
        else:
            header.refuse_other(contents.header, path)
            with open(path, "r+b") as fh:
                fh.truncate(contents.size)
            self.offsets = dict(contents.offsets)
        self._fh = open(path, "ab")  # noqa: SIM115 - closed in close()

    def write(self, records: Sequence[dict[str, Any]], failed: Sequence[tuple[str, str]] = ()) -> None:
        """Append records and (path, reason) failures, then flush them to the operating system."""
        position = self._fh.tell()
        chunks = []
        for rec in records:
            data = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
            self.offsets[rec["path"]] = position
            position += len(data)
            chunks.append(data)
        chunks += [(json.dumps({"path": p, "error": e}, ensure_ascii=False) + "\n").encode("utf-8") for p, e in failed]
        self._fh.write(b"".join(chunks))
        self._fh.flush()

    def records(self, keys: Iterable[str]) -> Iterator[dict[str, Any]]:
        """The last journaled record of each key, in the order of ``keys`` (all must be journaled)."""
        self._fh.flush()
        with open(self.path, "rb") as fh:
            for key in keys:
                fh.seek(self.offsets[key])
                yield json.loads(fh.readline())

    def close(self, remove: bool) -> None:
        """Close the file; ``remove`` deletes it (the run file and errors file now hold everything)."""
        self._fh.close()
        if remove:
            self.path.unlink(missing_ok=True)
