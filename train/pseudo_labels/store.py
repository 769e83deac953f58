"""The pseudo-label file of a run (``RUN/pseudo_labels.npz``), also what ``--pseudo-labels FILE`` reads.

An ``.npz`` archive (``np.load(path)`` reads it; no pickles) with:

- ``format``: ``"spml-pseudo-labels/1"``; ``settings``: JSON text - the pseudo-labelling ``kind``
  (``whole-image``: VLPL's; ``image-and-grid``: AEVLP's), the ``clip`` model (``MODEL:PRETRAINED``), the ``prompt``
  template, the scoring settings (``temperature``, ``pre_resize``, ``grid_size``) and CLIP's input size, the
  selection settings that made ``positives`` (``threshold``, ``top_k``, ``eta``, ``negative_ratio``),
  ``observed_sha256`` (of the observed label matrix they were selected with) and ``images_sha256`` (of the image
  list);
- ``classes`` (C,) and ``prompts`` (C,): the class names and the texts CLIP read;
- ``paths`` (N,): the images, relative to the dataset's image root (as ``observed.npz`` names them);
- the scores (N, C) float32: ``global`` (the whole image's softmax over the classes) and, for ``image-and-grid``,
  ``crop_max``, ``crop_min``, ``crop_mean`` (over the grid of crops); ``readable`` (N,) bool (an unreadable image
  has zero scores and no pseudo-positive);
- ``positives`` (N, C) bool: the pseudo-positives as selected when the file was written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.files.atomic_writes import atomic_path

FILE_NAME = "pseudo_labels.npz"
FORMAT = "spml-pseudo-labels/1"
SCORE_NAMES = ("global", "crop_max", "crop_min", "crop_mean")


class PseudoLabelFileError(ValueError):
    """A pseudo-label file that cannot serve this run (the message names the file and what differs)."""


def images_digest(paths: Sequence[str]) -> str:
    """sha256 of the ``/``-separated relative image paths, one per line, in order."""
    return hashlib.sha256("\n".join(paths).encode("utf-8")).hexdigest()


def matrix_digest(matrix: np.ndarray) -> str:
    """sha256 of an int8 label matrix (its shape included)."""
    m = np.ascontiguousarray(matrix, dtype=np.int8)
    return hashlib.sha256(repr(m.shape).encode() + m.tobytes()).hexdigest()


@dataclass
class PseudoLabelFile:
    """The content of a pseudo-label file (see the module docstring)."""

    settings: dict[str, Any]
    classes: list[str]
    prompts: list[str]
    paths: list[str]
    scores: dict[str, np.ndarray]
    readable: np.ndarray
    positives: np.ndarray
    source: str = ""  # where it was read from ('' when made in this process)
    extra: dict[str, Any] = field(default_factory=dict)

    def rows_for(self, paths: Sequence[str], what: str) -> np.ndarray:
        """The row of each of ``paths``; :class:`PseudoLabelFileError` naming the first missing image."""
        index = {p: i for i, p in enumerate(self.paths)}
        missing = [p for p in paths if p not in index]
        if missing:
            raise PseudoLabelFileError(
                f"{self.source or 'the pseudo-label file'} does not cover {what}: {len(missing):,} of its "
                f"{len(paths):,} training images are not in it (first: {missing[0]}; the file holds "
                f"{len(self.paths):,} images, e.g. {self.paths[0] if self.paths else 'none'}). Compute it on the "
                "same dataset, or drop --pseudo-labels to compute them here")
        return np.array([index[p] for p in paths], dtype=np.int64)

    def subset(self, rows: np.ndarray) -> PseudoLabelFile:
        """The file's rows ``rows`` (in that order)."""
        paths = [self.paths[i] for i in rows]
        settings = {**self.settings, "images_sha256": images_digest(paths)}
        return PseudoLabelFile(settings, list(self.classes), list(self.prompts), paths,
                               {k: v[rows] for k, v in self.scores.items()}, self.readable[rows],
                               self.positives[rows], self.source)


def write(path: Path, content: PseudoLabelFile) -> None:
    """Write ``content`` to ``path`` atomically."""
    arrays: dict[str, np.ndarray] = {
        "format": np.array(FORMAT), "settings": np.array(json.dumps(content.settings, sort_keys=True)),
        "classes": np.array(content.classes, dtype=str), "prompts": np.array(content.prompts, dtype=str),
        "paths": np.array(content.paths, dtype=str),
        **{name: np.ascontiguousarray(value, dtype=np.float32) for name, value in content.scores.items()},
        "readable": np.asarray(content.readable, dtype=bool), "positives": np.asarray(content.positives, dtype=bool)}
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez_compressed(handle, **arrays)


def read(path: Path) -> PseudoLabelFile:
    """Read and check a pseudo-label file (a :class:`PseudoLabelFileError` for anything else)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except FileNotFoundError:
        raise PseudoLabelFileError(f"--pseudo-labels {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise PseudoLabelFileError(f"{path} is not a pseudo-label file ({exc})") from None
    if "format" not in arrays or str(arrays["format"]) != FORMAT:
        found = str(arrays["format"]) if "format" in arrays else "no format member"
        raise PseudoLabelFileError(f"{path} is not a pseudo-label file of this version ({FORMAT}; found {found})")
    settings = json.loads(str(arrays["settings"]))
    classes = [str(c) for c in arrays["classes"]]
    paths = [str(p) for p in arrays["paths"]]
    scores = {name: arrays[name] for name in SCORE_NAMES if name in arrays}
    n, c = len(paths), len(classes)
    for name, value in {**scores, "positives": arrays["positives"]}.items():
        if value.shape != (n, c):
            raise PseudoLabelFileError(f"{path}: {name} has shape {value.shape}, expected ({n}, {c})")
    if "global" not in scores:
        raise PseudoLabelFileError(f"{path}: no global scores")
    if settings.get("images_sha256") != images_digest(paths):
        raise PseudoLabelFileError(f"{path}: its image list does not match its own digest (a damaged file)")
    return PseudoLabelFile(settings, classes, [str(p) for p in arrays["prompts"]], paths, scores,
                           arrays["readable"].astype(bool), arrays["positives"].astype(bool), str(path))
