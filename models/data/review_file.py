"""Label review files (docs/label-review.md): (image, label) pairs in CSV or JSONL with an optional ``answer`` (``yes``,
``no``, empty); the last row of a pair wins. Problems raise ``DataError`` with ``file:line: message``."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from models.data.types import DataError
from models.files.atomic_writes import atomic_write_text

__all__ = ["ANSWER_WORDS", "AnswerLog", "ReviewItem", "final_answers", "parse_answer", "read_review",
           "write_review"]

YES, NO = "yes", "no"
#: The answer words read (lower-cased) and what they mean.
ANSWER_WORDS: dict[str, bool] = {**dict.fromkeys(("yes", "y", "1", "true", "accept", "accepted", "+"), True),
                                 **dict.fromkeys(("no", "n", "0", "false", "reject", "rejected", "-"), False)}
COLUMNS = ("image", "label", "score", "given", "answer")
GIVEN_SEPARATOR = ";"


@dataclass(frozen=True)
class ReviewItem:
    """One (image, label) pair of a review file: its score, the image's labels, its answer (True/False/None)."""

    image: str
    label: str
    score: float | None = None
    answer: bool | None = None
    given: tuple[str, ...] = ()


def parse_answer(value: object, where: str) -> bool | None:
    """An answer cell as True / False / None (empty); an unknown word is a ``DataError`` naming ``where``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in ANSWER_WORDS:
        raise DataError(f"{where}: answer {value!r} is neither yes nor no (or empty for not answered)")
    return ANSWER_WORDS[word]


def _score(value: object, where: str) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DataError(f"{where}: score {value!r} is not a number") from None


def _given(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(v.strip() for v in str(value or "").split(GIVEN_SEPARATOR) if v.strip())


def _item(row: dict[str, object], where: str) -> ReviewItem:
    image, label = row.get("image"), row.get("label")
    if not isinstance(image, str) or not image.strip():
        raise DataError(f"{where}: the image is empty")
    if not isinstance(label, str) or not label.strip():
        raise DataError(f"{where}: the label is empty")
    return ReviewItem(image.strip(), label.strip(), _score(row.get("score"), where),
                      parse_answer(row.get("answer"), where), _given(row.get("given")))


def _read_jsonl(path: Path, text: str) -> list[ReviewItem]:
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(text.splitlines()) and not text.endswith("\n"):
                break  # a last line cut short by a kill while it was written: the answers before it stand
            raise DataError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: not a JSON object")
        items.append(_item(row, where))
    return items


def _read_csv(path: Path, text: str) -> list[ReviewItem]:
    rows = csv.reader(io.StringIO(text))
    header: dict[str, int] | None = None
    items = []
    for row in rows:
        number = rows.line_num
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = {cell.strip().lower(): i for i, cell in enumerate(row)}
            missing = [name for name in ("image", "label") if name not in header]
            if missing:
                raise DataError(f"{path}:{number}: the header lacks {', '.join(missing)} (expected "
                                f"'{','.join(COLUMNS)}')")
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        items.append(_item({name: row[i] for name, i in header.items()}, f"{path}:{number}"))
    if header is None:
        raise DataError(f"{path}: empty (expected a header '{','.join(COLUMNS)}')")
    return items


def read_review(path: str | Path) -> list[ReviewItem]:
    """The rows of a review file (CSV, or JSONL by its ``.jsonl`` suffix) in file order (module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{path}: no such review file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read it as UTF-8 text: {exc}") from None
    return _read_jsonl(path, text) if path.suffix.lower() == ".jsonl" else _read_csv(path, text)


def _answer_word(answer: bool | None) -> str:
    return "" if answer is None else (YES if answer else NO)


def write_review(path: str | Path, items: Iterable[ReviewItem]) -> None:
    """Write ``items`` as a review file (CSV, or JSONL by suffix), atomically."""
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        text = "".join(json.dumps({"image": i.image, "label": i.label, "score": i.score, "given": list(i.given),
                                   "answer": _answer_word(i.answer) or None}) + "\n" for i in items)
    else:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        for i in items:
            writer.writerow([i.image, i.label, "" if i.score is None else f"{i.score:.6f}",
                             GIVEN_SEPARATOR.join(i.given), _answer_word(i.answer)])
        text = out.getvalue()
    atomic_write_text(path, text)


def final_answers(items: Iterable[ReviewItem]) -> dict[tuple[str, str], bool]:
    """The answer of every answered pair: the last row of each pair wins (an unanswered last row: left out)."""
    last: dict[tuple[str, str], bool | None] = {}
    for item in items:
        last[(item.image, item.label)] = item.answer
    return {pair: answer for pair, answer in last.items() if answer is not None}


class AnswerLog:
    """An append-only JSONL answer log, each answer synced before :meth:`record` returns; a torn last line dropped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix.lower() != ".jsonl":
            raise DataError(f"{self.path}: an answer log is a .jsonl file")
        data = self.path.read_bytes() if self.path.is_file() else b""
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def read(self) -> dict[tuple[str, str], bool]:
        """The answers recorded so far (:func:`final_answers`); empty when the log does not exist yet."""
        return final_answers(read_review(self.path)) if self.path.is_file() else {}

    def record(self, image: str, label: str, answer: bool | None) -> None:
        """Append one answer (None: undo the pair's answer)."""
        self.record_many([(image, label, answer)])

    def record_many(self, answers: Iterable[tuple[str, str, bool | None]]) -> None:
        """Append answers ``(image, label, answer)`` in one write, synced once (an image answered at a time)."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        text = "".join(json.dumps({"image": image, "label": label, "answer": _answer_word(answer) or None,
                                   "time": now}) + "\n" for image, label, answer in answers)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
