"""FP16 and INT8 (Q/DQ) ONNX models converted from the canonical FP32 export, keeping its interface and its
``spml_meta`` (``precision`` and ``quantization`` filled in). The tools, flavours and defaults: docs/export.md."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from export.errors import ConversionError, KeepFloatError, NotFP32Error
from export.int8_calibration_data import CALIBRATION_BATCH, BatchReader, calibration_batches, chunk_stride
from export.onnx_files import load_onnx_file, onnx_meta, set_onnx_meta
from models.checkpoint import ModelMeta
from models.files.atomic_writes import atomic_path
from models.files.digest import file_sha256
from models.registry import Row, Table, UnknownName

Target = Literal["cpu", "tensorrt"]
CalibrationMethodName = Literal["minmax", "percentile", "entropy"]

#: How INT8 ranges are calibrated (``--int8-calibration``): name, help, ONNX Runtime's ``CalibrationMethod`` name.
CALIBRATION_METHODS: Table[str] = Table("calibration method", [
    Row("minmax", "the smallest and largest value seen (the default: docs/export.md)", "MinMax"),
    Row("percentile", "the range holding 99.999% of the values", "Percentile"),
    Row("entropy", "the range that loses least information (KL divergence)", "Entropy"),
])
DEFAULT_CALIBRATION_METHOD: CalibrationMethodName = "minmax"  # docs/export.md, Calibration method
DEFAULT_PERCENTILE = 99.999
DEFAULT_KEEP_HEAD_FLOAT = True
HEAD_OP_TYPES = ("Gemm", "MatMul")
QDQ_OP_TYPES = ("QuantizeLinear", "DequantizeLinear")

_ELEM_NAMES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT32: "int32"}


@dataclass(frozen=True)
class Int8Flavour:
    """The quantization settings of one INT8 target (see the module docstring)."""

    target: str
    activation_type: str  # "uint8" | "int8"
    activation_symmetric: bool
    weight_type: str
    weight_symmetric: bool
    quantize_bias: bool  # False: bias stays float (TensorRT)
    runtime: str


#: The INT8 targets (``quantize_int8(target=...)``: the ``int8`` precision is ``cpu``, TensorRT engines use
#: ``tensorrt``): name, help, quantization settings.
INT8_FLAVOURS: Table[Int8Flavour] = Table("INT8 target", [
    Row("cpu", "u8 activations, s8 weights, int32 bias: ONNX Runtime's fast x86 kernels", Int8Flavour(
        target="cpu", activation_type="uint8", activation_symmetric=False, weight_type="int8",
        weight_symmetric=True, quantize_bias=True, runtime="ONNX Runtime CPUExecutionProvider (x86 u8s8 kernels)")),
    Row("tensorrt", "symmetric s8 activations and weights, float bias: TensorRT's explicit quantization",
        Int8Flavour(target="tensorrt", activation_type="int8", activation_symmetric=True, weight_type="int8",
                    weight_symmetric=True, quantize_bias=False,
                    runtime="TensorRT explicit quantization (strongly typed build from the Q/DQ graph)")),
])


@dataclass
class ConversionResult:
    """What :func:`convert_fp16` / :func:`quantize_int8` wrote."""

    path: Path
    source: Path
    meta: ModelMeta
    precision: str
    size_bytes: int
    sha256: str
    seconds: float
    op_counts: dict[str, int] = field(default_factory=dict)

    @property
    def quantization(self) -> dict[str, Any]:
        """The ``quantization`` record stored in the model's metadata."""
        return self.meta.quantization

    def info(self) -> dict[str, Any]:
        """JSON-serialisable description (for a sidecar's ``export`` section)."""
        return {
            "precision": self.precision,
            "source": str(self.source),
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "seconds": round(self.seconds, 3),
            "op_counts": dict(self.op_counts), "quantization": self.meta.quantization}


# --------------------------------------------------------------------------------------------- checks


def _onnxruntime_version() -> str:
    for dist in ("onnxruntime-gpu", "onnxruntime"):
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            return f"{dist} {importlib_metadata.version(dist)}"
    return "onnxruntime (unknown version)"


