"""The answer tabs' state, without gradio: :class:`ReviewQueue` holds a review file's pairs, their answers (the last
word wins) and those still to show. Every answer is in the log before the call returns; one queue serves every browser
tab under a lock, and a second demo on the same log is refused (:func:`claim_log`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from PIL import Image, ImageOps

from models.data.review_file import AnswerLog, ReviewItem, final_answers, read_review, write_review
from models.data.types import DataError

__all__ = ["ImageView", "ReviewQueue", "ReviewView", "claim_log", "default_log_path", "display_image", "load_review"]

Pair = tuple[str, str]
#: Missing images named in the error (the rest are counted).
MISSING_SHOWN = 3
#: The longest side of the image shown, in pixels.
DISPLAY_SIDE = 768


def default_log_path(review_path: str | Path) -> Path:
    """Where the answers to ``review_path`` go by default: beside it, ``review.csv`` -> ``review.answers.jsonl``."""
    return Path(review_path).with_suffix(".answers.jsonl")


def image_path(image: str, folder: Path) -> Path:
    """The file of a review file's ``image``: absolute, or relative to ``folder`` (the review file's)."""
    path = Path(image)
    return path if path.is_absolute() else folder / path


def load_review(review_path: str | Path) -> list[ReviewItem]:
    """The rows of a review file, checked: readable, not empty, every image a file (``DataError``)."""
    review_path = Path(review_path)
    items = read_review(review_path)
    if not items:
        raise DataError(f"{review_path}: no suggestions in it (expected rows of image,label[,score,given,answer])")
    missing = list(dict.fromkeys(i.image for i in items if not image_path(i.image, review_path.parent).is_file()))
    if missing:
        more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
        shown = ", ".join(missing[:MISSING_SHOWN])
        raise DataError(f"{review_path}: {len(missing)} image(s) not found: {shown}{more}")
    return items


def claim_log(path: str | Path) -> IO[str]:
    """Lock the answer log ``path`` for this process (``DataError`` when another holds it); keep the returned file
    open."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the server's lifetime
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DataError(f"{path}: another demo is reviewing into this answer log; stop it or pass --answers") from None
    return handle


def display_image(path: str | Path, side: int = DISPLAY_SIDE) -> tuple[Image.Image | None, str]:
    """The image as shown (RGB, EXIF-oriented, at most ``side`` px) and "", or ``(None, reason)``."""
    try:
        with Image.open(path) as img:
            img.draft("RGB", (side, side))
            shown = ImageOps.exif_transpose(img).convert("RGB")
        shown.thumbnail((side, side))
        return shown, ""
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        return None, f"cannot show {Path(path).name}: {exc}"


@dataclass(frozen=True)
class ReviewView:
    """What the tab shows: the pair to answer (None when done), the image's labels and answers, counts, a note."""

    item: ReviewItem | None
    others: tuple[ReviewItem, ...]
    answered_labels: tuple[tuple[str, bool], ...]
    answered: int
    total: int
    yes: int
    no: int
    note: str = ""
    status: str = ""  # the rounds' (:mod:`serve.demo.review_rounds`)

    @property
    def done(self) -> bool:
        """Every pair of the file is answered."""
        return self.answered == self.total

    def progress(self) -> str:
        """``N of M answered (Y yes, X no)``, then the rounds' status."""
        status = f" · {self.status}" if self.status else ""
        return f"{self.answered} of {self.total} answered ({self.yes} yes, {self.no} no){status}"


@dataclass(frozen=True)
class ImageView:
    """What the image-at-a-time tab shows: the image (None when done), its labels, counts and a note."""

    image: str | None
    pending: tuple[ReviewItem, ...]
    given: tuple[str, ...]
    answered_labels: tuple[tuple[str, bool], ...]
    images_done: int
    images_total: int
    note: str = ""
    status: str = ""

    def progress(self) -> str:
        """``N of M images answered``, then the rounds' status."""
        status = f" · {self.status}" if self.status else ""
        return f"{self.images_done} of {self.images_total} images answered{status}"


