"""Training throughput and peak memory benchmark: ``python -m train.bench``.

Each configuration runs in a fresh subprocess (so peak memory is its own) through the real trainer's
``train_step`` on batches from its DataLoader (``--input data``, decoding and augmentation included) or on
random tensors (``--input synthetic``, model step only). Results go to a markdown file together with the
command that produced them.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

VARIANTS = {"fp32": ("off", "off"), "amp+cl": ("auto", "on"), "amp": ("auto", "off"), "cl": ("off", "on")}


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this process; returns images/s, seconds/step and peak memory."""
    import tempfile

    from train.config import TrainConfig
    from train.trainer import Trainer

    amp, cl = VARIANTS[spec["variant"]]
    with tempfile.TemporaryDirectory() as runs:
        cfg = TrainConfig(data=spec["data"], arch=spec["arch"], image_size=spec["image_size"],
                          batch_size=spec["batch_size"], workers=spec["workers"], device=spec["device"],
                          amp=amp, channels_last=cl, runs_dir=runs, name="bench", progress=False,
                          epochs=1, scheduler="none")
        trainer = Trainer(cfg)
        device = trainer.device
        steps, warmup = spec["steps"], spec["warmup"]
        if spec["input"] == "synthetic":
            c = len(trainer.classes)
            fixed = {"images": torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size),
                     "observed": torch.zeros(cfg.batch_size, c), "full": torch.zeros(cfg.batch_size, c),
                     "index": torch.arange(cfg.batch_size)}
            batches = iter(lambda: fixed, None)
        else:
            def endless() -> Any:
                while True:
                    yield from trainer.train_loader
            batches = endless()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for i in range(warmup + steps):
            if i == warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            trainer.train_step(trainer._to_device(next(batches)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    result = {**spec, "images_per_s": steps * cfg.batch_size / elapsed, "seconds_per_step": elapsed / steps,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        result["gpu"] = torch.cuda.get_device_name(device)
    return result


def _markdown(results: list[dict[str, Any]], command: str) -> str:
    gpu = any("peak_cuda_mb" in r for r in results)
    head = "| arch | px | batch | variant | input | workers | images/s | s/step | peak RSS (MB) |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if gpu:
        head += " peak CUDA (MB) |"
        rule += "---|"
    rows = []
    for r in results:
        row = (f"| {r['arch']} | {r['image_size']} | {r['batch_size']} | {r['variant']} | {r['input']} | "
               f"{r['workers']} | {r['images_per_s']:.1f} | {r['seconds_per_step']:.3f} | {r['peak_rss_mb']:.0f} |")
        if gpu:
            row += f" {r.get('peak_cuda_mb', float('nan')):.0f} |"
        rows.append(row)
    device = results[0].get("gpu") or f"{cpu_name()}, {torch.get_num_threads()} threads"
    return "\n".join([
        "# Training throughput", "",
        f"Measured {datetime.now():%Y-%m-%d} on {device}; torch {torch.__version__}, python "
        f"{platform.python_version()}.", "",
        "Command:", "", "```", command, "```", "",
        "Images/s over the measured steps after warm-up, through the trainer's own `train_step` (forward, "
        "backward, optimiser step); `data` input includes JPEG decoding and augmentation in the DataLoader, "
        "`synthetic` feeds one random batch. Peak RSS is the whole process (model, optimiser, loader).", "",
        head, rule, *rows, "",
    ])


def main(argv: list[str] | None = None) -> int:
    """CLI: run every (arch, variant) in a subprocess and write the markdown table."""
    p = argparse.ArgumentParser(prog="python -m train.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default="resnet18,resnet50", help="comma-separated (default: %(default)s)")
    p.add_argument("--variants", default="fp32", help=f"comma-separated from {', '.join(VARIANTS)} "
                   "(amp = autocast, cl = channels_last; default: %(default)s)")
    p.add_argument("--data", default="builtin", help="dataset spec as in python -m train (default: %(default)s)")
    p.add_argument("--input", choices=["data", "synthetic"], default="data", help="default: %(default)s")
    p.add_argument("--image-size", type=int, default=64, help="default: %(default)s")
    p.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    p.add_argument("--steps", type=int, default=20, help="measured steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="default: %(default)s")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the trainer's)")
    p.add_argument("--device", default="auto", help="default: %(default)s")
    p.add_argument("--output", type=Path, default=None,
                   help="markdown file (default: bench/train-cpu.md or bench/train-cuda.md)")
    p.add_argument("--worker-spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_spec:
        print("RESULT " + json.dumps(run_one(json.loads(args.worker_spec))), flush=True)
        return 0
    from train.config import default_workers

    workers = default_workers() if args.workers is None else args.workers
    results = []
    for arch in args.archs.split(","):
        for variant in args.variants.split(","):
            if variant not in VARIANTS:
                p.error(f"unknown variant {variant!r}")
            spec = {"arch": arch, "variant": variant, "data": args.data, "input": args.input,
                    "image_size": args.image_size, "batch_size": args.batch_size, "steps": args.steps,
                    "warmup": args.warmup, "workers": workers, "device": args.device}
            proc = subprocess.run([sys.executable, "-m", "train.bench", "--worker-spec", json.dumps(spec)],
                                  capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                print(proc.stderr[-3000:], file=sys.stderr)
                print(f"benchmark of {arch}/{variant} failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            result = json.loads(lines[-1][len("RESULT "):])
            results.append(result)
            print(f"{arch:>9} {variant:>7}: {result['images_per_s']:8.1f} img/s, peak RSS "
                  f"{result['peak_rss_mb']:.0f} MB" + (f", CUDA {result['peak_cuda_mb']:.0f} MB"
                                                       if "peak_cuda_mb" in result else ""))
    out = args.output or Path("bench") / ("train-cuda.md" if "peak_cuda_mb" in results[0] else "train-cpu.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m train.bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    out.write_text(_markdown(results, command.strip()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
