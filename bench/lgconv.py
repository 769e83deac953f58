"""LgConv cost benchmark: ``python -m bench.lgconv``.

For plain ResNet-50, ResNet-50 with LgConv (training form) and its folded inference form (and the plain
network with its BatchNorms folded, the fair baseline for the folded one): parameters, FLOPs per image
(``torch.utils.flop_counter``: convolutions and matrix products), and latency / throughput in PyTorch eager
(CPU, float32, inference mode) and ONNX Runtime (CPU execution provider, the dynamo-exported graph) at batch 1
and 16, at the default training size and at 448 px. Each cell is the median of timed repeats after a warm-up;
the four variants of a cell are timed in interleaved rounds, so their ratios are paired measurements (the
ONNX Runtime sessions do not spin-wait, or one session's idle threads would slow the next). The table, the
command and the machine go to section ``lgconv-cpu`` (``lgconv-cpu-1-thread`` with ``--threads 1``) of the
results page.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.results_page import add_page_options, command_line, machine_line, publish, threads_text
from bench.timing import interleaved_order, time_interleaved
from models.checkpoint import ModelMeta
from models.lgconv import fold_resnet, global_branches
from models.network import build_model

VARIANTS = ("plain", "plain-folded", "lgconv", "lgconv-folded")
PROFILE_WARMUP, PROFILE_RUNS = 2, 20  # --profile: runs left out, then runs whose per-op median is reported


def make_variant(name: str, arch: str, num_classes: int) -> torch.nn.Module:
    """One benchmarked network in eval mode (random init, branches switched on as after training)."""
    torch.manual_seed(0)
    model = build_model(arch, num_classes, lgconv=name.startswith("lgconv"))
    with torch.no_grad():
        for g in global_branches(model):
            g.bn.weight.normal_(0.0, 0.3)
    model.eval()
    return fold_resnet(model) if name.endswith("folded") else model


def count_flops(model: torch.nn.Module, image_size: int) -> int:
    """Forward FLOPs (2 per multiply-add) of one image, as counted by ``torch.utils.flop_counter``."""
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model(torch.zeros(1, 3, image_size, image_size))
    return int(counter.get_total_flops())


def export_for_ort(model: torch.nn.Module, image_size: int, num_classes: int, arch: str,
                   folder: Path, threads: int = 0) -> tuple[Any, Path]:
    """Export ``model`` with the package's exporter and open it in ONNX Runtime (CPU): (session, ONNX path).

    ``threads`` is the session's intra-op thread count (0: ONNX Runtime's default, one per physical core). The
    session's worker threads do not spin-wait after a run: with several sessions timed in turn, a session's
    spinning threads would otherwise take the cores from the next session's run and inflate its time."""
    from export.onnx_export import export_to_file

    path = folder / f"m{id(model)}-{image_size}.onnx"
    meta = ModelMeta(classes=[f"c{i}" for i in range(num_classes)], arch=arch, image_size=image_size)
    export_to_file(model, meta, path)
    return _cpu_session(path, threads=threads), path


