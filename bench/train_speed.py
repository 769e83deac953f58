"""Training throughput and peak memory benchmark: ``python -m bench.train_speed``.

Each configuration runs in a fresh subprocess (so peak memory is its own) through the real trainer's
``train_step`` on batches from its DataLoader (``--input data``, decoding and augmentation included) or on
random tensors (``--input synthetic``, model step only). The table, the command and the machine go to section
``train-cpu`` (``train-cuda`` when measured on a GPU) of the results page.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from typing import Any

import torch

from bench.results_page import add_page_options, command_line, machine_line, publish

VARIANTS = {"fp32": ("off", "off"), "amp+cl": ("auto", "on"), "amp": ("auto", "off"), "cl": ("off", "on")}


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this process; returns images/s, seconds/step and peak memory."""
    import tempfile

    from train.config import TrainConfig
    from train.trainer import Trainer

    amp, cl = VARIANTS[spec["variant"]]
    with tempfile.TemporaryDirectory() as runs:
        cfg = TrainConfig(data=spec["data"], arch=spec["arch"], weights=spec.get("weights", "none"),
                          image_size=spec["image_size"], batch_size=spec["batch_size"], workers=spec["workers"],
                          device=spec["device"], amp=amp, channels_last=cl, runs_dir=runs, name="bench",
                          progress=False, epochs=1, scheduler="none", trainable=spec.get("trainable", "all"))
        trainer = Trainer(cfg)
        device = trainer.device
        steps, warmup = spec["steps"], spec["warmup"]
        if spec["input"] == "synthetic":
            c = len(trainer.classes)
            fixed = {"images": torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size),
                     "observed": torch.zeros(cfg.batch_size, c), "index": torch.arange(cfg.batch_size)}
            batches = iter(lambda: fixed, None)
        else:
            def endless() -> Any:
                while True:
                    yield from trainer.train.loader
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
    head = "| arch | weights | px | batch | variant | input | workers | images/s | s/step | peak RSS (MB) |"
    rule = "|---|---|---|---|---|---|---|---|---|---|"
    if gpu:
        head += " peak CUDA (MB) |"
        rule += "---|"
    rows = []
    for r in results:
        row = (f"| {r['arch']} | {r.get('weights', 'none')} | {r['image_size']} | {r['batch_size']} | {r['variant']} | "
               f"{r['input']} | "
               f"{r['workers']} | {r['images_per_s']:.1f} | {r['seconds_per_step']:.3f} | {r['peak_rss_mb']:.0f} |")
        if gpu:
            row += f" {r.get('peak_cuda_mb', float('nan')):.0f} |"
        rows.append(row)
    return "\n".join([
        "## Training throughput", "",
        machine_line(f"python {platform.python_version()}", gpu=gpu), "",
        "Command:", "", "```", command, "```", "",
        "Images/s over the measured steps after warm-up, through the trainer's own `train_step` (forward, "
        "backward, optimiser step); `data` input includes JPEG decoding and augmentation in the DataLoader, "
        "`synthetic` feeds one random batch. Peak RSS is the whole process (model, optimiser, loader).", "",
        head, rule, *rows, "",
    ])


def main(argv: list[str] | None = None) -> int:
    """CLI: run every (arch, variant) in a subprocess and write the markdown table."""
    p = argparse.ArgumentParser(prog="python -m bench.train_speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default="resnet18,resnet50", help="comma-separated ARCH[:WEIGHTS] (weights as "
                   "python -m train --weights, default none; e.g. tf_efficientnet_lite0:imagenet; default: "
                   "%(default)s)")
    p.add_argument("--variants", default="fp32", help=f"comma-separated from {', '.join(VARIANTS)} "
                   "(amp = autocast, cl = channels_last; default: %(default)s)")
    p.add_argument("--data", default="builtin", help="dataset spec as in python -m train (default: %(default)s)")
    p.add_argument("--input", choices=["data", "synthetic"], default="data", help="default: %(default)s")
    p.add_argument("--image-sizes", default="64", help="comma-separated input sides (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    p.add_argument("--steps", type=int, default=20, help="measured steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="default: %(default)s")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the trainer's)")
    p.add_argument("--device", default="auto", help="default: %(default)s")
    add_page_options(p, "train-cpu, or train-cuda when measured on a GPU")
    p.add_argument("--worker-spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_spec:
        print("RESULT " + json.dumps(run_one(json.loads(args.worker_spec))), flush=True)
        return 0
    from train.config import default_workers

    workers = default_workers() if args.workers is None else args.workers
    results = []
    configurations = [(entry, int(size), variant) for entry in args.archs.split(",")
                      for size in args.image_sizes.split(",") for variant in args.variants.split(",")]
    for entry, size, variant in configurations:
        if variant not in VARIANTS:
            p.error(f"unknown variant {variant!r}")
        arch, _, weights = entry.partition(":")
        spec = {"arch": arch, "variant": variant, "data": args.data, "input": args.input, "image_size": size,
                "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup, "workers": workers,
                "device": args.device, "weights": weights or "none"}
        proc = subprocess.run([sys.executable, "-m", "bench.train_speed", "--worker-spec", json.dumps(spec)],
                              capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"benchmark of {arch}/{variant} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        result = json.loads(lines[-1][len("RESULT "):])
        results.append(result)
        print(f"{arch:>9} {size:>4} px {variant:>7}: {result['images_per_s']:8.1f} img/s, peak RSS "
              f"{result['peak_rss_mb']:.0f} MB" + (f", CUDA {result['peak_cuda_mb']:.0f} MB"
                                                   if "peak_cuda_mb" in result else ""))
    section = args.section or ("train-cuda" if "peak_cuda_mb" in results[0] else "train-cpu")
    publish(section, _markdown(results, command_line("bench.train_speed", argv)), args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