def _elem_name(elem_type: int) -> str:
    return _ELEM_NAMES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())


def _io_types(model: onnx.ModelProto) -> dict[str, str]:
    out = {f"input {v.name}": _elem_name(v.type.tensor_type.elem_type) for v in model.graph.input}
    out.update({f"output {v.name}": _elem_name(v.type.tensor_type.elem_type) for v in model.graph.output})
    return out


def model_precision(model: onnx.ModelProto) -> str:
    """What the graph itself says: ``"int8"`` (Q/DQ nodes), ``"fp16"`` (float16 initializers) or ``"fp32"``."""
    if any(n.op_type in QDQ_OP_TYPES or n.op_type.startswith("QLinear") for n in model.graph.node):
        return "int8"
    if any(t.data_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) for t in model.graph.initializer):
        return "fp16"
    return "fp32"


def load_fp32_model(path: str | Path) -> tuple[onnx.ModelProto, ModelMeta]:
    """A canonical FP32 export and its ``spml_meta`` (``FileNotFoundError``, ``ConversionError``, ``NotFP32Error``)."""
    path = Path(path)
    try:
        model = load_onnx_file(path)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            raise ValueError(f"{path}: weights in external data; expected one self-contained file from export")
        meta = onnx_meta(model, path)
    except ValueError as exc:
        raise ConversionError(str(exc)) from exc
    if meta.precision != "fp32":
        raise NotFP32Error(
            f"{path}: its metadata says precision {meta.precision!r}; convert the FP32 export (model.onnx) instead")
    graph_precision = model_precision(model)
    if graph_precision != "fp32":
        raise NotFP32Error(f"{path}: the graph is already {graph_precision} (not an FP32 model)")
    not_float = {k: v for k, v in _io_types(model).items() if v != "float32"}
    if not_float:
        raise NotFP32Error(f"{path}: expected float32 inputs and outputs, got {not_float}")
    return model, meta


def _finish(converted: onnx.ModelProto, reference: onnx.ModelProto, meta: ModelMeta, src: Path, dst: Path,
            t0: float) -> ConversionResult:
    """Attach ``meta`` (last, whatever the tools did to metadata_props), check, save atomically, describe."""
    set_onnx_meta(converted, meta)
    _check_result(converted, reference, dst)
    _save(converted, dst)
    return ConversionResult(path=dst, source=src, meta=meta, precision=meta.precision,
                            size_bytes=dst.stat().st_size, sha256=file_sha256(dst),
                            seconds=time.perf_counter() - t0, op_counts=op_counts(converted))