def _cpu_session(path: Path, profile: bool = False, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session on ``path`` with ``threads`` intra-op threads (0: ORT's default) that do not
    spin-wait between runs; ``profile`` switches on ORT's profiler (its JSON goes next to ``path``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(path.with_suffix("")) + "-profile"
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_node_count(path: Path) -> int:
    """Number of nodes in the graph ONNX Runtime actually runs for the model at ``path`` (CPU provider, all graph
    optimisations, including its fusions and blocked-layout conversions). At small inputs each node costs a
    roughly fixed dispatch time, so this count predicts latency where FLOPs do not."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp) / "optimised.onnx")
        options.log_severity_level = 3  # ORT warns that the saved NCHWc graph is machine-specific: known, not used
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return len(onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node)


def ort_op_profiles(paths: dict[str, Path], image_size: int, runs: int = PROFILE_RUNS,
                    warmup: int = PROFILE_WARMUP, threads: int = 0) -> dict[str, dict[str, float]]:
    """Milliseconds per batch-1 run spent in each ONNX Runtime op type (CPU provider, ORT's own profiler), for
    each model file of ``paths`` (name -> ONNX path): name -> {op type: ms}, largest first.

    The sessions run in interleaved rounds like :func:`time_interleaved` (and, like there, without spin-waiting
    threads); the first ``warmup`` runs of each session are left out (the first one allocates and is 10-1000x
    slower), and each op type's time is the median over the other ``runs`` runs. The ops are those of the
    optimised graph: ``Conv`` includes fused activations, ``ReorderOutput`` / ``ReorderInput`` are the NCHWc
    layout conversions ORT inserts around its blocked convolutions."""
    sessions = {name: _cpu_session(path, profile=True, threads=threads) for name, path in paths.items()}
    feed = {"images": np.random.default_rng(0).random((1, 3, image_size, image_size), dtype=np.float32)}
    names = list(sessions)
    for round_ in range(warmup + runs):
        for name in interleaved_order(names, round_):
            sessions[name].run(None, feed)
    return {name: per_op_medians(json.loads(Path(session.end_profiling()).read_text()), warmup)
            for name, session in sessions.items()}


def per_op_medians(events: list[dict[str, Any]], skip_runs: int) -> dict[str, float]:
    """Median ms per run of each op type in an ONNX Runtime profile (its JSON ``events``), leaving out the first
    ``skip_runs`` runs; node events are assigned to the ``model_run`` event whose time span holds them."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session"
                   and e["name"] == "model_run")[skip_runs:]
    per_run: list[dict[str, float]] = [{} for _ in spans]
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        for i, (t0, t1) in enumerate(spans):
            if t0 <= event["ts"] <= t1:
                op = event["args"]["op_name"]
                per_run[i][op] = per_run[i].get(op, 0.0) + event["dur"] / 1e3
                break
    ops = {op for run in per_run for op in run}
    medians = {op: statistics.median(run.get(op, 0.0) for run in per_run) for op in ops}
    return dict(sorted(medians.items(), key=lambda kv: -kv[1]))


def measure(arch: str, sizes: list[int], batches: list[int], budget_s: float, runtimes: list[str],
            num_classes: int = 20, profile: bool = False, ort_threads: int = 0) -> list[dict[str, Any]]:
    """All rows of the table: one per (variant, image size); ``profile`` adds ``ort_profile`` to each row
    (:func:`ort_op_profiles`, batch 1); ``ort_threads``: intra-op threads of the ONNX Runtime sessions (0: its
    default). The variants of one cell (size, runtime, batch) are timed in interleaved rounds
    (:func:`time_interleaved`), so their ratios are paired measurements."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            models: dict[str, torch.nn.Module] = {}
            sessions: dict[str, Any] = {}
            onnx_paths: dict[str, Path] = {}
            size_rows: dict[str, dict[str, Any]] = {}
            for name in VARIANTS:
                model = models[name] = make_variant(name, arch, num_classes)
                row: dict[str, Any] = {
                    "variant": name, "size": size,
                    "params": sum(p.numel() for p in model.parameters()) + sum(
                        b.numel() for n, b in model.named_buffers() if not n.endswith(("running_mean", "running_var",
                                                                                       "num_batches_tracked"))),
                    "gflops": count_flops(model, size) / 1e9,
                }
                if "onnxruntime" in runtimes:
                    sessions[name], onnx_paths[name] = export_for_ort(
                        model, size, num_classes, arch, Path(tmp), threads=ort_threads)
                    row["ort_nodes"] = ort_node_count(onnx_paths[name])
                size_rows[name] = row
            if profile and onnx_paths:
                for name, per_op in ort_op_profiles(onnx_paths, size, threads=ort_threads).items():
                    size_rows[name]["ort_profile"] = per_op
            for batch in batches:
                x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
                if "torch" in runtimes:
                    def run_torch(model: torch.nn.Module, x: torch.Tensor = x) -> Callable[[], None]:
                        def run() -> None:
                            with torch.inference_mode():
                                model(x)
                        return run
                    for name, seconds in time_interleaved({n: run_torch(m) for n, m in models.items()},
                                                          budget_s).items():
                        size_rows[name][f"torch_b{batch}"] = seconds
                if sessions:
                    feed = {"images": x.numpy()}
                    for name, seconds in time_interleaved(
                            {n: (lambda s=s, f=feed: s.run(None, f)) for n, s in sessions.items()}, budget_s).items():
                        size_rows[name][f"ort_b{batch}"] = seconds
            for row in size_rows.values():
                print(_row_text(row, batches, runtimes), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def _row_text(row: dict[str, Any], batches: list[int], runtimes: list[str]) -> str:
    parts = [f"{row['variant']:>14} @{row['size']}px  {row['params'] / 1e6:6.2f}M params  {row['gflops']:7.2f} GFLOPs"]
    for rt, key in (("torch", "torch"), ("onnxruntime", "ort")):
        if rt in runtimes:
            parts += [f"{key} b{b}: {row[f'{key}_b{b}'] * 1e3:8.1f} ms" for b in batches]
    return "  ".join(parts)


def to_markdown(rows: list[dict[str, Any]], batches: list[int], runtimes: list[str], command: str,
                ort_threads: int = 0) -> str:
    """The results section: command, machine, the table and the folded / plain latency ratios."""
    ort_text = f"ONNX Runtime {threads_text(ort_threads)}" if ort_threads else "ONNX Runtime's default threads"
    lines = [
        "## LgConv cost: plain vs LgConv vs folded LgConv", "",
        f"Command: `{command}`", "",
        machine_line(ort_text), "",
        "Latency = median wall time of one forward call on a batch (ms), the four variants of a cell timed in "
        "interleaved rounds (ONNX Runtime sessions without spin-waiting worker threads, so that one session's "
        "idle threads do not slow the next one's run); throughput = images/s at that batch. "
        "`plain-folded` is the plain network with BatchNorm folded into the convolutions (what ONNX Runtime does "
        "to the plain graph anyway); `lgconv-folded` is what `python -m export` ships. ORT nodes = nodes of the "
        "graph ONNX Runtime runs after its optimisations (fusions, blocked-layout conversions).", "",
    ]
    cols = [(rt_key, b) for rt, rt_key in (("torch", "torch"), ("onnxruntime", "ort")) if rt in runtimes
            for b in batches]
    nodes = any("ort_nodes" in r for r in rows)
    header = ["variant", "input", "params (M)", "GFLOPs/img"] + (["ORT nodes"] if nodes else []) + [
        f"{'PyTorch' if k == 'torch' else 'ORT'} b{b} ms (img/s)" for k, b in cols]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["variant"], f"{r['size']} px", f"{r['params'] / 1e6:.2f}", f"{r['gflops']:.2f}"]
        cells += [str(r["ort_nodes"])] if nodes else []
        cells += [f"{r[f'{k}_b{b}'] * 1e3:.1f} ({b / r[f'{k}_b{b}']:.0f})" for k, b in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Folded LgConv latency relative to plain (target: at most 1.10):", ""]
    lines += ["| input | runtime | batch | vs plain | vs plain-folded | unfolded LgConv vs plain |",
              "|---|---|---|---|---|---|"]
    by = {(r["variant"], r["size"]): r for r in rows}
    for size in sorted({r["size"] for r in rows}):
        for k, b in cols:
            key = f"{k}_b{b}"
            folded, plain = by[("lgconv-folded", size)][key], by[("plain", size)][key]
            plain_f, unfolded = by[("plain-folded", size)][key], by[("lgconv", size)][key]
            lines.append(f"| {size} px | {'PyTorch' if k == 'torch' else 'ORT'} | {b} | {folded / plain:.2f} | "
                         f"{folded / plain_f:.2f} | {unfolded / plain:.2f} |")
    if any("ort_profile" in r for r in rows):
        lines += _profile_markdown(rows)
    return "\n".join(lines) + "\n"


def _profile_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """Per-op-type ONNX Runtime time at batch 1 (``--profile``), one table per input size."""
    lines = ["", "Where ONNX Runtime spends a batch-1 run (ms per run by op type of the optimised graph, ORT's "
             f"profiler: the four sessions run in interleaved rounds, {PROFILE_WARMUP} warm-up runs left out, each op "
             f"type's median over {PROFILE_RUNS} runs; op kernels only, so the totals, sums of the medians, are a "
             "little under the latencies above):"]
    for size in sorted({r["size"] for r in rows if "ort_profile" in r}):
        profiled = [r for r in rows if r["size"] == size and "ort_profile" in r]
        ops = sorted({op for r in profiled for op in r["ort_profile"]},
                     key=lambda op: -max(r["ort_profile"].get(op, 0.0) for r in profiled))
        lines += ["", f"{size} px:", "", "| op type | " + " | ".join(r["variant"] for r in profiled) + " |",
                  "|---|" + "---|" * len(profiled)]
        for op in ops:
            cells = [f"{r['ort_profile'][op]:.2f}" if op in r["ort_profile"] else "-" for r in profiled]
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
        lines.append("| **total** | " + " | ".join(f"**{sum(r['ort_profile'].values()):.2f}**" for r in profiled)
                     + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.lgconv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet50", help="backbone (default: %(default)s)")
    parser.add_argument("--sizes", default="64,448", help="input sizes, comma-separated (default: %(default)s)")
    parser.add_argument("--batches", default="1,16", help="batch sizes, comma-separated (default: %(default)s)")
    parser.add_argument("--runtimes", default="torch,onnxruntime", help="torch and/or onnxruntime")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed repeats per cell (default: 3)")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of PyTorch and ONNX Runtime (default: 0, each library's own default: "
                             "one per core); 1 is the setting of a server that runs one single-threaded model per "
                             "core")
    parser.add_argument("--profile", action="store_true",
                        help="add ONNX Runtime's per-op-type time at batch 1 for every variant (default: off)")
    add_page_options(parser, "lgconv-cpu, or lgconv-cpu-1-thread with --threads 1")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if not set(runtimes) <= {"torch", "onnxruntime"} or not runtimes:
        parser.error("--runtimes takes torch and/or onnxruntime")
    if args.profile and "onnxruntime" not in runtimes:
        parser.error("--profile needs the onnxruntime runtime")
    if args.threads < 0:
        parser.error("--threads takes 0 (the libraries' defaults) or a positive count")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args.arch, sizes, batches, args.budget, runtimes, profile=args.profile, ort_threads=args.threads)
    section = args.section or ("lgconv-cpu-1-thread" if args.threads == 1 else "lgconv-cpu")
    publish(section, to_markdown(rows, batches, runtimes, command_line("bench.lgconv", argv), args.threads), args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