class ReviewQueue:
    """A review file's pairs, answers and order still to show, logged first; one queue serves every tab."""

    def __init__(self, items: list[ReviewItem], log: AnswerLog, source: Path | None = None) -> None:
        self.log = log
        self.source = source  # the review file, whose folder relative image paths start from
        first: dict[Pair, ReviewItem] = {}
        for item in items:  # a pair listed twice is shown once, where it first appears (the file is ranked)
            first.setdefault((item.image, item.label), item)
        self.items = first
        self.by_image = self._by_image()
        logged = read_review(log.path) if log.path.is_file() else []
        known = final_answers([*items, *logged])  # the file's answers, then the log's: the last row wins
        self.from_file = len(final_answers(items))  # answers filled in the review file itself
        self.answers: dict[Pair, bool] = {pair: known[pair] for pair in first if pair in known}
        self.pending: list[Pair] = [pair for pair in first if pair not in self.answers]
        # this session's answers, each [(pair, its answer before), ...] (one pair, or a whole image)
        self.history: list[list[tuple[Pair, bool | None]]] = []
        self.lock = threading.RLock()  # re-entered: an image answer returns the next image's view
        self.held: IO[str] | None = None  # the answer log's lock (:meth:`open` with ``claim``)
        self.per_image: int | None = None  # the most labels of an image shown (and answered) at once
        self.on_answers: Callable[[int], None] | None = None  # told how many pairs were answered, under the lock
        self.status = ""  # a line after the progress (the rounds')

    def _by_image(self) -> dict[str, list[Pair]]:
        by_image: dict[str, list[Pair]] = {}
        for pair in self.items:
            by_image.setdefault(pair[0], []).append(pair)
        return by_image

    @classmethod
    def open(cls, review_path: str | Path, log_path: str | Path | None = None, claim: bool = False) -> ReviewQueue:
        """The queue of a review file with its answer log (locked with ``claim``); ``DataError`` if bad or in use."""
        review_path = Path(review_path)
        log_path = Path(log_path) if log_path is not None else default_log_path(review_path)
        if log_path.resolve() == review_path.resolve():
            raise DataError(f"{log_path}: the answer log must not be the review file itself")
        items = load_review(review_path)
        held = claim_log(log_path) if claim else None
        try:
            queue = cls(items, AnswerLog(log_path), review_path)
        except BaseException:
            if held is not None:
                held.close()
            raise
        queue.held = held
        return queue

    def close(self) -> None:
        """Let go of the answer log's lock, if this queue holds it."""
        if self.held is not None:
            self.held.close()
            self.held = None

    def image_file(self, image: str) -> Path:
        """The file to show for ``image`` (a relative path starts at the review file's folder)."""
        return image_path(image, self.source.parent if self.source is not None else Path.cwd())

    def _view(self, note: str = "") -> ReviewView:
        item = self.items[self.pending[0]] if self.pending else None
        others: tuple[ReviewItem, ...] = ()
        answered: tuple[tuple[str, bool], ...] = ()
        if item is not None:
            pairs = self.by_image[item.image]
            waiting = set(self.pending)
            others = tuple(self.items[p] for p in pairs if p in waiting and p != self.pending[0])
            answered = tuple((p[1], self.answers[p]) for p in pairs if p in self.answers)
        yes = sum(self.answers.values())
        return ReviewView(item, others, answered, len(self.answers), len(self.items), yes, len(self.answers) - yes,
                          note, self.status)

    def view(self, note: str = "") -> ReviewView:
        """The current view (the first pending pair)."""
        with self.lock:
            return self._view(note)

    def _set(self, answers: list[tuple[Pair, bool | None]]) -> None:
        """Record ``answers`` in the log (one synced write), then in memory; None puts a pair back in front."""
        self.log.record_many([(image, label, answer) for (image, label), answer in answers])
        undone = []
        for pair, answer in answers:
            with contextlib.suppress(ValueError):
                self.pending.remove(pair)
            if answer is None:
                self.answers.pop(pair, None)
                undone.append(pair)
            else:
                self.answers[pair] = answer
        self.pending[:0] = undone
        given = sum(answer is not None for _, answer in answers)
        if given and self.on_answers is not None:
            self.on_answers(given)

    def rerank(self, items: list[ReviewItem], total: int = 0) -> None:
        """A new round's ranking: the pending pairs become those of ``items`` in their order, less every pair
        answered by now (answers and history stay), after the pending pairs of the image on screen (the first
        pending pair's, so a page answers what it shows), the last cut so that the file holds ``total`` pairs (0:
        no cut); the review file is rewritten as the answered items, then the pending ones."""
        with self.lock:
            answered = {pair: item for pair, item in self.items.items() if pair in self.answers}
            shown = [p for p in self.pending if p[0] == self.pending[0][0]] if self.pending else []
            fresh = {pair: self.items[pair] for pair in shown}
            for item in items:
                if (item.image, item.label) not in self.answers:
                    fresh.setdefault((item.image, item.label), item)
            if total:
                fresh = dict(list(fresh.items())[:max(len(shown), total - len(answered))])
            self.items = {**answered, **fresh}
            self.pending = list(fresh)
            self.by_image = self._by_image()
            if self.source is not None:
                write_review(self.source, self.items.values())

    def answer(self, image: str, label: str, present: bool) -> ReviewView:
        """Answer the pair (logged on return) and show the next; ``KeyError`` for a pair not in the file."""
        pair = (image, label)
        if pair not in self.items:
            raise KeyError(f"{label!r} on {image} is not a suggestion of this review file")
        with self.lock:
            if self.answers.get(pair) == present:  # a second press before the page moved on: nothing new
                return self._view(f"{label}: already answered {'yes' if present else 'no'}")
            self.history.append([(pair, self.answers.get(pair))])
            self._set([(pair, bool(present))])
            return self._view(f"{label}: {'yes' if present else 'no'}")

    def skip(self, image: str, label: str) -> ReviewView:
        """Leave the pair unanswered for now: it comes back after the end of the list."""
        pair = (image, label)
        with self.lock:
            if pair not in self.pending:
                return self._view()
            self.pending.remove(pair)
            self.pending.append(pair)
            note = f"{label}: skipped, it comes back after the end of the list"
            return self._view(note if len(self.pending) > 1 else f"{label}: skipped, the last one left")

    def undo(self) -> ReviewView:
        """Take back this session's last answer and show that pair again; repeatable."""
        with self.lock:
            if not self.history:
                return self._view("nothing to undo in this session")
            taken = self.history.pop()
            self._set(taken)  # unanswered again: in front of the pending pairs
            if len(taken) == 1:
                return self._view(f"{taken[0][0][1]}: answer taken back")
            return self._view(f"{Path(taken[0][0][0]).name}: its {len(taken)} answers taken back")

    def image_view(self, note: str = "") -> ImageView:
        """The current image (the one of the first pending pair) with its :attr:`per_image` most likely pending
        labels."""
        with self.lock:
            waiting = {p[0] for p in self.pending}
            done = sum(1 for image in self.by_image if image not in waiting)
            if not self.pending:
                return ImageView(None, (), (), (), done, len(self.by_image), note, self.status)
            image = self.pending[0][0]
            pairs = self.by_image[image]
            answered = tuple((p[1], self.answers[p]) for p in pairs if p in self.answers)
            given = next((self.items[p].given for p in pairs if self.items[p].given), ())
            shown = tuple(self._image_pairs(image)[:self.per_image])
            return ImageView(image, shown, given, answered, done, len(self.by_image), note, self.status)

    def _image_pairs(self, image: str) -> list[ReviewItem]:
        """The pending pairs of ``image``, the most likely first (by score; file order among equal scores)."""
        waiting = set(self.pending)
        pairs = [self.items[p] for p in self.by_image.get(image, []) if p in waiting]
        return sorted(pairs, key=lambda item: -(item.score if item.score is not None else -1.0))

    def answer_image(self, image: str, present: Collection[str], asked: Collection[str] | None = None) -> ImageView:
        """Answer the pending pairs of ``image`` that :meth:`image_view` shows, or its pending pairs in ``asked`` (yes
        for ``present``), in one write; ``KeyError`` for a label that is not a suggestion for it."""
        with self.lock:
            pairs, labels = self._image_pairs(image), {label for _, label in self.by_image.get(image, [])}
            # a label asked but answered since (in the Review tab) keeps that answer
            if asked is not None:
                labels &= set(asked)
            pending = [i.label for i in (pairs if asked is not None else pairs[:self.per_image]) if i.label in labels]
            unknown = set(present) - labels
            if unknown:
                raise KeyError(f"{', '.join(sorted(unknown))} on {image}: not a pending label of this image")
            if not pending:
                return self.image_view(f"{Path(image).name}: already answered")
            answers: list[tuple[Pair, bool | None]] = [((image, label), label in present) for label in pending]
            self.history.append([(pair, self.answers.get(pair)) for pair, _ in answers])
            self._set(answers)
            yes = sum(1 for _, answer in answers if answer)
            return self.image_view(f"{Path(image).name}: {yes} yes, {len(answers) - yes} no")

    def skip_image(self, image: str) -> ImageView:
        """Leave every pending pair of ``image`` for later: they come back after the end of the list."""
        with self.lock:
            pairs = [p for p in self.pending if p[0] == image]
            self.pending = [p for p in self.pending if p[0] != image] + pairs
            return self.image_view(f"{Path(image).name}: skipped, it comes back after the end of the list"
                                   if pairs else "")