def _check_result(model: onnx.ModelProto, reference: onnx.ModelProto, path: Path) -> None:
    """onnx.checker + the interface of the FP32 reference (names, float32, shapes) kept."""
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ConversionError(f"onnx.checker rejected the converted model for {path}: {exc}") from exc

    def iface(m: onnx.ModelProto) -> list[tuple[str, str, list[int | str]]]:
        return [(v.name, _elem_name(v.type.tensor_type.elem_type),
                 [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
                for v in [*m.graph.input, *m.graph.output]]

    got, want = iface(model), iface(reference)
    if got != want:
        raise ConversionError(f"the converted model's interface {got} differs from the FP32 model's {want}")


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type (sorted by type)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def topological_sort(model: onnx.ModelProto) -> None:
    """Reorder ``model.graph.node`` in place, stably, so every node follows its inputs' producers."""
    graph = model.graph
    available = {""} | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    available |= {t.name for t in graph.sparse_initializer}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for node in pending:
            if all(i in available for i in node.input):
                ordered.append(node)
                available.update(node.output)
                progress = True
            else:
                rest.append(node)
        pending = rest
    ordered.extend(pending)
    if [id(n) for n in ordered] != [id(n) for n in graph.node]:
        nodes = [copy.deepcopy(n) for n in ordered]
        del graph.node[:]
        graph.node.extend(nodes)


def _save(model: onnx.ModelProto, dst: Path) -> None:
    with atomic_path(dst, suffix=".onnx") as tmp:
        onnx.save_model(model, str(tmp), save_as_external_data=False)


def default_output(src: str | Path, precision: str, target: str | None = None) -> Path:
    """``model.onnx`` -> ``model.fp16.onnx`` / ``model.int8-cpu.onnx`` / ``model.int8-tensorrt.onnx``."""
    src = Path(src)
    tag = precision if target is None else f"{precision}-{target}"
    return src.with_name(f"{src.stem}.{tag}.onnx")


def _check_dst(src: Path, dst: Path) -> None:
    if dst.suffix.lower() != ".onnx":
        raise ConversionError(f"output must end in .onnx: {dst}")
    if dst.resolve() == src.resolve():
        raise ConversionError(f"output {dst} would overwrite the FP32 source model")


# ----------------------------------------------------------------------------------------------- FP16


def convert_fp16(src: str | Path, dst: str | Path, *, op_block_list: Sequence[str] | None = None) -> ConversionResult:
    """Convert the FP32 export ``src`` to FP16 at ``dst`` (float32 inputs/outputs kept; ``op_block_list``: op types left
    float32). Raises ``FileNotFoundError``, :class:`NotFP32Error`, :class:`ConversionError`."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    t0 = time.perf_counter()
    src, dst = Path(src), Path(dst)
    model, meta = load_fp32_model(src)
    _check_dst(src, dst)
    reference = copy.deepcopy(model)
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), _quiet_logging():
            converted = convert_float_to_float16(
                model, keep_io_types=True, op_block_list=list(op_block_list) if op_block_list is not None else None)
    except Exception as exc:
        raise ConversionError(f"FP16 conversion of {src} failed: {type(exc).__name__}: {exc}") from exc
    fp16_meta = dataclasses.replace(
        meta,
        precision="fp16",
        runtime_pick={},  # the FP32 file's pick was measured on that file
        quantization={
            "tool": f"onnxruntime.transformers.float16.convert_float_to_float16 ({_onnxruntime_version()})",
            "keep_io_types": True,
            "io_dtype": "float32",
            "compute_dtype": "float16",
            "op_block_list": list(op_block_list) if op_block_list is not None else "converter default",
            "target_runtime": "GPU (TensorRT strongly typed build, ONNX Runtime CUDA); no faster than FP32 on CPU",
            "source_sha256": file_sha256(src),
        })
    topological_sort(converted)  # the converter appends its input Casts at the end of the node list
    return _finish(converted, reference, fp16_meta, src, dst, t0)


# ----------------------------------------------------------------------------------------------- INT8


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name (the quantizer's include/exclude lists work by name)."""
    used = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)


def preprocess_for_quantization(model: onnx.ModelProto, dst: Path,
                                chatter: io.StringIO | None = None) -> onnx.ModelProto:
    """``quant_pre_process`` of ``model`` into ``dst``, every node named (:class:`ConversionError`)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        with contextlib.redirect_stdout(chatter or io.StringIO()), _quiet_logging():
            quant_pre_process(copy.deepcopy(model), str(dst))
    except Exception as exc:
        raise ConversionError(f"quant_pre_process failed: {type(exc).__name__}: {exc}") from exc
    pre = onnx.load(str(dst))
    _name_nodes(pre)
    return pre


def quantizable_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the Conv / Gemm / MatMul nodes of a float graph (what ``--int8-keep-float`` usually names)."""
    return [n.name for n in model.graph.node if n.op_type in ("Conv", *HEAD_OP_TYPES)]


def _check_keep_float(pre: onnx.ModelProto, keep_float: Sequence[str], src: Path) -> None:
    """:class:`KeepFloatError` naming the unknown entries of ``keep_float`` and a few valid names."""
    names = {n.name for n in pre.graph.node}
    unknown = [n for n in keep_float if n not in names]
    if unknown:
        valid = quantizable_nodes(pre)
        few = ", ".join(valid[:6]) + (f", ... ({len(valid)} in all)" if len(valid) > 6 else "")
        raise KeepFloatError(f"--int8-keep-float: no node {', '.join(map(repr, unknown))} in {src} (after "
                             f"quant_pre_process); Conv/Gemm/MatMul nodes are e.g. {few}; --int8-report lists them")


def _head_namespace_nodes(model: onnx.ModelProto, any_op: bool = False) -> list[str]:
    """Gemm/MatMul nodes (any with ``any_op``) the exporter's metadata places in the ``head`` module."""
    found = []
    for node in model.graph.node:
        if not any_op and node.op_type not in HEAD_OP_TYPES:
            continue
        namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), "")
        if "/head:" in namespace or "/head." in namespace:
            found.append(node.name)
    return found


