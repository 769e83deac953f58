"""Output records ``{"path", "scores", "tags"}`` (scores rounded to 6 decimals) and the files they go to, written
atomically: the run file (JSON Lines or CSV) and the errors file (``path<TAB>reason``)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.files.atomic_writes import atomic_path, atomic_write_text
from serve.outputs.caption_rules import CaptionRules
from serve.outputs.selection_modes import Selection, rounded_scores, select_classes

DEFAULT_SEPARATOR = ", "


@dataclass(frozen=True)
class Result:
    """What a tagging engine returns for one image: its sigmoid scores ``(C,)``, or why it was unusable."""

    key: str
    scores: np.ndarray | None
    error: str | None = None


def tag_record(rel_path: str, probs: np.ndarray, classes: list[str], thresholds: np.ndarray | None = None,
               selection: Selection | None = None, rules: CaptionRules | None = None) -> dict[str, Any]:
    """One output record from a probability row ``(C,)``: the rounded scores and the tags ``selection`` chooses from
    them, highest first, written with the caption ``rules``."""
    scores = rounded_scores(probs)
    chosen = select_classes(scores, thresholds, selection or Selection())
    names = [classes[i] for i in chosen]
    return {
        "path": rel_path,
        "scores": dict(zip(classes, scores.tolist(), strict=True)),
        "tags": rules.apply(names, [float(scores[i]) for i in chosen]) if rules is not None else names}


class OutputConflictError(ValueError):
    """An existing output cannot be reused as asked (e.g. the run file was written for other classes)."""


def is_csv(path: str | Path) -> bool:
    """True when the run file is CSV (its name ends in .csv), else it is JSON Lines."""
    return Path(path).suffix.lower() == ".csv"


def iter_run_file(path: Path, separator: str = DEFAULT_SEPARATOR) -> Iterator[dict[str, Any]]:
    """An existing run file's records, streamed (none if absent); :class:`OutputConflictError` if unparsable."""
    if not path.is_file():
        return
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            yield from (_csv_records(fh, separator) if is_csv(path) else _jsonl_records(fh))
    except (ValueError, KeyError, TypeError) as exc:
        raise OutputConflictError(f"cannot read the existing run file {path}: {exc}") from None


def _jsonl_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            if "scores" in rec:
                yield {"path": str(rec["path"]), "scores": rec["scores"], "tags": list(rec["tags"])}


def _csv_records(lines: Iterable[str], separator: str) -> Iterator[dict[str, Any]]:
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None:
        return
    if header[:2] != ["path", "tags"]:
        raise ValueError(f"expected columns path, tags, <classes>; got {', '.join(header[:3])}")
    classes = header[2:]
    for row in rows:
        yield {
            "path": row[0],
            "scores": {c: float(v) for c, v in zip(classes, row[2:], strict=True)},
            "tags": split_tags(row[1], separator)}


def write_run_file(path: Path, records: Iterable[dict[str, Any]], classes: Sequence[str], separator: str) -> None:
    """Write records, in the order given, to ``path`` atomically as CSV or JSONL, streamed."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        if is_csv(path):
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["path", "tags", *classes])
            for rec in records:
                writer.writerow([rec["path"], separator.join(rec["tags"]), *(rec["scores"][c] for c in classes)])
        else:
            for rec in records:
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
