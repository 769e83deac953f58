"""Checkpoint -> verified, self-describing, single-file ONNX model (:func:`export_onnx`): rebuilt, folded for inference,
exported with a dynamic ``batch`` axis, checked against PyTorch on real images, and only then moved into place with its
``model.json`` sidecar; on any failure no new model file is left behind."""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import onnx
import torch

from export.defaults import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET
from export.errors import ExportError, ParityError
from export.onnx_files import sidecar_document, sidecar_path
from export.onnx_vs_pytorch import VerifyResult, verify_parity
from export.validation_data import VerifyImages, folder_images, validation_images
from models.checkpoint import ModelMeta, load_checkpoint
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.files.digest import file_sha256
from models.files.run_folder import resolve_checkpoint
from models.network import MultiLabelNet, model_from_meta
from models.onnx_metadata import meta_to_props

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
BATCH_AXIS = "batch"
TRACE_BATCH = 2  # torch.export may specialise a size-1 dimension, so never trace with a batch of 1


@dataclass
class ExportResult:
    """What :func:`export_onnx` produced and measured."""

    onnx_path: Path
    sidecar_path: Path
    checkpoint: Path
    meta: ModelMeta
    opset: int
    size_bytes: int
    sha256: str
    verification: VerifyResult
    export_seconds: float
    total_seconds: float

    def summary(self) -> str:
        """A few human-readable lines: file, size, parity, images, timings."""
        v = self.verification
        sizes = "/".join(str(s) for s in v.batch_sizes_checked)
        skipped = f", {len(v.images_skipped)} unreadable skipped" if v.images_skipped else ""
        return "\n".join([
            f"exported {self.onnx_path} ({self.size_bytes / 1e6:.1f} MB, opset {self.opset}, "
            f"{len(self.meta.classes)} classes, input {INPUT_NAME} [{BATCH_AXIS},3,{self.meta.image_size},"
            f"{self.meta.image_size}])",
            f"parity ORT vs PyTorch: max |diff| {v.max_abs_diff:.3g} (atol {v.atol:g}) on {v.images_used} "
            f"images ({v.source}{skipped}); batch sizes {sizes} ok",
            f"metadata: {self.sidecar_path}",
            f"time: export {self.export_seconds:.1f} s, verify {v.seconds:.1f} s, total {self.total_seconds:.1f} s",
        ])


def default_output(checkpoint: Path) -> Path:
    """``<run>/export/model.onnx`` for the checkpoint ``<run>/<name>.pt``."""
    return Path(checkpoint).parent / "export" / "model.onnx"


