"""Exported ONNX (FP32, FP16 or INT8 Q/DQ) -> strongly typed TensorRT engine + ``<engine>.json`` sidecar, written
atomically. Flavours: ``tensorrt`` builds for this GPU, ``tensorrt-rtx`` ahead of time for chosen targets, ``auto``
picks; precision comes from the graph, never from builder flags."""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from export.errors import ExportError
from export.onnx_files import read_onnx_meta
from models.checkpoint import ModelMeta
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.files.digest import file_sha256
from models.runtimes.tensorrt_backend import (
    ENGINE_SIDECAR_FORMAT,
    ENGINE_SUFFIXES,
    FLAVOUR_RTX,
    FLAVOUR_TENSORRT,
    FLAVOURS,
    TENSORRT_FLAVOURS,
    cuda_target,
    engine_sidecar_path,
    import_tensorrt,
    make_logger,
    supported_targets,
    tensorrt_importable,
)

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
DEFAULT_MIN_BATCH = 1
DEFAULT_OPT_BATCH = 16  # the tagger's default batch size
DEFAULT_MAX_BATCH = 64
DEFAULT_TARGET = "default"  # TensorRT-RTX's own portable target set (Ampere and later, per its documentation)
# TensorRT-RTX 1.7's ComputeCapability members; the installed module's list wins when it is importable
KNOWN_RTX_TARGETS: tuple[str, ...] = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")
_TARGET_RE = re.compile(r"^sm_?(\d{2,3})$")
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)$")
_QOPERATOR_OPS = frozenset(
    {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QLinearAdd", "QLinearMul", "QGemm"})
_QUANT_NAMES = {
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "uint4",
    onnx.TensorProto.FLOAT8E4M3FN: "fp8", onnx.TensorProto.INT32: "int32"}
_FLOAT_NAMES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


class TensorRTBuildError(ExportError):
    """Building a TensorRT engine failed (TensorRT missing, bad ONNX, bad target or profile, builder error)."""


@dataclass
class EngineBuildResult:
    """What :func:`build_engine` wrote and how long it took."""

    engine_path: Path
    sidecar_path: Path
    onnx_path: Path
    flavour: str
    tensorrt_version: str
    targets: list[str]
    precision: str
    profile: dict[str, list[int]]
    size_bytes: int
    sha256: str
    build_seconds: float
    meta: ModelMeta

    def summary(self) -> str:
        """A few human-readable lines: engine, flavour, targets, precision, profile, time."""
        p = self.profile
        return "\n".join([
            f"built {self.engine_path} ({self.size_bytes / 1e6:.1f} MB) from {self.onnx_path.name} "
            f"({self.precision}, {len(self.meta.classes)} classes)",
            f"{self.flavour} {self.tensorrt_version}, targets {', '.join(self.targets)}, batch profile "
            f"min {p['min'][0]} / opt {p['opt'][0]} / max {p['max'][0]}, image size {self.meta.image_size}",
            f"metadata: {self.sidecar_path}",
            f"time: build {self.build_seconds:.1f} s",
        ])


def parse_targets(targets: Sequence[str] | str | None) -> list[str]:
    """Normalise compute targets (``"sm86"``, ``"SM_86"``, ``"8.6"`` -> ``"sm86"``; ``"current"`` kept; a comma list is
    split). Raises :class:`TensorRTBuildError` on another form or a duplicate."""
    if targets is None:
        return []
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    out: list[str] = []
    for raw in items:
        text = str(raw).strip().lower()
        if text == "current":
            norm = "current"
        elif m := _TARGET_RE.match(text):
            norm = f"sm{m.group(1)}"
        elif m := _DOTTED_RE.match(text):
            norm = f"sm{m.group(1)}{m.group(2)}"
        else:
            raise TensorRTBuildError(
                f"invalid TensorRT target {raw!r}: use a compute capability such as sm86 (or 8.6), or 'current'; "
                f"TensorRT-RTX builds for {', '.join(KNOWN_RTX_TARGETS)}")
        if norm in out:
            raise TensorRTBuildError(f"TensorRT target {norm} given twice")
        out.append(norm)
    if "current" in out and len(out) > 1:
        raise TensorRTBuildError("the TensorRT target 'current' cannot be combined with other targets")
    return out


def onnx_precision(model: onnx.ModelProto) -> str:
    """The precision an ONNX graph asks for: ``"int8"`` with Q/DQ, else the type of most float weights."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    quant: set[str] = set()
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            if len(node.input) > 2 and node.input[2] in inits:
                quant.add(_QUANT_NAMES.get(inits[node.input[2]].data_type, "other"))
            else:
                attr = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
                quant.add(_QUANT_NAMES.get(attr or onnx.TensorProto.UINT8, "other"))
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            quant.add(_QUANT_NAMES.get(inits[node.input[0]].data_type, "other"))
        elif node.op_type in _QOPERATOR_OPS:
            quant.add("qoperator")
    for name in ("int8", "fp8", "int4", "uint8", "qoperator"):
        if name in quant:
            return "int8" if name == "qoperator" else name
    counts: dict[str, int] = {}
    for t in graph.initializer:
        if t.data_type in _FLOAT_NAMES:
            counts[_FLOAT_NAMES[t.data_type]] = counts.get(_FLOAT_NAMES[t.data_type], 0) + int(np.prod(t.dims))
    return max(counts, key=lambda k: counts[k]) if counts else "fp32"


def quantization_problems(model: onnx.ModelProto) -> list[str]:
    """Why TensorRT would reject this quantized graph (it wants symmetric int8 Q/DQ); empty when fine."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    problems: list[str] = []
    qops = sorted({n.op_type for n in graph.node if n.op_type in _QOPERATOR_OPS})
    if qops:
        problems.append(f"QOperator-format nodes ({', '.join(qops)}); quantize in QDQ format")
    int32_dq = [
        n.name or n.output[0]
        for n in graph.node
        if n.op_type == "DequantizeLinear"
        and n.input[0] in inits
        and inits[n.input[0]].data_type == onnx.TensorProto.INT32]
    if int32_dq:
        problems.append(
            f"{len(int32_dq)} int32 bias DequantizeLinear node(s) (e.g. {int32_dq[0]}); keep biases in float "
            "(onnxruntime quantize_static: extra_options={'QuantizeBias': False})")
    asym: list[str] = []
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zp = inits.get(node.input[2])
        if zp is None or zp.data_type == onnx.TensorProto.INT32:
            continue
        if zp.data_type == onnx.TensorProto.UINT8 or np.any(onnx.numpy_helper.to_array(zp) != 0):
            asym.append(node.name or node.output[0])
    if asym:
        problems.append(f"{len(asym)} Q/DQ node(s) with uint8 or non-zero zero points (e.g. {asym[0]}); "
                        "TensorRT needs symmetric int8 (activations and weights QInt8, symmetric)")
    return problems


def _load_source(onnx_path: Path) -> tuple[ModelMeta, str]:
    """(meta, precision) of the source ONNX; :class:`TensorRTBuildError` when it is unusable."""
    if not onnx_path.is_file():
        raise TensorRTBuildError(f"ONNX model not found: {onnx_path}")
    try:
        meta = read_onnx_meta(onnx_path)
    except (ValueError, OSError) as exc:
        raise TensorRTBuildError(f"cannot build a TensorRT engine from {onnx_path}: {exc}") from exc
    proto = onnx.load(str(onnx_path), load_external_data=False)
    problems = quantization_problems(proto)
    if problems:
        raise TensorRTBuildError(f"{onnx_path}: TensorRT cannot build this quantized model: {'; '.join(problems)} "
                                 "(quantize with target 'tensorrt' in export.quantize.quantize_int8)")
    return meta, onnx_precision(proto)


def _resolve_flavour(flavour: str, targets: list[str]) -> str:
    """Pick the flavour for ``flavour`` (``auto`` / a flavour name) and the parsed targets; checks availability."""
    if flavour != "auto" and flavour not in TENSORRT_FLAVOURS:
        raise TensorRTBuildError(f"unknown TensorRT flavour {flavour!r}; choose auto, {', '.join(FLAVOURS)}")
    here = cuda_target()
    full_ok = here is not None and all(t in ("current", here) for t in targets)
    if flavour == "auto":
        if full_ok and tensorrt_importable(FLAVOUR_TENSORRT):
            return FLAVOUR_TENSORRT
        if tensorrt_importable(FLAVOUR_RTX):
            return FLAVOUR_RTX
        if here is not None and tensorrt_importable(FLAVOUR_TENSORRT):
            raise TensorRTBuildError(
                f"full TensorRT builds only for this machine's GPU ({here}); targets {', '.join(targets)} need "
                f"TensorRT for RTX: {TENSORRT_FLAVOURS[FLAVOUR_RTX].install}")
        raise TensorRTBuildError("no TensorRT found: install TensorRT for RTX (builds on any machine, GPU or not): "
                                 f"{TENSORRT_FLAVOURS[FLAVOUR_RTX].install}; or, on a GPU machine, "
                                 f"{TENSORRT_FLAVOURS[FLAVOUR_TENSORRT].install}")
    if flavour == FLAVOUR_TENSORRT:
        if here is None:
            raise TensorRTBuildError(
                "full TensorRT builds engines on the GPU they are for, and torch sees no CUDA GPU here; "
                f"to build without a GPU use flavour tensorrt-rtx ({TENSORRT_FLAVOURS[FLAVOUR_RTX].install})")
        if not full_ok:
            raise TensorRTBuildError(
                f"full TensorRT builds only for this machine's GPU ({here}), not for {', '.join(targets)}; "
                "use flavour tensorrt-rtx for other targets")
    if not tensorrt_importable(flavour):
        raise TensorRTBuildError(f"{flavour} is not installed: {TENSORRT_FLAVOURS[flavour].install}")
    return flavour


def _rtx_targets(trt: ModuleType, config: Any, targets: list[str]) -> list[str]:
    """Set the compute targets on a TensorRT-RTX builder config; returns what the sidecar records."""
    if not targets:
        return [DEFAULT_TARGET]  # leave num_compute_capabilities at 0: TensorRT-RTX's portable default
    available = supported_targets(trt)
    for t in targets:
        if t != "current" and t not in available:
            hint = ""
            if t in ("sm90", "sm100", "sm103"):
                hint = " (datacenter Hopper/Blackwell GPUs such as H100/H200/B200 need full TensorRT, built on the GPU)"
            raise TensorRTBuildError(f"TensorRT-RTX {trt.__version__} cannot build for {t}{hint}; its targets are "
                                     f"{', '.join(available)} or current")
    if targets == ["current"] and cuda_target() is None:
        raise TensorRTBuildError("TensorRT target 'current' needs a CUDA GPU on this machine; name the targets instead")
    config.num_compute_capabilities = len(targets)
    for i, t in enumerate(targets):
        if not config.set_compute_capability(getattr(trt.ComputeCapability, t.upper()), i):
            raise TensorRTBuildError(f"TensorRT-RTX refused compute target {t}")
    return [cuda_target() or "current"] if targets == ["current"] else list(targets)


def _parser_errors(parser: Any) -> str:
    errors = [str(parser.get_error(i)).strip() for i in range(parser.num_errors)]
    return "; ".join(e.replace("\n", " ") for e in errors[:3]) or "no parser message"


def _check_network(network: Any, meta: ModelMeta, onnx_path: Path) -> None:
    size, n_cls = int(meta.image_size), len(meta.classes)
    ins = [(network.get_input(i).name, tuple(network.get_input(i).shape)) for i in range(network.num_inputs)]
    outs = [(network.get_output(i).name, tuple(network.get_output(i).shape)) for i in range(network.num_outputs)]
    if ins != [(INPUT_NAME, (-1, 3, size, size))] or outs != [(OUTPUT_NAME, (-1, n_cls))]:
        raise TensorRTBuildError(
            f"{onnx_path}: unexpected graph interface inputs {ins}, outputs {outs}; expected "
            f"[({INPUT_NAME!r}, (-1, 3, {size}, {size}))] -> [({OUTPUT_NAME!r}, (-1, {n_cls}))] with a dynamic batch")


def _io_dtype(tensor: Any) -> str:
    return {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16"}.get(tensor.dtype.name, tensor.dtype.name.lower())


def default_engine_path(onnx_path: str | Path) -> Path:
    """``model.onnx`` -> ``model.engine`` (same folder)."""
    return Path(onnx_path).with_suffix(".engine")


def build_engine(onnx_path: str | Path, engine_path: str | Path | None = None, *, min_batch: int = DEFAULT_MIN_BATCH,
                 opt_batch: int = DEFAULT_OPT_BATCH, max_batch: int = DEFAULT_MAX_BATCH,
                 targets: Sequence[str] | str | None = None, flavour: str = "auto", workspace_mib: int | None = None,
                 tf32: bool = True, optimization_level: int | None = None,
                 log: Callable[[str], None] | None = None) -> EngineBuildResult:
    """Build a strongly typed TensorRT engine (default ``<onnx stem>.engine``) and its sidecar from an exported ONNX
    file, with one profile for batches ``min_batch..max_batch``; ``targets`` only for TensorRT-RTX. Raises
    :class:`TensorRTBuildError`; on failure no new engine or sidecar is left behind."""
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    onnx_path = Path(onnx_path)
    out = Path(engine_path) if engine_path is not None else default_engine_path(onnx_path)
    if out.suffix.lower() not in ENGINE_SUFFIXES:
        raise TensorRTBuildError(f"engine file must end in {' or '.join(ENGINE_SUFFIXES)}: {out}")
    if not 1 <= min_batch <= opt_batch <= max_batch:
        raise TensorRTBuildError(
            f"invalid batch profile min {min_batch} / opt {opt_batch} / max {max_batch}: need 1 <= min <= opt <= max")
    if optimization_level is not None and not 0 <= optimization_level <= 5:
        raise TensorRTBuildError(f"optimization level {optimization_level} not in 0..5")
    if workspace_mib is not None and workspace_mib < 1:
        raise TensorRTBuildError("workspace_mib must be >= 1")
    wanted = parse_targets(targets)
    meta, precision = _load_source(onnx_path)
    chosen = _resolve_flavour(flavour, wanted)
    try:
        trt = import_tensorrt(chosen)
    except ModuleNotFoundError as exc:
        raise TensorRTBuildError(str(exc)) from exc
    say(f"{chosen} {trt.__version__}: building an engine from {onnx_path} ({precision}) ...")

    logger = make_logger(trt)
    builder = trt.Builder(logger)
    flags = 0
    major = int(str(trt.__version__).split(".")[0])
    if chosen == FLAVOUR_TENSORRT and major < 11:  # TensorRT 10 must be asked for strong typing; 11 always is
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise TensorRTBuildError(f"{chosen} could not parse {onnx_path}: {_parser_errors(parser)}")
    _check_network(network, meta, onnx_path)

    config = builder.create_builder_config()
    if chosen == FLAVOUR_RTX:
        recorded_targets = _rtx_targets(trt, config, wanted)
        gpu = None
    else:
        recorded_targets = [cuda_target() or "?"]
        gpu = {"name": torch.cuda.get_device_name(), "compute_capability": recorded_targets[0]}
    if not tf32:
        config.clear_flag(trt.BuilderFlag.TF32)
    if workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mib) << 20)
    if optimization_level is not None:
        config.builder_optimization_level = int(optimization_level)
    size = int(meta.image_size)
    shapes = {name: [b, 3, size, size] for name, b in (("min", min_batch), ("opt", opt_batch), ("max", max_batch))}
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, *(tuple(shapes[k]) for k in ("min", "opt", "max")))
    if config.add_optimization_profile(profile) < 0:
        raise TensorRTBuildError(f"{chosen} rejected the batch profile {shapes}")

    t_build = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    build_seconds = time.perf_counter() - t_build
    if serialized is None:
        detail = "; ".join(logger.errors()[-3:]) or "no message"
        raise TensorRTBuildError(f"{chosen} {trt.__version__} failed to build an engine from {onnx_path}: {detail}")

    with atomic_path(out, suffix=out.suffix) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(memoryview(serialized))
        digest = file_sha256(tmp)
        size_bytes = tmp.stat().st_size
    del serialized
    in_t, out_t = network.get_input(0), network.get_output(0)
    doc: dict[str, Any] = {
        "format": ENGINE_SIDECAR_FORMAT,
        "engine_file": out.name,
        "sha256": digest,
        "size_bytes": size_bytes,
        "tensorrt": {"flavour": chosen, "module": trt.__name__, "version": str(trt.__version__)},
        "targets": recorded_targets,
        "gpu": gpu,
        "precision": precision,
        "profile": {"input": INPUT_NAME, **shapes},
        "input": {"name": INPUT_NAME, "dtype": _io_dtype(in_t), "shape": ["batch", 3, size, size]},
        "output": {"name": OUTPUT_NAME, "dtype": _io_dtype(out_t), "shape": ["batch", len(meta.classes)]},
        "builder": {"strongly_typed": True, "tf32": bool(tf32), "workspace_mib": workspace_mib,
                    "optimization_level": optimization_level},
        "source_onnx": {"file": onnx_path.name, "path": str(onnx_path.resolve()), "sha256": file_sha256(onnx_path),
                        "size_bytes": onnx_path.stat().st_size},
        "meta": asdict(meta),
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(build_seconds, 3)}
    side = engine_sidecar_path(out)
    try:
        atomic_write_text(side, json.dumps(doc, indent=2) + "\n")
    except BaseException:
        out.unlink(missing_ok=True)  # never leave an engine whose sidecar describes another one
        raise
    total = time.perf_counter() - t0
    say(f"engine {out} ({size_bytes / 1e6:.1f} MB) in {build_seconds:.1f} s (total {total:.1f} s)")
    return EngineBuildResult(engine_path=out, sidecar_path=side, onnx_path=onnx_path, flavour=chosen,
                             tensorrt_version=str(trt.__version__), targets=recorded_targets, precision=precision,
                             profile={k: list(v) for k, v in shapes.items()}, size_bytes=size_bytes, sha256=digest,
                             build_seconds=build_seconds, meta=meta)


__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MIN_BATCH",
    "DEFAULT_OPT_BATCH",
    "EngineBuildResult",
    "TensorRTBuildError",
    "build_engine",
    "default_engine_path",
    "engine_sidecar_path",
    "onnx_precision",
    "parse_targets",
    "quantization_problems"]
