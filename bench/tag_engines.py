"""Tagging engines on this machine: the local engine vs the Ray Data engine, same folder, same model.

``python -m bench.tag_engines [--images 300] [--side 448] [--image-size 224] [--cpus 2]`` makes a folder
of JPEGs (``--side`` px, :func:`bench.tag_speed.make_jpegs`) and a random resnet18 exported to ONNX (no
downloads), tags the folder with ``--engine local`` and ``--engine ray`` (a local Ray instance with
``--cpus`` CPUs), checks that both give the same scores, and writes images/s and the Ray engine's start-up
cost to the ``tag-engines`` section of the results page (``--page``, ``--section``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.machine import machine_line
from bench.results_page import add_page_options, command_line, publish
from bench.tag_speed import make_jpegs
from export import export_onnx
from models import ModelMeta, build_model, save_checkpoint
from serve.engines import TagJob, get_engine
from serve.predictor import Predictor


def make_model(root: Path, image_size: int, calibration: Path) -> Path:
    """A random resnet18 (20 classes) exported to ONNX; returns the .onnx path."""
    torch.manual_seed(0)
    meta = ModelMeta(classes=[f"c{i}" for i in range(20)], arch="resnet18", image_size=image_size)
    save_checkpoint(root / "best.pt", build_model("resnet18", 20).state_dict(), meta)
    return export_onnx(root / "best.pt", images=calibration).onnx_path


def time_engine(name: str, folder: Path, onnx: Path, output: Path, batch_size: int) -> float:
    """Seconds the engine takes to tag ``folder`` (model already loaded in the driver)."""
    job = TagJob(str(folder), onnx, output, batch_size=batch_size, existing="overwrite", progress=False)
    predictor = Predictor.load(onnx)
    start = time.perf_counter()
    summary = get_engine(name).run(job, predictor)
    seconds = time.perf_counter() - start
    if summary.failed or summary.tagged == 0:
        raise SystemExit(f"{name} engine: {len(summary.failed)} images failed")
    return seconds


def scores(path: Path) -> dict[str, np.ndarray]:
    """Scores by path of a JSONL run file."""
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["path"]: np.array(list(r["scores"].values())) for r in recs}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results section."""
    parser = argparse.ArgumentParser(prog="python -m bench.tag_engines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=300, help="number of JPEGs (default: %(default)s)")
    parser.add_argument("--side", type=int, default=448, help="JPEG side in pixels (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=224, help="model input size (default: %(default)s)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs given to the Ray instance (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="inference batch (default: %(default)s)")
    add_page_options(parser, "tag-engines")
    args = parser.parse_args(argv)
    if min(args.images, args.side, args.image_size, args.cpus, args.batch_size) < 1:
        parser.error("every option must be >= 1")
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_jpegs(root / "images", args.images, args.side)
        onnx = make_model(root, args.image_size, root / "images")
        local_s = time_engine("local", root / "images", onnx, root / "local.jsonl", args.batch_size)
        joined = ray.is_initialized()  # a running instance (e.g. the tests' one) is reused, not timed
        start = time.perf_counter()
        if not joined:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - start
        first_s = time_engine("ray", root / "images", onnx, root / "ray1.jsonl", args.batch_size)
        warm_s = time_engine("ray", root / "images", onnx, root / "ray2.jsonl", args.batch_size)
        if not joined:
            ray.shutdown()
        a, b = scores(root / "local.jsonl"), scores(root / "ray1.jsonl")
        if a.keys() != b.keys():
            raise SystemExit("the engines tagged different images: the benchmark's comparison is void")
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    startup = ("joined a running instance: not measured" if joined
               else f"{init_s:.1f} s, on top of the first run")
    n = args.images
    command = command_line("bench.tag_engines", argv)
    markdown = f"""## Tagging engines: local vs Ray Data

```
{command}
```

{n} JPEGs of {args.side}x{args.side} px, a random resnet18 at {args.image_size} px exported to ONNX (ONNX Runtime,
CPU), batch {args.batch_size}. Ray: a local instance with {args.cpus} CPUs, one model actor, decoding in Ray tasks.

| engine | seconds | images/s |
|---|---:|---:|
| local (decode threads + one model) | {local_s:.1f} | {n / local_s:.1f} |
| ray, first run (actor start + model load included) | {first_s:.1f} | {n / first_s:.1f} |
| ray, second run on the same instance | {warm_s:.1f} | {n / warm_s:.1f} |

Ray start-up (`ray.init`, local instance): {startup}. Largest score difference
between the engines: {diff:.1e}.

{machine_line()}
"""
    publish(args.section or "tag-engines", markdown, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
