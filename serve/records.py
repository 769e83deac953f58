"""Output records: scores -> one record per image, and the files they go to (run file JSONL/CSV, errors file).

The one home of record formatting, shared by every tagging engine and the demo's batch downloads. Files are
written atomically with :mod:`models.atomic_files`.

Run file line (JSONL): ``{"path": "sub/a.jpg", "scores": {class: p, ...}, "tags": [class, ...]}``: every
class's probability rounded to 6 decimals, and the tags being the classes whose (rounded) probability is >=
their threshold, highest score first (at most ``top_k``). CSV: columns ``path, tags, <one per class>``, tags
joined with the separator. Images that cannot be used go to the errors file (``path<TAB>reason``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.atomic_files import atomic_path, atomic_write_text

DEFAULT_SEPARATOR = ", "

def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def tag_record(
    rel_path: str, probs: np.ndarray, classes: list[str], thresholds: np.ndarray, top_k: int | None = None
) -> dict[str, Any]:
    """One output record from a probability row ``(C,)``: rounded scores of all classes + tags (at most
    ``top_k`` of them, highest first, when given)."""
    rounded = [round(float(p), 6) for p in probs]
    chosen = [i for i, p in enumerate(rounded) if p >= thresholds[i]]
    chosen.sort(key=lambda i: (-rounded[i], i))
    if top_k is not None:
        chosen = chosen[:top_k]
    return {
        "path": rel_path,
        "scores": {c: p for c, p in zip(classes, rounded, strict=True)},
        "tags": [classes[i] for i in chosen],
    }


# --------------------------------------------------------------------------------------------------------
class OutputConflictError(ValueError):
    """An existing output cannot be reused as asked (e.g. the run file was written for other classes)."""


def is_csv(path: str | Path) -> bool:
    """True when the run file is CSV (its name ends in .csv), else it is JSON Lines."""
    return Path(path).suffix.lower() == ".csv"


def read_run_file(path: Path, separator: str = DEFAULT_SEPARATOR) -> dict[str, dict[str, Any]]:
    """Records of an existing run file (JSONL or CSV) by relative path; ``{}`` when it does not exist.
    Raises :class:`OutputConflictError` when it cannot be parsed."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    try:
        return _read_csv(text, separator) if is_csv(path) else _read_jsonl(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise OutputConflictError(f"cannot read the existing run file {path}: {exc}") from None


def _read_jsonl(text: str) -> dict[str, dict[str, Any]]:
    records = {}
    for line in text.splitlines():
        if line.strip():
            rec = json.loads(line)
            if "scores" in rec:
                records[str(rec["path"])] = {"path": rec["path"], "scores": rec["scores"], "tags": list(rec["tags"])}
    return records


def _read_csv(text: str, separator: str) -> dict[str, dict[str, Any]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        return {}
    header, body = rows[0], rows[1:]
    if header[:2] != ["path", "tags"]:
        raise ValueError(f"expected columns path, tags, <classes>; got {', '.join(header[:3])}")
    classes = header[2:]
    return {
        row[0]: {
            "path": row[0],
            "scores": {c: float(v) for c, v in zip(classes, row[2:], strict=True)},
            "tags": split_tags(row[1], separator),
        }
        for row in body
    }


def write_run_file(path: Path, records: Iterable[dict[str, Any]], classes: Sequence[str], separator: str) -> None:
    """Write records (sorted by path) to ``path`` atomically as CSV or JSONL (see the module docstring)."""
    ordered = sorted(records, key=lambda r: r["path"])
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        if is_csv(path):
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["path", "tags", *classes])
            for rec in ordered:
                writer.writerow([rec["path"], separator.join(rec["tags"]), *(rec["scores"][c] for c in classes)])
        else:
            for rec in ordered:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def default_errors_path(output: str | Path) -> Path:
    """``out/tags.jsonl`` -> ``out/tags.errors.tsv``."""
    output = Path(output)
    return output.with_name(output.stem + ".errors.tsv")


def write_errors(path: Path, failed: Sequence[tuple[str, str]]) -> None:
    """Write ``path<TAB>reason`` lines atomically (tabs and newlines inside a field become spaces)."""

    def clean(text: str) -> str:
        return " ".join(text.replace("\t", " ").splitlines())

    atomic_write_text(path, "".join(f"{clean(p)}\t{clean(r)}\n" for p, r in failed))


def split_tags(text: str, separator: str) -> list[str]:
    """Tags of a sidecar's text (split on the separator, surrounding whitespace dropped, empties removed)."""
    sep = separator.strip() or separator
    return [t.strip() for t in text.replace("\r\n", "\n").split(sep) if t.strip()]


def journal_path(output: str | Path) -> Path:
    """``out/tags.jsonl`` -> ``out/tags.jsonl.partial``: the records of a run in progress (see :class:`Journal`)."""
    output = Path(output)
    return output.with_name(output.name + ".partial")


def read_journal(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(records by path, errors by path) of a journal left by an interrupted run; ``({}, {})`` when there is
    none. A line cut short by the interruption is ignored (its image is tagged again)."""
    records: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    if not path.is_file():
        return records, errors
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "scores" in rec:
            records[str(rec["path"])] = rec
        elif isinstance(rec, dict) and "error" in rec:
            errors[str(rec["path"])] = str(rec["error"])
    return records, errors


class Journal:
    """Append-only JSON Lines log of a run in progress: records and ``{"path", "error"}`` lines, flushed after
    every batch, so an interrupted run resumes from it (``--existing skip``) and the run file itself is only
    ever written whole, atomically."""

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not fresh and path.is_file():  # drop a line cut short by the interruption
            text = path.read_text(encoding="utf-8")
            if text and not text.endswith("\n"):
                atomic_write_text(path, text[: text.rfind("\n") + 1])
        self._fh = open(path, "w" if fresh else "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, records: Iterable[dict[str, Any]], failed: Iterable[tuple[str, str]] = ()) -> None:
        """Append records and (path, reason) failures, then flush them to the operating system."""
        lines = [json.dumps(r, ensure_ascii=False) for r in records]
        lines += [json.dumps({"path": p, "error": e}, ensure_ascii=False) for p, e in failed]
        self._fh.write("".join(line + "\n" for line in lines))
        self._fh.flush()

    def close(self, remove: bool) -> None:
        """Close the file; ``remove`` deletes it (the run file and errors file now hold everything)."""
        self._fh.close()
        if remove:
            self.path.unlink(missing_ok=True)
