"""Which nodes of an INT8 model lose the accuracy: a per-node SQNR report (the float graph against the Q/DQ model in
ONNX Runtime, sums of squares accumulated batch by batch), and ``--int8-keep-float``'s ``worst:N``. The columns and why
``added_noise`` ranks the nodes: docs/export.md."""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

    from export.quantize import ConversionResult

#: Images the report runs (the first ones of those given).
DEFAULT_REPORT_IMAGES = 64
#: Rows ``--int8-report`` prints (the CSV holds them all).
DEFAULT_REPORT_ROWS = 15
REPORT_BATCH = 16
COMPUTE_OP_TYPES = ("Conv", "Gemm", "MatMul")
CSV_COLUMNS = ("rank", "node", "op_type", "sqnr_db", "input_sqnr_db", "added_db", "added_noise")


@dataclass(frozen=True)
class KeepFloat:
    """A parsed ``--int8-keep-float``: explicit node ``names``, or the ``worst`` N nodes by SQNR."""

    spec: str
    names: tuple[str, ...] = ()
    worst: int | None = None


def parse_keep_float(spec: str | None) -> KeepFloat | None:
    """``"conv_a,conv_b"`` or ``"worst:N"`` -> :class:`KeepFloat`; blank -> None; ``ValueError`` if malformed."""
    if spec is None or not spec.strip():
        return None
    text = spec.strip()
    if text.lower().startswith("worst:"):
        count = text.split(":", 1)[1].strip()
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--int8-keep-float worst:N takes a count N >= 1, got {spec!r}")
        return KeepFloat(f"worst:{int(count)}", worst=int(count))
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--int8-keep-float takes a comma-separated list of node names or worst:N, got {spec!r}")
    return KeepFloat(",".join(names), names=names)


@dataclass(frozen=True)
class NodeSensitivity:
    """One quantized node: name, op type, SQNR (dB) of its output and activation input, and the SQNR it lost."""

    name: str
    op_type: str
    sqnr_db: float
    input_sqnr_db: float | None
    added_db: float | None

    @property
    def added_noise(self) -> float:
        """The noise-to-signal power this node adds (the whole output's when its input is float)."""
        noise_in = 0.0 if self.input_sqnr_db is None else 10 ** (-self.input_sqnr_db / 10)
        return 10 ** (-self.sqnr_db / 10) - noise_in

    def as_row(self, rank: int) -> dict[str, Any]:
        """The CSV row (dB rounded to 0.01, the added noise to 4 significant digits)."""
        def r(x: float | None) -> float | str:
            return "" if x is None else round(x, 2)

        return {"rank": rank, "node": self.name, "op_type": self.op_type, "sqnr_db": r(self.sqnr_db),
                "input_sqnr_db": r(self.input_sqnr_db), "added_db": r(self.added_db),
                "added_noise": f"{self.added_noise:.4g}"}


class _Sqnr:
    """Running sums of ``||float||^2`` and ``||float - int8||^2`` of one tensor over the batches."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref64 = np.asarray(ref, np.float64).ravel()
        self.signal += float(ref64 @ ref64)
        diff = ref64 - np.asarray(got, np.float64).ravel()
        self.noise += float(diff @ diff)

    def db(self) -> float:
        """ORT's formula: ``20 log10(max(||x||, eps) / max(||x - y||, eps))`` (finite even for no noise)."""
        eps = float(np.finfo(float).eps)
        return 20.0 * math.log10(max(math.sqrt(self.signal), eps) / max(math.sqrt(self.noise), eps))


@dataclass(frozen=True)
class _Probe:
    """Where one quantized node is compared: its output and activation input in both graphs."""

    node: onnx.NodeProto
    output: str
    output_int8: str
    input: str | None
    input_int8: str | None


def _quantized_nodes(qdq: onnx.ModelProto) -> list[_Probe]:
    """A :class:`_Probe` for every Conv/Gemm/MatMul whose weight is dequantized (the quantized compute nodes)."""
    producers = {o: n for n in qdq.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in qdq.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def dequantized(tensor: str) -> str:
        for q in consumers.get(tensor, []):
            if q.op_type == "QuantizeLinear":
                for dq in consumers.get(q.output[0], []):
                    if dq.op_type == "DequantizeLinear":
                        return dq.output[0]
        return tensor

    out = []
    for node in qdq.graph.node:
        if node.op_type not in COMPUTE_OP_TYPES or len(node.input) < 2:
            continue
        weight = producers.get(node.input[1])
        if weight is None or weight.op_type != "DequantizeLinear":
            continue
        source = None
        dq = producers.get(node.input[0])
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = producers.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                source = q.input[0]
        out.append(_Probe(node, node.output[0], dequantized(node.output[0]), source,
                          node.input[0] if source is not None else None))
    return out


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> bytes:
    """``model`` serialised with ``names`` added as (float) graph outputs."""
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in model.graph.output}
    for name in dict.fromkeys(names):
        if name not in present:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model.SerializeToString()


def _run(model: bytes, input_name: str, images: np.ndarray, names: Sequence[str],
         batch_size: int) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as qdq_loss_debug does
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return [dict(zip(names, session.run(list(names), {input_name: images[i:i + batch_size]}), strict=True))
            for i in range(0, len(images), batch_size)]


