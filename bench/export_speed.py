"""Inference benchmark of the export precisions on this machine: ``python -m bench.export_speed``.

For each configuration: PyTorch eager FP32 (the network as trained, LgConv unfolded), and ONNX Runtime (CPU
execution provider) on the exported FP32 (folded), FP16 and INT8 (``cpu`` flavour) models - images/s at each
batch size and, for a trained checkpoint (``--checkpoint``), the test-split mAP of each; with ``--int8-qat`` also
the INT8 model of the export's quantization-aware distillation (:func:`export.export_run`). Without a checkpoint
the network is random-initialised (throughput only), its LgConv branches switched on as after training. Every
runtime / precision / batch size of a configuration is timed in the same interleaved rounds
(:func:`bench.timing.time_interleaved_spread`), so a change in the machine's load hits them alike: images/s is the
median (min-max) over the rounds, and "x eager" the ratio of the medians. The table, the command and the machine
(with its load average) go to section ``export-cpu`` of the results page.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import time_interleaved_spread
from export import convert_fp16, export_run, export_to_file, quantize_int8
from models.checkpoint import ModelMeta, load_checkpoint
from models.evaluation.metrics import mean_average_precision
from models.lgconv import global_branches
from models.network import build_model, model_from_meta
from models.preprocess import EvalTransform


def _random_model(arch: str, size: int, num_classes: int = 20) -> tuple[torch.nn.Module, ModelMeta]:
    """A random-init network with LgConv, its global branches switched on as after training (eval mode)."""
    torch.manual_seed(0)
    model = build_model(arch, num_classes, lgconv=True)
    with torch.no_grad():
        for g in global_branches(model):
            g.bn.weight.normal_(0.0, 0.3)
    meta = ModelMeta(classes=[f"c{i}" for i in range(num_classes)], arch=arch, image_size=size, lgconv=True)
    return model.eval(), meta


def _load_model(checkpoint: Path) -> tuple[torch.nn.Module, ModelMeta]:
    """A checkpoint's network (eval mode, float32 on the CPU) and its metadata."""
    ckpt = load_checkpoint(checkpoint)
    model = model_from_meta(ckpt.meta)
    model.load_state_dict(ckpt.model)
    return model.float().eval(), ckpt.meta


def _splits(meta: ModelMeta) -> Any:
    """The checkpoint's train / val / test splits, rebuilt from the dataset and protocol its metadata records."""
    from models.data.protocol import PROTOCOL_SEED, build_protocol, parse_observed
    from models.data.registry import load_dataset

    data = meta.data or {}
    return build_protocol(load_dataset(str(data["source"])), parse_observed(str(data.get("observed", "single"))),
                          val_fraction=float(data.get("val_fraction", 0.2)),
                          seed=int(data.get("protocol_seed", PROTOCOL_SEED)), labels=str(data.get("labels", "auto")))


def _inputs(paths: list[Path], meta: ModelMeta) -> np.ndarray:
    """The network inputs of ``paths`` (the model's evaluation preprocessing), float32 (N, 3, S, S)."""
    transform = EvalTransform.for_meta(meta)
    return np.stack([transform(path).numpy() for path in paths]).astype(np.float32, copy=False)


class _Ort:
    """An ONNX file open in ONNX Runtime on the CPU (its worker threads do not spin between runs)."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def logits(self, inputs: np.ndarray, batch_size: int = 32) -> np.ndarray:
        """float32 logits (N, C) of ``inputs``."""
        return np.concatenate([self.session.run(None, {self.input: inputs[s:s + batch_size]})[0]
                               for s in range(0, len(inputs), batch_size)]).astype(np.float32, copy=False)


def _smooth_images(n: int, size: int, seed: int) -> np.ndarray:
    """Image-like random inputs (low-frequency fields): INT8 calibration data for a random-init network."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.nn.functional.interpolate(torch.randn(n, 3, 8, 8, generator=g), size=(size, size),
                                             mode="bilinear", align_corners=False)
    return coarse.numpy().astype(np.float32)


