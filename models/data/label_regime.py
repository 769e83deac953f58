"""The label regime of each split (docs/your-data.md): ``single-positive``, ``full`` or ``partial``; ``declared`` is
``auto`` or a regime, for all or per split, and a declaration the matrix contradicts is a ``ValueError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DECLARABLE", "NOT_AVAILABLE", "REGIMES", "SPLITS", "LabelRegime", "describe_regimes", "detect_regime",
    "detect_regimes", "parse_declarations", "parse_declared"]

FULL, SINGLE, PARTIAL = "full", "single-positive", "partial"
REGIMES = (FULL, SINGLE, PARTIAL)
DECLARABLE = ("auto", *REGIMES)
#: What a figure that needs full labels shows on a split without them.
NOT_AVAILABLE = "n/a (no full labels)"
_ALIASES = {"single": SINGLE, "single-positive": SINGLE, "full": FULL, "partial": PARTIAL, "auto": "auto"}


@dataclass(frozen=True)
class LabelRegime:
    """The labels of one split: regime, how it was decided, images, positives per image, known negatives."""

    split: str
    kind: str
    source: str
    images: int
    positives_per_image: float
    max_positives: int
    negatives: int = 0

    @property
    def full(self) -> bool:
        """True when the split's labels are complete: figures that need full labels may be computed on it."""
        return self.kind == FULL

    def describe(self) -> str:
        """One phrase, e.g. ``val single-positive (400 images, 1.00 positive/image, detected)``."""
        negatives = f"{self.negatives} known negatives, " if self.negatives else ""
        return (f"{self.split} {self.kind} ({self.images} images, {self.positives_per_image:.2f} positives/image, "
                f"{negatives}{self.source})")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for config.json)."""
        return {"kind": self.kind, "source": self.source, "images": self.images,
                "positives_per_image": round(self.positives_per_image, 4), "max_positives": self.max_positives,
                "known_negatives": self.negatives}


def parse_declared(text: str) -> str:
    """A regime word -> its canonical name; ``ValueError`` listing the accepted words."""
    word = text.strip().lower()
    if word not in _ALIASES:
        raise ValueError(f"unknown label regime {text!r}: use {', '.join(DECLARABLE)}")
    return _ALIASES[word]


SPLITS = ("train", "val", "test")


def parse_declarations(text: str) -> dict[str, str]:
    """``--labels`` (one regime, or ``SPLIT=REGIME`` pairs) -> the declared regimes of train, val, test."""
    text = text.strip()
    if "=" not in text:
        word = parse_declared(text)
        return dict.fromkeys(SPLITS, word)
    out = dict.fromkeys(SPLITS, "auto")
    for part in filter(None, (p.strip() for p in text.split(","))):
        split, _, word = part.partition("=")
        split = split.strip().lower()
        if split not in SPLITS:
            raise ValueError(f"--labels {text!r}: unknown split {split!r} (use {', '.join(SPLITS)})")
        out[split] = parse_declared(word)
    return out


def detect_regime(labels: np.ndarray, split: str, declared: str = "auto", complete: bool = True) -> LabelRegime:
    """The :class:`LabelRegime` of one split's labels; ``complete``: the dataset declares them complete."""
    matrix = np.asarray(labels)
    if matrix.ndim != 2:
        raise ValueError(f"{split} labels must be a 2-D (N, C) matrix, got shape {matrix.shape}")
    per_image = (matrix > 0).sum(1)
    most = int(per_image.max()) if len(per_image) else 0
    mean = float(per_image.mean()) if len(per_image) else 0.0
    kind = parse_declared(declared)
    if kind == "auto":
        kind, source = (SINGLE if most <= 1 else FULL if complete else PARTIAL), "detected"
    else:
        source = "declared"
        if kind == SINGLE and most > 1:
            raise ValueError(f"{split} labels were declared single-positive, but an image has {most} positives")
    return LabelRegime(split, kind, source, len(per_image), mean, most)


def detect_regimes(labels_by_split: dict[str, np.ndarray | None], declared: str = "auto",
                   complete: tuple[str, ...] = SPLITS) -> dict[str, LabelRegime]:
    """:func:`detect_regime` of every split present, in order, with their annotated labels (not the sampled observed
    ones); ``declared`` as ``--labels`` takes it, ``complete`` the splits the dataset declares complete."""
    words = parse_declarations(declared)
    return {split: detect_regime(labels, split, words.get(split, "auto"), split in complete)
            for split, labels in labels_by_split.items() if labels is not None and len(labels) > 0}


def describe_regimes(regimes: dict[str, LabelRegime]) -> str:
    """The start-of-run ``labels: ...`` line, with a note when val has no full labels."""
    line = "labels: " + "; ".join(regime.describe() for regime in regimes.values())
    val = regimes.get("val")
    if val is not None and not val.full:
        line += f". val has no full labels: figures that need them read {NOT_AVAILABLE}"
    return line
