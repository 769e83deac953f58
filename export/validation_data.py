"""The images export checks and calibrates on: the model's own splits rebuilt from its metadata, or a folder's images;
preprocessed with the model's :class:`~models.preprocess.EvalTransform`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from export.errors import VerificationDataError
from models.checkpoint import ModelMeta
from models.files.folder_walk import find_images
from models.preprocess import EvalTransform

if TYPE_CHECKING:
    from models.data.protocol import ProtocolSplits

_HINT = "pass --images FOLDER to verify on a folder of images instead"


@dataclass
class VerifyImages:
    """The image files chosen for verification and a human description of where they came from."""

    paths: list[Path]
    source: str


def folder_images(folder: str | Path, limit: int) -> VerifyImages:
    """The first ``limit`` images of ``folder`` (the one folder walk); ``VerificationDataError`` if none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise VerificationDataError(f"--images folder not found: {folder}")
    found = find_images(folder)
    if not found:
        raise VerificationDataError(f"no image files found under {folder}")
    return VerifyImages(found[:limit], f"folder {folder}")


def rebuild_splits(meta: ModelMeta) -> ProtocolSplits:
    """The model's splits rebuilt from ``meta.data``, with the run's review answers; ``VerificationDataError`` when
    impossible."""
    data = meta.data or {}
    source = data.get("source")
    if not source:
        raise VerificationDataError(f"the checkpoint records no dataset source (meta.data['source']); {_HINT}")
    try:
        from models.data.protocol import PROTOCOL_SEED, build_protocol, parse_observed
        from models.data.registry import load_dataset
        from models.data.reviewed_labels import apply_review

        return apply_review(build_protocol(
            load_dataset(str(source)),
            parse_observed(str(data.get("observed", "single"))),
            val_fraction=float(data.get("val_fraction", 0.2)),
            seed=int(data.get("protocol_seed", PROTOCOL_SEED)),
            labels=str(data.get("labels", "auto")),
        ), list(data.get("review") or []))[0]  # the run's --review answers: val's reach the thresholds
    except Exception as exc:  # import error, missing files, bad CSV...: all mean "no val split here"
        raise VerificationDataError(
            f"cannot rebuild the validation split of dataset {source!r} ({type(exc).__name__}: {exc}); {_HINT}"
        ) from exc


def split_notes(meta: ModelMeta, splits: ProtocolSplits) -> str:
    """``""``, or a note saying that the rebuilt data differs from what the model was trained on."""
    note = ""
    fingerprint = (meta.data or {}).get("fingerprint")
    if fingerprint and fingerprint != splits.fingerprint:
        note = f", dataset fingerprint {splits.fingerprint} differs from the checkpoint's {fingerprint}"
    if list(splits.classes) != list(meta.classes):
        note += ", dataset classes differ from the model's"
    return note


def validation_images(meta: ModelMeta, limit: int) -> VerifyImages:
    """The first ``limit`` images of the model's validation split (see :func:`rebuild_splits`)."""
    splits = rebuild_splits(meta)
    paths = list(splits.val.paths)
    source = meta.data.get("source")
    if not paths:
        raise VerificationDataError(f"the validation split of {source!r} is empty; {_HINT}")
    return VerifyImages(paths[:limit], f"val split of {source}{split_notes(meta, splits)}")


def load_inputs(paths: list[Path], meta: ModelMeta) -> tuple[np.ndarray, list[str]]:
    """Preprocess ``paths`` with the meta's EvalTransform -> (float32 (N,3,S,S), ["path: reason" skipped])."""
    transform = EvalTransform.for_meta(meta)
    arrays: list[np.ndarray] = []
    skipped: list[str] = []
    for path in paths:
        try:
            arrays.append(transform(path).numpy())
        except Exception as exc:  # any decode failure only removes that image from the check
            skipped.append(f"{path}: {type(exc).__name__}: {exc}")
    if not arrays:
        return np.zeros((0, 3, meta.image_size, meta.image_size), np.float32), skipped
    return np.stack(arrays).astype(np.float32, copy=False), skipped