def head_node_names(model: onnx.ModelProto) -> list[str]:
    """Names of the classifier head's ``Gemm`` / ``MatMul`` nodes (by metadata, else walking back from outputs)."""
    tagged = _head_namespace_nodes(model)
    if tagged:
        return tagged
    producers = {out: node for node in model.graph.node for out in node.output}
    found: list[str] = []
    seen: set[int] = set()
    stack = [o.name for o in model.graph.output]
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in HEAD_OP_TYPES:
            found.append(node.name)
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            continue
        stack.extend(i for i in node.input if i)
    return found


def activation_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of the ``MatMul`` nodes without a 2-D weight initializer: not worth quantizing."""
    dims = {t.name: len(t.dims) for t in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and not any(dims.get(i) == 2 for i in n.input)]


def _float_compute_nodes(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(quantized, kept float): the Conv/Gemm/MatMul nodes whose weight is / is not dequantized."""
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    quantized, kept = [], []
    for node in model.graph.node:
        if node.op_type in ("Conv", *HEAD_OP_TYPES):
            (quantized if node.input[1] in dq_outputs else kept).append(node.name)
    return quantized, kept


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    """Silence the root logger's warnings (ORT's quantization tools log there) for the duration."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_int8(src: str | Path, dst: str | Path, calibration: np.ndarray | Iterable[Any], *, target: Target = "cpu",
                  method: CalibrationMethodName = DEFAULT_CALIBRATION_METHOD,
                  keep_head_float: bool = DEFAULT_KEEP_HEAD_FLOAT, per_channel: bool = True,
                  reduce_range: bool = False, max_images: int | None = None, percentile: float = DEFAULT_PERCENTILE,
                  batch_size: int = CALIBRATION_BATCH, keep_float: Sequence[str] = (),
                  keep_float_spec: str | None = None, record: dict[str, Any] | None = None) -> ConversionResult:
    """Quantize the FP32 export ``src`` to an INT8 Q/DQ model at ``dst`` (float32 inputs/outputs kept), calibrated on
    preprocessed ``calibration`` images. ``target``: ``"cpu"`` (u8 activations) or ``"tensorrt"`` (symmetric s8);
    ``keep_float``: further node names left float, ``keep_float_spec`` how they were chosen; ``record``: extra
    ``quantization`` entries. Raises ``FileNotFoundError``, :class:`NotFP32Error`, :class:`CalibrationDataError`,
    :class:`KeepFloatError` or :class:`ConversionError`."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    t0 = time.perf_counter()
    src, dst = Path(src), Path(dst)
    try:
        flavour = INT8_FLAVOURS[target]
        ort_method = getattr(CalibrationMethod, CALIBRATION_METHODS[method])
    except UnknownName as exc:
        raise ConversionError(str(exc)) from None
    if not 0.0 < percentile <= 100.0:
        raise ConversionError(f"percentile must be in (0, 100], got {percentile}")
    model, meta = load_fp32_model(src)
    _check_dst(src, dst)
    if len(model.graph.input) != 1:
        raise ConversionError(f"{src}: expected one graph input, found {len(model.graph.input)}")
    input_name = model.graph.input[0].name
    batches = calibration_batches(calibration, meta.image_size, max_images=max_images, batch_size=batch_size)
    n_images = sum(len(b) for b in batches)
    reader = BatchReader(input_name, batches)
    qtype = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    extra: dict[str, Any] = {
        "ActivationSymmetric": flavour.activation_symmetric,
        "WeightSymmetric": flavour.weight_symmetric,
        "QuantizeBias": flavour.quantize_bias,
        "CalibTensorRangeSymmetric": flavour.activation_symmetric,
        # calibrate chunk by chunk (ORT's option has MinMax in its name but works for every method)
        "CalibStridedMinMax": chunk_stride(len(batches), batch_size, meta.image_size)}
    if method == "percentile":
        extra["CalibPercentile"] = float(percentile)

    chatter = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="spml-quant-") as tmp_dir:
        tmp = Path(tmp_dir)
        pre_path, out_path = tmp / "preprocessed.onnx", tmp / "quantized.onnx"
        try:
            pre = preprocess_for_quantization(model, pre_path, chatter)
        except ConversionError as exc:
            raise ConversionError(f"{src}: {exc}") from exc
        _check_keep_float(pre, keep_float, src)
        # Every node of the head stays float, not only its Gemm/MatMul (the label-wise embedding head's
        # transformer would otherwise get Q/DQ pairs on its Add/Reshape/Transpose activations). The
        # pre-processing drops the exporter's node metadata but keeps node names, so the head is found on the
        # original graph; without metadata, the output walk on the pre-processed graph finds it.
        in_pre = {n.name for n in pre.graph.node}
        head = [n for n in _head_namespace_nodes(model, any_op=True) if n in in_pre] or head_node_names(pre)
        if keep_head_float and not head:
            raise ConversionError(f"{src}: no final Gemm/MatMul found to keep in float (keep_head_float=True)")
        onnx.save_model(pre, str(pre_path))
        # the folded LgConv's small attention-pooling products stay float: ORT's QLinearMatMul takes no
        # per-channel 3-D weights, and they are a negligible share of the compute
        excluded = (head if keep_head_float else []) + [n for n in activation_matmuls(pre) if n not in head]
        excluded += [n for n in dict.fromkeys(keep_float) if n not in excluded]
        try:
            with contextlib.redirect_stdout(chatter), _quiet_logging():
                quantize_static(str(pre_path), str(out_path), reader, quant_format=QuantFormat.QDQ,
                                per_channel=per_channel, reduce_range=reduce_range,
                                activation_type=qtype[flavour.activation_type], weight_type=qtype[flavour.weight_type],
                                nodes_to_exclude=excluded, calibrate_method=ort_method,
                                calibration_providers=["CPUExecutionProvider"], extra_options=extra)
        except Exception as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConversionError(f"INT8 quantization of {src} failed: {type(exc).__name__}: {detail}") from exc
        quantized = onnx.load(str(out_path))

    quant_nodes, float_nodes = _float_compute_nodes(quantized)
    if not quant_nodes:
        raise ConversionError(f"INT8 quantization of {src} quantized no Conv/Gemm/MatMul node")
    calib: dict[str, Any] = {"method": method, "images": n_images, "batch_size": batch_size}
    if method == "percentile":
        calib["percentile"] = float(percentile)
    int8_meta = dataclasses.replace(
        meta,
        precision="int8",
        runtime_pick={},  # the FP32 file's pick was measured on that file
        quantization={
            "tool": f"onnxruntime.quantization.quantize_static ({_onnxruntime_version()})",
            "preprocess": "onnxruntime.quantization.shape_inference.quant_pre_process",
            "format": "QDQ",
            **dataclasses.asdict(flavour),
            "bias": "int32" if flavour.quantize_bias else "float32",
            "per_channel": per_channel,
            "reduce_range": reduce_range,
            "io_dtype": "float32",
            "calibration": calib,
            "keep_head_float": keep_head_float,
            "nodes_kept_float": float_nodes,
            "nodes_quantized": len(quant_nodes),
            **({"keep_float": {"spec": keep_float_spec or ",".join(keep_float),
                               "nodes": list(dict.fromkeys(keep_float))}} if keep_float else {}),
            **(record or {}),
            "source_sha256": file_sha256(src),
        })
    return _finish(quantized, model, int8_meta, src, dst, t0)
