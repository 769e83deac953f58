"""Which classes become an image's tags: the modes of :data:`MODES` (``thresholds``, ``mcut``, ``top-k:K``) with a cap
and a floor, highest score first, on scores rounded as the run file stores them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.registry import Row, Table

DEFAULT_MODE = "thresholds"
#: Decimals of a stored score (run files, sidecars): selection works on the rounded values.
SCORE_DECIMALS = 6


@dataclass(frozen=True)
class Selection:
    """A selection mode (:data:`MODES`) with ``k`` for ``top-k``, and ``max_tags`` / ``min_score`` limits."""

    mode: str = DEFAULT_MODE
    k: int | None = None
    max_tags: int | None = None
    min_score: float = 0.0

    def __post_init__(self) -> None:
        MODES.row(self.mode)  # an unknown mode: the one message listing them
        if (self.mode == "top-k") != (self.k is not None):
            raise ValueError("top-k needs K (top-k:K) and only top-k takes K")
        if self.k is not None and self.k < 1:
            raise ValueError(f"top-k needs K >= 1, got {self.k}")
        if self.max_tags is not None and self.max_tags < 1:
            raise ValueError(f"the cap on tags per image must be >= 1, got {self.max_tags}")
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"the minimum score must be in [0, 1], got {self.min_score}")

    @property
    def uses_thresholds(self) -> bool:
        """True when the per-class thresholds decide (``thresholds`` mode)."""
        return self.mode == "thresholds"

    def describe(self) -> str:
        """A short human description, e.g. ``mcut, at most 10 tags, score >= 0.1``."""
        text = f"top-{self.k}" if self.mode == "top-k" else self.mode
        if self.max_tags is not None:
            text += f", at most {self.max_tags} tags"
        if self.min_score > 0:
            text += f", score >= {self.min_score:g}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (recorded with a run's outputs); :func:`selection_from_dict` reads it back."""
        return {"mode": self.mode, "k": self.k, "max_tags": self.max_tags, "min_score": self.min_score}


def selection_from_dict(doc: dict[str, Any]) -> Selection:
    """The :class:`Selection` of :meth:`Selection.to_dict` (``ValueError`` on a bad document)."""
    try:
        return Selection(str(doc["mode"]), doc.get("k"), doc.get("max_tags"), float(doc.get("min_score", 0.0)))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a tag selection: {doc!r}") from exc


def parse_mode(text: str) -> tuple[str, int | None]:
    """``thresholds`` | ``mcut`` | ``top-k:K`` -> ``(mode, K or None)``; ``ValueError`` naming the forms."""
    word = text.strip().lower()
    if word in ("thresholds", "mcut"):
        return word, None
    name, _, value = word.partition(":")
    if name in ("top-k", "topk") and value.isdigit() and int(value) >= 1:
        return "top-k", int(value)
    raise ValueError(f"invalid selection mode {text!r}: use thresholds, mcut or top-k:K (K >= 1)")


def selection_type(text: str) -> tuple[str, int | None]:
    """argparse ``type=`` for a mode option: :func:`parse_mode`, a usage error otherwise."""
    try:
        return parse_mode(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def make_selection(mode: str = DEFAULT_MODE, max_tags: int | None = None, min_score: float | None = None) -> Selection:
    """A :class:`Selection` from a mode text (:func:`parse_mode`) and the optional limits."""
    name, k = parse_mode(mode)
    return Selection(name, k, max_tags, 0.0 if min_score is None else float(min_score))


def rounded_scores(probs: np.ndarray) -> np.ndarray:
    """Probabilities as stored: float64 rounded to :data:`SCORE_DECIMALS` decimals."""
    return np.round(np.asarray(probs, dtype=np.float64), SCORE_DECIMALS)


def mcut_threshold(scores: np.ndarray) -> float:
    """The MCut threshold of a score row: the midpoint of its largest gap (1.0 with fewer than two scores)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    if ordered.size < 2:
        return 1.0
    gaps = ordered[:-1] - ordered[1:]
    cut = int(np.argmax(gaps))
    return float((ordered[cut] + ordered[cut + 1]) / 2.0)


Chooser = Callable[[np.ndarray, list[int], "np.ndarray | None", Selection], list[int]]


def _by_thresholds(scores: np.ndarray, order: list[int], thresholds: np.ndarray | None,
                   selection: Selection) -> list[int]:
    if thresholds is None:
        raise ValueError("the thresholds mode needs per-class thresholds")
    return [i for i in order if scores[i] >= thresholds[i]]


def _by_mcut(scores: np.ndarray, order: list[int], thresholds: np.ndarray | None, selection: Selection) -> list[int]:
    cut = mcut_threshold(scores)
    return [i for i in order if scores[i] > cut]


def _top_k(scores: np.ndarray, order: list[int], thresholds: np.ndarray | None, selection: Selection) -> list[int]:
    return order[: selection.k]


#: The selection modes: name, help, and how it chooses from an image's rounded scores and their order.
MODES: Table[Chooser] = Table("selection mode", [
    Row("thresholds", "every class whose score reaches its threshold (calibrated per class, or given)",
        _by_thresholds),
    Row("mcut", "MCut: the classes above the largest gap between neighbouring sorted scores", _by_mcut),
    Row("top-k", "the K highest scores (top-k:K)", _top_k),
])


def select_classes(probs: np.ndarray, thresholds: np.ndarray | None, selection: Selection) -> list[int]:
    """Indices of the classes selected for one image, highest score first; ``thresholds`` only for that mode."""
    scores = rounded_scores(probs)
    order = sorted(range(scores.size), key=lambda i: (-scores[i], i))
    chosen = MODES[selection.mode](scores, order, thresholds, selection)
    chosen = [i for i in chosen if scores[i] >= selection.min_score]
    return chosen if selection.max_tags is None else chosen[: selection.max_tags]