def sensitivity_report(fp32: str | Path, int8: str | Path, images: np.ndarray, *,
                       max_images: int = DEFAULT_REPORT_IMAGES,
                       batch_size: int = REPORT_BATCH) -> list[NodeSensitivity]:
    """Per quantized Conv/Gemm/MatMul node of ``int8`` (made from ``fp32``): its SQNR on the first ``max_images`` of
    ``images``, worst first. Raises :class:`~export.errors.ConversionError` when ``int8`` was not made from ``fp32``."""
    import onnx

    from export.errors import ConversionError
    from export.quantize import load_fp32_model, preprocess_for_quantization

    model, _ = load_fp32_model(fp32)
    qdq = onnx.load(str(int8))
    images = np.ascontiguousarray(images[:max_images], dtype=np.float32)
    if len(images) == 0:
        raise ConversionError("the INT8 sensitivity report needs at least one image")
    with tempfile.TemporaryDirectory(prefix="spml-sqnr-") as tmp:
        pre = preprocess_for_quantization(model, Path(tmp) / "preprocessed.onnx")
    probes = _quantized_nodes(qdq)
    float_names = {o for n in pre.graph.node for o in n.output} | {i.name for i in pre.graph.input}
    missing = [p.node.name for p in probes if p.output not in float_names]
    if missing:
        raise ConversionError(f"{int8}: node output(s) of {', '.join(missing[:3])} not in the float graph of {fp32}; "
                              "was it quantized from this file?")
    probes_in = [p for p in probes if p.input is not None and p.input_int8 is not None and p.input in float_names]
    float_wanted = list(dict.fromkeys([p.output for p in probes] + [p.input for p in probes_in if p.input]))
    int8_wanted = list(dict.fromkeys([p.output_int8 for p in probes] + [p.input_int8 for p in probes_in
                                                                        if p.input_int8]))
    input_name = qdq.graph.input[0].name
    ref = _run(_with_outputs(pre, float_wanted), input_name, images, float_wanted, batch_size)
    got = _run(_with_outputs(qdq, int8_wanted), input_name, images, int8_wanted, batch_size)

    def sqnr(float_name: str, int8_name: str) -> float:
        acc = _Sqnr()
        for r, g in zip(ref, got, strict=True):
            acc.add(r[float_name], g[int8_name])
        return acc.db()

    rows = []
    with_input = {id(p) for p in probes_in}
    for p in probes:
        out_db = sqnr(p.output, p.output_int8)
        in_db = sqnr(p.input, p.input_int8) if id(p) in with_input and p.input and p.input_int8 else None
        rows.append(NodeSensitivity(p.node.name, p.node.op_type, out_db, in_db,
                                    None if in_db is None else in_db - out_db))
    return sorted(rows, key=lambda row: (row.sqnr_db, row.name))


def write_csv(rows: Sequence[NodeSensitivity], path: str | Path) -> Path:
    """The whole report as CSV (:data:`CSV_COLUMNS`), worst first; written atomically."""
    from models.files.atomic_writes import atomic_path

    path = Path(path)
    with atomic_path(path, suffix=".csv") as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(row.as_row(rank) for rank, row in enumerate(rows, 1))
    return path


def format_report(rows: Sequence[NodeSensitivity], top: int = DEFAULT_REPORT_ROWS) -> str:
    """The ``top`` worst rows as an aligned text table."""
    shown = list(rows[:top])
    width = max([len(r.name) for r in shown] + [4])

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    lines = [f"{'#':>3}  {'node':<{width}}  {'op':<7} {'SQNR dB':>8} {'input dB':>9} {'added dB':>9} "
             f"{'added noise':>11}"]
    lines += [f"{i:>3}  {r.name:<{width}}  {r.op_type:<7} {num(r.sqnr_db):>8} {num(r.input_sqnr_db):>9} "
              f"{num(r.added_db):>9} {r.added_noise:>11.3g}" for i, r in enumerate(shown, 1)]
    return "\n".join(lines)


def quantize_keeping_worst(fp32: str | Path, dst: str | Path, calibration: np.ndarray, count: int,
                           **quantize_options: Any) -> tuple[ConversionResult, list[NodeSensitivity]]:
    """``--int8-keep-float worst:N``: quantize ``fp32``, rank its nodes, then quantize again into ``dst`` with the
    ``count`` noisiest nodes left in float; returns the result and the ranking. ``calibration`` is read twice. Raises
    :class:`~export.errors.KeepFloatError` when ``count`` exceeds the nodes quantized."""
    from export.errors import KeepFloatError
    from export.quantize import quantize_int8

    dst = Path(dst)
    with tempfile.TemporaryDirectory(prefix="spml-worst-") as tmp:
        first = quantize_int8(fp32, Path(tmp) / "first.int8.onnx", calibration, **quantize_options)
        ranking = sensitivity_report(fp32, first.path, calibration)
    if count > len(ranking):
        raise KeepFloatError(f"--int8-keep-float worst:{count}: only {len(ranking)} node(s) were quantized")
    names = [row.name for row in sorted(ranking, key=lambda row: -row.added_noise)[:count]]
    quantize_options.pop("keep_float", None)
    quantize_options.pop("keep_float_spec", None)
    result = quantize_int8(fp32, dst, calibration, keep_float=names, keep_float_spec=f"worst:{count}",
                           **quantize_options)
    return result, ranking