def bench_config(label: str, model: torch.nn.Module, meta: ModelMeta, test: tuple[np.ndarray, np.ndarray] | None,
                 calibration: np.ndarray, batches: list[int], budget: float,
                 distilled: Path | None = None) -> list[dict[str, Any]]:
    """Rows (one per runtime/precision) for one network: images/s per batch size (a :class:`bench.timing.Spread`
    over the interleaved rounds) and test mAP. ``distilled``: the INT8 file the export pipeline makes with its
    quantization-aware distillation, for one more row."""
    size = meta.image_size
    x = test[0] if test is not None else _smooth_images(max(batches), size, 1)

    def torch_logits(inputs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return torch.cat([model(torch.from_numpy(inputs[s:s + 32])) for s in range(0, len(inputs), 32)]).numpy()

    def run_torch(batch: torch.Tensor) -> None:
        with torch.inference_mode():
            model(batch)

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "model.onnx"
        export_to_file(model.fold_for_inference(), meta, fp32)
        files = {"fp32": fp32, "fp16": convert_fp16(fp32, Path(tmp) / "model.fp16.onnx").path,
                 "int8 (cpu)": quantize_int8(fp32, Path(tmp) / "model.int8.onnx", calibration, target="cpu").path}
        if distilled is not None:
            files["int8 (cpu, distilled)"] = distilled
        ort_models = {precision: _Ort(path) for precision, path in files.items()}
        calls: dict[str, Any] = {}
        for b in batches:
            inputs = x[np.arange(b) % len(x)]
            tensor = torch.from_numpy(inputs)
            calls[f"torch fp32 b{b}"] = lambda batch=tensor: run_torch(batch)
            for precision, ort_model in ort_models.items():
                feed = {ort_model.input: inputs}
                calls[f"ort {precision} b{b}"] = lambda m=ort_model, f=feed: m.session.run(None, f)
        seconds = time_interleaved_spread(calls, budget)  # ``budget`` seconds per cell, as many rounds as fit
        row: dict[str, Any] = {"config": label, "runtime": "PyTorch eager", "precision": "fp32"}
        row.update({f"b{b}": seconds[f"torch fp32 b{b}"].per_second(b) for b in batches})
        row["mAP"] = mean_average_precision(torch_logits(x), test[1]) if test is not None else None
        rows.append(row)
        for precision, ort_model in ort_models.items():
            row = {"config": label, "runtime": "ONNX Runtime", "precision": precision,
                   "size_mb": files[precision].stat().st_size / 1e6}
            row.update({f"b{b}": seconds[f"ort {precision} b{b}"].per_second(b) for b in batches})
            row["mAP"] = mean_average_precision(ort_model.logits(x), test[1]) if test is not None else None
            rows.append(row)
    for row in rows:
        print(row, file=sys.stderr, flush=True)
    return rows


def _distilled(checkpoint: Path, folder: Path) -> Path:
    """The INT8 (``cpu``) file ``python -m export --precision int8 --int8-qat on`` makes of ``checkpoint`` (the
    export's quantization-aware distillation, then its calibration), in ``folder``."""
    result = export_run(checkpoint, folder / "model.onnx", precisions=["fp32", "int8"], int8_qat="on",
                        progress=False, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    return next(a.path for a in result.artifacts if a.name == "int8-cpu")


def to_markdown(rows: list[dict[str, Any]], batches: list[int], command: str) -> str:
    """The results section: command, machine and the table."""
    archs = ", ".join(dict.fromkeys(str(r["config"]).split(" ")[0] for r in rows))
    lines = [f"## Export precisions on CPU: {archs}", "",
             f"Command: `{command}`", "", machine_line(), "",
             "images/s per batch size, median (min-max) over interleaved rounds of every cell of a configuration; ONNX "
             "models are the folded export (BatchNorm + LgConv); INT8 is the `cpu` flavour (u8 activations, s8 "
             "weights, head in float) calibrated on 256 training images; `distilled`: the same after the export's "
             "quantization-aware distillation (`--int8-qat`, docs/export.md).", ""]
    header = ["config", "runtime", "precision", *[f"img/s b{b}" for b in batches], f"x eager (b{batches[-1]})",
              f"x ORT fp32 (b{batches[-1]})", "test mAP", "mAP drop vs eager"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base: dict[str, dict[str, Any]] = {}
    ort_base: dict[str, dict[str, Any]] = {}
    for r in rows:
        ref = base.setdefault(r["config"], r)
        if r["runtime"] == "ONNX Runtime" and r["precision"] == "fp32":
            ort_base[r["config"]] = r
        last = f"b{batches[-1]}"
        speed = r[last].median / ref[last].median
        ort = ort_base.get(r["config"])
        vs_ort = "-" if ort is None or r["runtime"] != "ONNX Runtime" else f"{r[last].median / ort[last].median:.2f}"
        drop = "-" if r["mAP"] is None or ref["mAP"] is None else f"{ref['mAP'] - r['mAP']:+.2f}"
        cells = [r["config"], r["runtime"], r["precision"], *[r[f"b{b}"].text(".1f") for b in batches], f"{speed:.2f}",
                 vs_ort, "-" if r["mAP"] is None else f"{r['mAP']:.2f}", drop]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.export_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", default=[], metavar="RUN_OR_PT",
                        help="trained run(s) to measure with their test-split mAP (repeatable)")
    parser.add_argument("--arch", default="resnet50", help="random-init network for throughput rows")
    parser.add_argument("--sizes", default="64,448", help="input sizes of the random-init rows ('' for none)")
    parser.add_argument("--batches", default="1,32", help="batch sizes (default: %(default)s)")
    parser.add_argument("--test-images", type=int, default=2000, help="test images per checkpoint (default: 2000)")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed repeats per cell")
    parser.add_argument("--int8-qat", action="store_true",
                        help="for each checkpoint, also the INT8 model of the export's quantization-aware distillation")
    add_page_options(parser, "export-cpu")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    from models.files.run_folder import resolve_checkpoint

    for target in args.checkpoint:
        path = resolve_checkpoint(target)
        model, meta = _load_model(path)
        splits = _splits(meta)
        if splits.test is None:
            parser.error(f"{path}: its dataset has no test split")
        x = _inputs(list(splits.test.paths[: args.test_images]), meta)
        labels = np.asarray(splits.test.labels[: args.test_images])
        train_paths = list(splits.train.paths)
        sample = np.random.default_rng(0).permutation(len(train_paths))[:256]  # INT8 calibration images
        calibration = _inputs([train_paths[i] for i in sorted(sample)], meta)
        arch = meta.arch + (" + LgConv" if meta.lgconv else "")
        label = f"{arch} @{meta.image_size}px, {meta.method} ({path.parent.name})"
        with tempfile.TemporaryDirectory() as tmp:
            distilled = _distilled(path, Path(tmp)) if args.int8_qat else None
            rows += bench_config(label, model, meta, (x, labels), calibration, batches, args.budget, distilled)
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        model, meta = _random_model(args.arch, size)
        rows += bench_config(f"{args.arch} + LgConv @{size}px (random init)", model, meta, None,
                             _smooth_images(64, size, 0), batches, args.budget)
    publish(args.section or "export-cpu", to_markdown(rows, batches, command_line("bench.export_speed", argv)),
            args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
