"""GPU benchmark, one command on a CUDA machine: ``python -m bench.gpu``.

Measures (random-initialised network, random inputs, so no data set is needed):

1. training images/s of ``--arch`` at ``--image-size`` on one GPU: fp32, then bf16 autocast + channels_last,
   then the same under ``torch.compile`` (``--no-compile`` skips it);
2. DDP scaling: the bf16 + channels_last step on 1, 2, 4, ... up to every visible GPU, each size launched as
   ``torchrun --standalone --nproc_per_node N -m bench.gpu --ddp-worker``; images/s over all GPUs and the
   efficiency against N x one GPU;
3. ONNX Runtime CUDA inference images/s of the exported network, fp32 vs fp16 (export/quantize.py's
   conversion); skipped with a note when onnxruntime-gpu is not installed.

The results replace the ``gpu`` section of bench/README.md (with the machine line). Without a CUDA GPU it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.results_page import add_page_options, machine_line, publish

NUM_CLASSES = 80  # COCO's label count


@dataclass(frozen=True)
class TrainSetting:
    """One training configuration to time."""

    label: str
    bf16: bool
    channels_last: bool
    compile: bool


SETTINGS = [
    TrainSetting("fp32", bf16=False, channels_last=False, compile=False),
    TrainSetting("bf16 autocast + channels_last", bf16=True, channels_last=True, compile=False),
    TrainSetting("bf16 autocast + channels_last + torch.compile", bf16=True, channels_last=True, compile=True),
]


def gpu_counts(available: int) -> list[int]:
    """The DDP sizes to run: powers of two below ``available``, then ``available`` itself."""
    return [*(2**i for i in range((available - 1).bit_length())), available] if available >= 1 else []


def scaling_rows(images_per_s: dict[int, float]) -> list[tuple[int, float, float]]:
    """(GPUs, images/s, efficiency) with efficiency = images/s / (GPUs x the one-GPU images/s)."""
    one = images_per_s.get(1)
    return [(n, ips, ips / (n * one) if one else float("nan")) for n, ips in sorted(images_per_s.items())]


def build_training(arch: str, setting: TrainSetting, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The network (plain ResNet, linear head) and its Adam optimiser, in the setting's memory format."""
    from models.network import build_model

    model = build_model(arch, NUM_CLASSES, "none", lgconv=False).to(device)
    if setting.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, setting: TrainSetting, batch: int, size: int,
              device: torch.device) -> Callable[[], None]:
    """One optimisation step on a fixed random batch (the data pipeline is not part of the measurement)."""
    x = torch.randn(batch, 3, size, size, device=device)
    if setting.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = (torch.rand(batch, NUM_CLASSES, device=device) < 0.05).float()
    forward = torch.compile(model) if setting.compile else model

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=setting.bf16):
            logits = forward(x)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def time_steps(step: Callable[[], Any], batch: int, steps: int, warmup: int, cuda_sync: bool = True) -> float:
    """Images/s of ``step`` over ``steps`` calls after ``warmup`` calls (CUDA synchronised if ``cuda_sync``)."""
    sync = torch.cuda.synchronize if cuda_sync else lambda: None
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch * steps / (time.perf_counter() - start)


def bench_training(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(setting, images/s) on GPU 0 for each setting."""
    device = torch.device("cuda", 0)
    rows = []
    for setting in SETTINGS:
        if setting.compile and not args.compile:
            continue
        model, optimizer = build_training(args.arch, setting, device)
        step = make_step(model, optimizer, setting, args.batch_size, args.image_size, device)
        rows.append((setting.label, time_steps(step, args.batch_size, args.steps, args.warmup)))
        print(f"train {setting.label}: {rows[-1][1]:.1f} img/s", file=sys.stderr)
        del model, optimizer, step
        torch.cuda.empty_cache()
    return rows


def ddp_worker(args: argparse.Namespace) -> None:
    """One torchrun rank: DDP over the bf16 + channels_last step; rank 0 writes the global images/s."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    setting = SETTINGS[1]
    model, optimizer = build_training(args.arch, setting, device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank])
    step = make_step(ddp, optimizer, setting, args.batch_size, args.image_size, device)
    dist.barrier()
    per_rank = time_steps(step, args.batch_size, args.steps, args.warmup)
    total = torch.tensor([per_rank], device=device)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        Path(args.ddp_worker).write_text(json.dumps({"world": dist.get_world_size(), "images_per_s": total.item()}))
    dist.destroy_process_group()