def load_model(checkpoint: Path) -> tuple[MultiLabelNet, ModelMeta]:
    """Checkpoint path -> (eval-mode CPU float32 network with its weights, its ModelMeta)."""
    ckpt = load_checkpoint(checkpoint)
    model = model_from_meta(ckpt.meta)
    model.load_state_dict(ckpt.model)
    return model.float().eval(), ckpt.meta


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in ("spml", "torch", "torchvision", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            out[dist] = importlib_metadata.version(dist)
    return out


def export_to_file(model: torch.nn.Module, meta: ModelMeta, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Export ``model`` with the dynamo exporter to ``path`` (one file, metadata embedded); ``images`` ``(batch, 3, S,
    S)`` -> ``logits`` ``(batch, C)``. Raises ``ExportError``."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"opset {opset} not supported; use {MIN_OPSET}..{MAX_OPSET}")
    model = model.eval()
    size = int(meta.image_size)
    example = torch.randn(TRACE_BATCH, 3, size, size, generator=torch.Generator().manual_seed(0))
    chatter = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (example,), None, dynamo=True, external_data=False,
                                        input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                        dynamic_shapes=({0: BATCH_AXIS},), opset_version=opset, verbose=False)
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {detail}") from exc
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    program.model.metadata_props.update(meta_to_props(meta))
    program.save(str(path), external_data=False)


def check_interface(path: Path, meta: ModelMeta, opset: int) -> onnx.ModelProto:
    """``onnx.checker`` and the graph contract; returns the loaded ModelProto, raises ``ExportError`` on the first
    problem."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ExportError(f"onnx.checker rejected the exported model: {exc}") from exc
    model = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise ExportError("the exported model refers to external data; expected one self-contained file")
    got_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if got_opset != opset:
        raise ExportError(f"requested opset {opset} but the exporter produced opset {got_opset}")

    def dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
        return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]

    inputs, outputs = list(model.graph.input), list(model.graph.output)
    size, n_cls = int(meta.image_size), len(meta.classes)
    expect_in: list[int | str] = [BATCH_AXIS, 3, size, size]
    expect_out: list[int | str] = [BATCH_AXIS, n_cls]
    problems = []
    if len(inputs) != 1 or inputs[0].name != INPUT_NAME or dims(inputs[0]) != expect_in:
        problems.append(f"inputs {[(i.name, dims(i)) for i in inputs]} != [({INPUT_NAME!r}, {expect_in})]")
    elif inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        problems.append("input is not float32")
    if len(outputs) != 1 or outputs[0].name != OUTPUT_NAME or dims(outputs[0]) != expect_out:
        problems.append(f"outputs {[(o.name, dims(o)) for o in outputs]} != [({OUTPUT_NAME!r}, {expect_out})]")
    if problems:
        raise ExportError("unexpected graph interface: " + "; ".join(problems))
    return model


def choose_images(meta: ModelMeta, images: Path | None, limit: int) -> VerifyImages:
    """Verification images: the first ``limit`` of folder ``images`` if given, else of the val split."""
    if limit < 1:
        raise ExportError("the number of verification images must be >= 1")
    if images is not None:
        return folder_images(images, limit)
    return validation_images(meta, limit)


def export_onnx(checkpoint: str | Path, output: str | Path | None = None, *, opset: int = DEFAULT_OPSET,
                images: str | Path | None = None, verify_images: int = DEFAULT_VERIFY_IMAGES,
                atol: float = DEFAULT_ATOL, runs_dir: Path | None = None,
                log: Callable[[str], None] | None = None) -> ExportResult:
    """Export a checkpoint (``.pt`` file, run folder, or run name under ``runs_dir``) to a verified ONNX file (default
    ``<run>/export/model.onnx``). Raises ``FileNotFoundError`` or ``ExportError`` (:class:`VerificationDataError`,
    :class:`ParityError`); on failure an earlier export at ``output`` is kept."""
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    ckpt_path = resolve_checkpoint(checkpoint, runs_dir)
    out_path = Path(output) if output is not None else default_output(ckpt_path)
    if out_path.suffix.lower() != ".onnx":
        raise ExportError(f"output must end in .onnx: {out_path}")
    if atol < 0:
        raise ExportError("atol must be >= 0")
    try:
        model, meta = load_model(ckpt_path)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ExportError(f"cannot load {ckpt_path}: {exc}") from exc
    chosen = choose_images(meta, Path(images) if images is not None else None, verify_images)
    say(f"checkpoint {ckpt_path}: {meta.arch}, {len(meta.classes)} classes, image size {meta.image_size}")

    with atomic_path(out_path, suffix=".onnx") as tmp:
        say(f"exporting with torch.onnx.export(dynamo=True), opset {opset} ...")
        t_export = time.perf_counter()
        # BatchNorms folded into the convolutions and LgConv in its inference form: the same function, less work
        export_to_file(model.fold_for_inference(), meta, tmp, opset)
        export_seconds = time.perf_counter() - t_export
        proto = check_interface(tmp, meta, opset)
        say(f"verifying against PyTorch on {len(chosen.paths)} images ({chosen.source}) ...")
        result = verify_parity(tmp, model, chosen, meta, atol=atol)
        if not result.passed:
            raise ParityError(
                f"parity check failed: max |ONNX Runtime - PyTorch| logit difference {result.max_abs_diff:.3g} "
                f"> atol {atol:g} over {result.images_used} images ({chosen.source}); "
                f"per batch size {result.per_batch_size_max_diff}; no model written to {out_path}")
        digest = file_sha256(tmp)
        size_bytes = tmp.stat().st_size
    # the .onnx is in place now (os.replace on leaving the block); its sidecar follows
    export_info: dict[str, Any] = {
        "exporter": "torch.onnx.export(dynamo=True, external_data=False)",
        "opset": opset,
        "ir_version": int(proto.ir_version),
        "input": {"name": INPUT_NAME, "dtype": "float32", "shape": [BATCH_AXIS, 3, meta.image_size, meta.image_size]},
        "output": {"name": OUTPUT_NAME, "dtype": "float32", "shape": [BATCH_AXIS, len(meta.classes)]},
        "trace_batch": TRACE_BATCH,
        "folded": ("BatchNorm into conv" + (", LgConv inference form" if meta.lgconv else "")
                   if model.family.name == "torchvision" else "none (ONNX Runtime fuses BatchNorm when it loads)"),
        "checkpoint": str(ckpt_path.resolve()),
        "checkpoint_sha256": file_sha256(ckpt_path),
        "exported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "export_seconds": round(export_seconds, 3), "versions": _versions()}
    side = sidecar_path(out_path)
    doc = sidecar_document(out_path, meta, export_info, result.to_dict(), sha256=digest)
    atomic_write_text(side, json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return ExportResult(onnx_path=out_path, sidecar_path=side, checkpoint=ckpt_path, meta=meta, opset=opset,
                        size_bytes=size_bytes, sha256=digest, verification=result, export_seconds=export_seconds,
                        total_seconds=time.perf_counter() - t0)
