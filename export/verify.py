"""Parity check of an exported ONNX model against the PyTorch model on real images.

The images are the model's own validation split (rebuilt from ``meta.data`` with the dataset registry and
the SPML protocol) or the images of a folder. Both runtimes get exactly the same preprocessed batch
(:class:`~models.preprocess.EvalTransform` from the meta); the maximum absolute logit difference must not
exceed ``atol``. Batches of 1 and 3 are also pushed through ONNX Runtime to prove the batch axis is dynamic.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.checkpoint import ModelMeta
from models.files.folder_walk import find_images
from models.preprocess import EvalTransform
from models.runtimes.onnxruntime_backend import OnnxRuntimeBackend

if TYPE_CHECKING:
    from train.data.protocol import ProtocolSplits

DYNAMIC_BATCH_SIZES = (1, 3)
_HINT = "pass --images FOLDER to verify on a folder of images instead"


class ExportError(RuntimeError):
    """The export or its verification failed; the message is one readable line."""


class VerificationDataError(ExportError):
    """No images to verify on (dataset unavailable and no folder given)."""


class ParityError(ExportError):
    """ONNX Runtime and PyTorch disagree by more than the tolerance."""


@dataclass
class VerifyImages:
    """The image files chosen for verification and a human description of where they came from."""

    paths: list[Path]
    source: str


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_parity` (all numbers are over the images actually decoded)."""

    source: str
    images_used: int
    images_skipped: list[str]  # "path: reason"
    max_abs_diff: float
    mean_abs_diff: float
    atol: float
    batch_sizes_checked: list[int]
    passed: bool
    seconds: float
    per_batch_size_max_diff: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (for the sidecar)."""
        return asdict(self)


def ort_cpu_runtime(path: str | Path) -> OnnxRuntimeBackend:
    """The serving layer's ONNX Runtime backend on ``CPUExecutionProvider`` (``ExportError`` if unavailable)."""
    try:
        return OnnxRuntimeBackend.load(path, providers=("CPUExecutionProvider",))
    except (ModuleNotFoundError, ValueError) as exc:
        raise ExportError(str(exc)) from exc


def folder_images(folder: str | Path, limit: int) -> VerifyImages:
    """The first ``limit`` images of ``folder`` (the one folder walk, :mod:`models.files.folder_walk`, the tagger's);
    ``VerificationDataError`` if none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise VerificationDataError(f"--images folder not found: {folder}")
    found = find_images(folder)
    if not found:
        raise VerificationDataError(f"no image files found under {folder}")
    return VerifyImages(found[:limit], f"folder {folder}")


def rebuild_splits(meta: ModelMeta) -> ProtocolSplits:
    """The model's train / val / test splits, rebuilt from ``meta.data`` with the dataset registry and the
    protocol it recorded (observed spec, protocol seed, val fraction).

    Raises ``VerificationDataError`` (suggesting ``--images``) when that is impossible.
    """
    data = meta.data or {}
    source = data.get("source")
    if not source:
        raise VerificationDataError(f"the checkpoint records no dataset source (meta.data['source']); {_HINT}")
    try:
        from train.data.protocol import PROTOCOL_SEED, build_protocol, parse_observed
        from train.data.registry import load_dataset

        return build_protocol(
            load_dataset(str(source)),
            parse_observed(str(data.get("observed", "single"))),
            val_fraction=float(data.get("val_fraction", 0.2)),
            seed=int(data.get("protocol_seed", PROTOCOL_SEED)),
            labels=str(data.get("labels", "auto")),
        )
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


def _torch_logits(model: torch.nn.Module, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            outs.append(model(torch.from_numpy(inputs[start : start + batch_size])).float().numpy())
    return np.concatenate(outs)


def _ort_logits(runtime: OnnxRuntimeBackend, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        logits = runtime.predict_logits(batch)
        if logits.shape[0] != batch.shape[0]:
            raise ExportError(f"ONNX Runtime returned {logits.shape[0]} rows for a batch of {batch.shape[0]}")
        outs.append(np.asarray(logits, dtype=np.float32))
    return np.concatenate(outs)


def verify_parity(
    onnx_path: str | Path,
    model: torch.nn.Module,
    images: VerifyImages,
    meta: ModelMeta,
    atol: float = 1e-4,
    batch_size: int = 16,
) -> VerifyResult:
    """Run ``images`` through ONNX Runtime (CPU) and the eval-mode PyTorch ``model``; compare logits.

    Also runs batches of 1 and 3 through ORT. Returns a :class:`VerifyResult` with ``passed`` set; raises
    ``VerificationDataError`` if no image could be decoded, ``ExportError`` if ORT fails to run.
    """
    start = time.perf_counter()
    inputs, skipped = load_inputs(images.paths, meta)
    if len(inputs) == 0:
        raise VerificationDataError(
            f"none of the {len(images.paths)} images from {images.source} could be read "
            f"(first: {skipped[0] if skipped else '-'}); pass --images FOLDER with readable images"
        )
    model = model.eval()
    try:
        session = ort_cpu_runtime(onnx_path)
        ort_out = _ort_logits(session, inputs, batch_size)
        ref = _torch_logits(model, inputs, batch_size)
        per_size: dict[str, float] = {}
        if ort_out.shape != ref.shape:
            raise ExportError(f"output shape mismatch: ONNX Runtime {ort_out.shape} vs PyTorch {ref.shape}")
        diff = np.abs(ort_out.astype(np.float64) - ref.astype(np.float64))
        per_size[str(min(batch_size, len(inputs)))] = float(diff.max())
        max_diff = float(diff.max())
        for size in DYNAMIC_BATCH_SIZES:
            idx = np.arange(size) % len(inputs)  # repeat images when fewer than `size` are available
            small = _ort_logits(session, inputs[idx], size)
            if small.shape != (size, ref.shape[1]):
                raise ExportError(f"batch of {size}: ONNX Runtime returned shape {small.shape}")
            d = float(np.abs(small.astype(np.float64) - ref[idx].astype(np.float64)).max())
            per_size[str(size)] = d
            max_diff = max(max_diff, d)
    except ExportError:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ExportError(f"running the exported model failed ({type(exc).__name__}: {exc})") from exc
    passed = bool(np.isfinite(max_diff) and max_diff <= atol)
    return VerifyResult(
        source=images.source,
        images_used=len(inputs),
        images_skipped=skipped,
        max_abs_diff=max_diff,
        mean_abs_diff=float(diff.mean()),
        atol=float(atol),
        batch_sizes_checked=sorted({min(batch_size, len(inputs)), *DYNAMIC_BATCH_SIZES}),
        passed=passed,
        seconds=time.perf_counter() - start,
        per_batch_size_max_diff=per_size,
    )