def bench_ddp(args: argparse.Namespace, folder: Path) -> dict[int, float]:
    """Global images/s per DDP size, each launched with torchrun as its own job."""
    results: dict[int, float] = {}
    for n in gpu_counts(torch.cuda.device_count()):
        out = folder / f"ddp-{n}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
               "-m", "bench.gpu", "--ddp-worker", str(out), "--arch", args.arch, "--image-size",
               str(args.image_size), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            print(f"DDP on {n} GPU(s) failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        results[n] = float(json.loads(out.read_text())["images_per_s"])
        print(f"DDP {n} GPU(s): {results[n]:.1f} img/s", file=sys.stderr)
    return results


def bench_onnx(args: argparse.Namespace, folder: Path) -> list[tuple[str, float]] | str:
    """(precision, images/s) with ONNX Runtime's CUDA provider, or a note why it did not run."""
    import onnxruntime as ort

    from export import convert_fp16, export_to_file
    from models.checkpoint import ModelMeta
    from models.network import build_model

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "ONNX Runtime has no CUDAExecutionProvider here (pip install onnxruntime-gpu): skipped"
    meta = ModelMeta(classes=[f"c{i}" for i in range(NUM_CLASSES)], arch=args.arch, image_size=args.image_size)
    fp32, fp16 = folder / "model.onnx", folder / "model-fp16.onnx"
    export_to_file(build_model(args.arch, NUM_CLASSES, "none", lgconv=False).eval(), meta, fp32)
    convert_fp16(fp32, fp16)
    x = np.random.default_rng(0).standard_normal((args.infer_batch, 3, args.image_size, args.image_size),
                                                 dtype=np.float32)
    rows = []
    for label, path in (("fp32", fp32), ("fp16", fp16)):
        session = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        run = partial(session.run, None, feed)
        rows.append((label, time_steps(run, args.infer_batch, args.steps, args.warmup, cuda_sync=False)))
        print(f"ONNX Runtime CUDA {label}: {rows[-1][1]:.1f} img/s", file=sys.stderr)
    return rows


def to_markdown(args: argparse.Namespace, train: list[tuple[str, float]], ddp: dict[int, float],
                onnx: list[tuple[str, float]] | str, machine: str) -> str:
    """The results section: machine line, command and the three tables."""
    base = train[0][1] if train else float("nan")
    lines = ["## GPU: training throughput, DDP scaling, ONNX Runtime CUDA", "", machine, "",
             f"Command: `{shlex.join(['python', '-m', 'bench.gpu', *args.argv])}`", "",
             f"Training, {args.arch} @ {args.image_size} px, batch {args.batch_size} per GPU, Adam, random data, "
             f"{args.steps} timed steps after {args.warmup}:", "",
             "| setting | img/s (1 GPU) | vs fp32 |", "|---|---:|---:|"]
    lines += [f"| {label} | {ips:.1f} | {ips / base:.2f}x |" for label, ips in train]
    lines += ["", "DDP (bf16 + channels_last, torchrun, NCCL), global img/s:", "",
              "| GPUs | img/s | scaling efficiency |", "|---:|---:|---:|"]
    lines += [f"| {n} | {ips:.1f} | {eff:.0%} |" for n, ips, eff in scaling_rows(ddp)]
    lines += ["", f"ONNX Runtime CUDA inference, batch {args.infer_batch}:", ""]
    if isinstance(onnx, str):
        lines.append(onnx)
    else:
        lines += ["| precision | img/s |", "|---|---:|"] + [f"| {label} | {ips:.1f} |" for label, ips in onnx]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m bench.gpu`` argument parser."""
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="resnet50", help="backbone. Default: resnet50")
    p.add_argument("--image-size", type=int, default=448, help="input side in pixels. Default: 448")
    p.add_argument("--batch-size", type=int, default=32, help="training batch per GPU. Default: 32")
    p.add_argument("--infer-batch", type=int, default=64, help="ONNX Runtime inference batch. Default: 64")
    p.add_argument("--steps", type=int, default=30, help="timed steps (or runs) per measurement. Default: 30")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before each measurement "
                   "(torch.compile compiles here). Default: 10")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile setting")
    p.add_argument("--no-write", dest="write", action="store_false",
                   help="print the results instead of replacing the section of the results page")
    add_page_options(p, "gpu")
    p.add_argument("--ddp-worker", metavar="JSON", help=argparse.SUPPRESS)  # internal: one torchrun rank
    return p


def main(argv: list[str] | None = None) -> int:
    """Run every part on the visible GPUs, write the results section; exit 0 without a GPU."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if min(args.image_size, args.batch_size, args.steps, args.infer_batch) < 1 or args.warmup < 0:
        build_parser().error("--image-size, --batch-size, --infer-batch and --steps must be >= 1, --warmup >= 0")
    if args.ddp_worker:
        ddp_worker(args)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to benchmark (run python -m bench.gpu on a machine with NVIDIA GPUs)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        train = bench_training(args)
        ddp = bench_ddp(args, Path(tmp))
        onnx = bench_onnx(args, Path(tmp))
    markdown = to_markdown(args, train, ddp, onnx, machine_line(gpu=True))
    if args.write:
        publish(args.section or "gpu", markdown, args.page)
    else:
        print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
