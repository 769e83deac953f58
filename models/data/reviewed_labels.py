"""A run's labels with the review answers (``--review FILE``; docs/label-review.md): ``yes`` an observed positive,
``no`` a known negative, on training and validation images; pairs that do not apply are counted and left out. A
reviewed validation split is partial (never full), so its epochs are still selected label-free."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from models.data.protocol import ProtocolSplits
from models.data.review_file import final_answers, read_review
from models.data.types import LabelledImages
from models.files.digest import file_sha256

__all__ = ["ReviewCounts", "apply_answers", "apply_review"]


@dataclass(frozen=True)
class ReviewCounts:
    """What answers did: confirmed positives, known negatives, and the pairs left out (by reason)."""

    confirmed: int = 0
    rejected: int = 0
    other_images: int = 0
    unknown_labels: int = 0
    unchanged: int = 0

    def __add__(self, other: ReviewCounts) -> ReviewCounts:
        return ReviewCounts(**{k: v + getattr(other, k) for k, v in self.__dict__.items()})

    def to_dict(self) -> dict[str, int]:
        """As a JSON-able dict."""
        return dict(self.__dict__)

    def describe(self) -> str:
        """One phrase: ``372 confirmed, 128 rejected (3 pairs of other images left out)``."""
        left = [f"{n} {what}" for n, what in ((self.other_images, "pairs of images outside train and val"),
                                             (self.unknown_labels, "pairs of unknown labels"),
                                             (self.unchanged, "answers the labels already held")) if n]
        return f"{self.confirmed} confirmed, {self.rejected} rejected" + (f" ({'; '.join(left)} left out)"
                                                                           if left else "")


def apply_answers(observed: np.ndarray, paths: list[Path] | list[str], classes: list[str],
                  answers: dict[tuple[str, str], bool]) -> tuple[np.ndarray, ReviewCounts]:
    """``observed`` with the answers applied (``yes`` -> 1, ``no`` -> -1) and what was done."""
    out = np.array(observed, dtype=np.int8, copy=True)
    row_of = {str(p): i for i, p in enumerate(paths)}
    column_of = {c: j for j, c in enumerate(classes)}
    counts = dict.fromkeys(("confirmed", "rejected", "other_images", "unknown_labels", "unchanged"), 0)
    for (image, label), answer in answers.items():
        if label not in column_of:
            counts["unknown_labels"] += 1
        elif image not in row_of:
            counts["other_images"] += 1
        elif out[row_of[image], column_of[label]] == (1 if answer else -1):
            counts["unchanged"] += 1
        else:
            out[row_of[image], column_of[label]] = 1 if answer else -1
            counts["confirmed" if answer else "rejected"] += 1
    return out, ReviewCounts(**counts)


def _as_given(images: LabelledImages, observed: np.ndarray) -> LabelledImages:
    """``images`` whose labels as given are the reviewed observed ones (a user's own data)."""
    return LabelledImages(images.paths, (observed > 0).astype(np.uint8), images.classes,
                          (observed < 0).astype(np.uint8) if (observed < 0).any() else None)


def apply_review(protocol: ProtocolSplits, files: list[str] | tuple[str, ...]) -> tuple[ProtocolSplits, dict]:
    """``protocol`` with the answers of the review ``files`` (later files win on a pair) applied to its training and
    validation images (module docstring), and the record a run keeps: the files with their sha256 and the counts."""
    if not files:
        return protocol, {}
    items = [item for path in files for item in read_review(path)]
    answers = final_answers(items)
    classes = list(protocol.classes)
    training_images = {str(p) for p in protocol.train.paths}
    train_answers = {pair: a for pair, a in answers.items() if pair[0] in training_images}
    rest = {pair: a for pair, a in answers.items() if pair not in train_answers}
    train_observed, train_counts = apply_answers(protocol.train_observed, protocol.train.paths, classes,
                                                 train_answers)
    val_observed = (protocol.val_observed if protocol.val_observed is not None
                    else protocol.val.labels.astype(np.int8))
    val_observed, rest_counts = apply_answers(val_observed, protocol.val.paths, classes, rest)
    counts = train_counts + rest_counts
    reviewed = replace(protocol, train_observed=train_observed, val_observed=val_observed)
    if "train" not in protocol.complete_splits:
        reviewed = replace(reviewed, train=_as_given(protocol.train, train_observed))
    val_used = "val" not in protocol.complete_splits or protocol.observed.val == "observed"  # else: full labels
    if val_used:  # its answers are in the labels the run selects by: no longer complete
        reviewed = replace(reviewed, val=_as_given(protocol.val, val_observed),
                           complete_splits=tuple(s for s in protocol.complete_splits if s != "val"))
    full, kind = reviewed.has_full_labels("val"), reviewed.regimes["val"].kind
    val = {"confirmed": rest_counts.confirmed, "rejected": rest_counts.rejected, "labels": kind,
           "selection": "by the val labels" if full else "label-free"}
    said = ("val has full labels, so these change nothing" if not val_used else f"val stays {kind}"
            + ("" if full else ", never full, so selection stays label-free"))
    record = {"files": [{"path": str(Path(p).resolve()), "sha256": file_sha256(p)} for p in files],
              "answered_pairs": len(answers), **counts.to_dict(), "val": val, "describe": counts.describe() + (
                  f" (on validation images: {val['confirmed']} confirmed, {val['rejected']} rejected; {said})"
                  if val["confirmed"] or val["rejected"] else "")}
    return reviewed, record
