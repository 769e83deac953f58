"""Tagging engines on one machine: local vs Ray, images/s after start-up and peak memory, in two regimes.

``python -m bench.tag_engines [--images 1200] [--width 800] [--height 600] [--sizes 64,448] [--cpus 2]
[--repeats 3]`` makes a folder of JPEGs (:func:`bench.tag_speed.make_jpegs`) and, for each network input size, a
random resnet18 exported to ONNX (no downloads): a small input makes decoding the bottleneck, a large one the model.
Each engine runs in a fresh process that tags a one-image folder, then the whole folder (``python -m serve tag``'s
pipeline): images/s after start-up = the images after the first batch of results over the time from its arrival
to the last batch's (so the start-up's spread stays out of it), start-up = t_1. The engines run ``--repeats`` times
each, interleaved (local, ray, then ray, local, ...), so a change in the machine's load hits both: the table gives
the median (min-max) of the runs, and of each round's ray / local ratio; the machine's load average is stated.
Peak memory: the process's peak RSS (the driver, for Ray), and for Ray the peak RSS of its model actors (read from
``/proc`` while it runs).
Ray runs on a local instance with ``--cpus`` CPUs (or joins ``--address``). The run files of both engines must
hold the same images; their largest score difference is reported. The results go to section ``tag-engines``
of the results page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import Spread, interleaved_order

ENGINES = ("local", "ray")


def make_model(root: Path, image_size: int, calibration: Path) -> Path:
    """A random resnet18 (20 classes) at ``image_size`` px, exported to ONNX; returns the .onnx path."""
    import torch

    from export import export_onnx
    from models import ModelMeta, build_model, save_checkpoint

    torch.manual_seed(0)
    meta = ModelMeta(classes=[f"c{i}" for i in range(20)], arch="resnet18", image_size=image_size)
    save_checkpoint(root / "best.pt", build_model("resnet18", 20).state_dict(), meta)
    return export_onnx(root / "best.pt", images=calibration).onnx_path


def peak_rss_mb(pid: int) -> int:
    """Peak resident memory of process ``pid`` (``VmHWM``: unlike ``ru_maxrss``, not inherited from a parent)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next((int(line.split()[1]) // 1024 for line in lines if line.startswith("VmHWM:")), 0)


class ActorMemory:
    """Samples the peak RSS (``VmHWM``) of the Ray model actors (``ray::TagActor`` processes) every 0.2 s."""

    def __init__(self) -> None:
        self.peak_mb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if b"ray::TagActor" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        self.peak_mb = max(self.peak_mb, peak_rss_mb(int(pid)))
                except OSError:
                    continue

    def stop(self) -> int:
        """Stop sampling; the peak in MB."""
        self._stop.set()
        self._thread.join()
        return self.peak_mb


class FirstBatchClock:
    """Wraps an engine (anything with ``score``): notes when its first batch of results arrives, how many images it
    held, and when the last one did, so that the rate after start-up excludes the start-up however long it takes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.first_at: float | None = None
        self.last_at = 0.0
        self.first_images = self.images = 0

    def score(self, job: Any, plan: Any, report: Any) -> Iterator[Any]:
        """The engine's batches, timed."""
        for results in self.engine.score(job, plan, report):
            now = time.perf_counter()
            if self.first_at is None:
                self.first_at, self.first_images = now, len(results)
            self.last_at = now
            self.images += len(results)
            yield results

    def rate(self) -> float | None:
        """Images/s from the first batch's arrival to the last's, over the images after the first batch (None with
        a single batch)."""
        if self.first_at is None or self.last_at <= self.first_at:
            return None
        return (self.images - self.first_images) / (self.last_at - self.first_at)


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: tag ``args.one`` (one image) then ``args.folder`` with ``args.engine``; timings and
    peak memory."""
    from serve import TagJob, get_engine, plan_tagging, run_plan

    def seconds(folder: str, output: Path) -> tuple[float, FirstBatchClock]:
        job = TagJob(folder, Path(args.model), output, engine=args.engine, batch_size=args.batch_size,
                     existing="overwrite", progress=False, address=args.address)
        clock = FirstBatchClock(get_engine(args.engine))
        start = time.perf_counter()
        summary = run_plan(plan_tagging(job), warn=lambda _: None, engine=clock)
        if summary.failed or summary.tagged == 0:
            raise SystemExit(f"{args.engine}: {len(summary.failed)} images failed")
        return time.perf_counter() - start, clock

    init = 0.0
    if args.engine == "local":
        from serve import Predictor  # noqa: F401 - imports (torch...) are this process's start-up, not the runs'
    if args.engine == "ray":
        import ray

        start = time.perf_counter()
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        init = time.perf_counter() - start
    actors = ActorMemory() if args.engine == "ray" else None
    t1, _ = seconds(args.one, Path(args.output).with_suffix(".one.jsonl"))
    tn, clock = seconds(args.folder, Path(args.output))
    peak = peak_rss_mb(os.getpid())
    return {"t1": t1, "tn": tn, "init": init, "driver_mb": peak, "actor_mb": actors.stop() if actors else None,
            "steady": clock.rate()}


def measure(engine: str, model: Path, root: Path, args: argparse.Namespace, round_: int = 0) -> dict[str, Any]:
    """Run one engine in a child process (:func:`run_child`), round ``round_`` of the repeats; its results."""
    output = root / f"{engine}-{model.parent.parent.name}-r{round_}.jsonl"
    cmd = [sys.executable, "-m", "bench.tag_engines", "--child", engine, "--model", str(model), "--folder",
           str(root / "images"), "--one", str(root / "one"), "--output", str(output), "--batch-size",
           str(args.batch_size), "--cpus", str(args.cpus)]  # fmt: skip
    if args.address:
        cmd += ["--address", args.address]
    repo = str(Path(__file__).resolve().parents[1])  # importable by the child and by its Ray workers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{engine} engine failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # from the first batch to the last (robust to the start-up's spread); the difference of the two wall times when
    # the folder was a single batch
    rate = result["steady"] or (args.images - 1) / max(result["tn"] - result["t1"], 1e-3)
    result.update(engine=engine, output=output, rate=rate)
    print(f"{engine} @{model.parent.parent.name} (round {round_ + 1}): {result['rate']:.1f} img/s after start-up",
          file=sys.stderr)
    return result


def scores(path: Path) -> dict[str, list[float]]:
    """Scores by path of a JSONL run file."""
    return {r["path"]: list(r["scores"].values()) for r in map(json.loads, path.read_text().splitlines())}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``, one engine of it) and write its results section."""
    parser = argparse.ArgumentParser(prog="python -m bench.tag_engines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1200, help="number of JPEGs (default: %(default)s)")
    parser.add_argument("--width", type=int, default=800, help="JPEG width in pixels (default: %(default)s)")
    parser.add_argument("--height", type=int, default=600, help="JPEG height in pixels (default: %(default)s)")
    parser.add_argument("--sizes", default="64,448", help="network input sizes, one regime each (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="inference batch (default: %(default)s)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance (default: %(default)s)")
    parser.add_argument("--address", help="join this running Ray instance instead of starting one")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each engine per network, interleaved (default: %(default)s)")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    for hidden in ("--model", "--folder", "--one", "--output"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    add_page_options(parser, "tag-engines")
    args = parser.parse_args(argv)
    if args.child:
        args.engine = args.child
        print(json.dumps(run_child(args)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if min(args.images, args.width, args.height, args.cpus, args.batch_size, args.repeats, *sizes) < 1 \
            or args.images < 2:
        parser.error("every option must be >= 1 (--images >= 2)")
    from bench.tag_speed import make_jpegs

    rows = []
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = make_jpegs(root / "images", args.images, args.width, height=args.height)
        (root / "one").mkdir()
        (root / "one" / paths[0].name).write_bytes(paths[0].read_bytes())
        for size in sizes:
            (root / f"m{size}").mkdir()
            model = make_model(root / f"m{size}", size, paths[0].parent)
            runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in ENGINES}
            for round_ in range(args.repeats):
                for engine in interleaved_order(list(ENGINES), round_):
                    runs[engine].append(measure(engine, model, root, args, round_))
            diff = 0.0
            for local_run, ray_run in zip(runs["local"], runs["ray"], strict=True):
                local, ray = scores(local_run["output"]), scores(ray_run["output"])
                if local.keys() != ray.keys():
                    raise SystemExit("the engines tagged different images: the benchmark's comparison is void")
                diff = max(diff, *(abs(a - b) for key in local for a, b in zip(local[key], ray[key], strict=True)))
            rows.append((size, runs, diff))
    load.append(os.getloadavg()[0])
    publish_results(args, argv, rows, load)
    return 0


def publish_results(args: argparse.Namespace, argv: list[str] | None, rows: list[tuple[int, dict, float]],
                    load: list[float]) -> None:
    """Write the section: one line per regime and engine (median (min-max) over the repeats), the paired ratio, the
    command, the machine and its load (the 1-minute load average at the start and at the end: above the CPU count,
    other work shared the CPUs)."""
    lines = ["## Tagging engines: local vs Ray", "", "```", command_line("bench.tag_engines", argv), "```", "",
             f"{args.images} JPEGs of {args.width}x{args.height} px, random resnet18 exported to ONNX (ONNX Runtime, "
             f"CPU), batch {args.batch_size}; each engine in a fresh process, `python -m serve tag`'s pipeline. Ray: "
             + ("an existing instance" if args.address else f"a local instance with {args.cpus} CPUs") + ", default "
             "layout (one model actor per node, decoding in its threads). img/s after start-up = the images after the "
             "first batch of results over the time from its arrival to the last batch's; start-up = t(1 image), the "
             "wall time of tagging a one-image folder: loading the model (Ray: starting the actor, which imports "
             "torch, and loading the model; the driver's imports and `ray.init` are not included, nor the local "
             "process's imports). Peak RSS: the tagging process (the driver, for Ray) and Ray's model actor, the "
             f"largest of the runs. Each engine ran {args.repeats} time(s), interleaved (local, ray, then ray, "
             "local, ...): img/s and start-up are the median (min-max) of the runs, vs local the median (min-max) of "
             "each round's ratio.", "",
             "| network input | engine | img/s after start-up | vs local | start-up s | peak RSS, process | "
             "peak RSS, model actor | largest score difference |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for size, runs, diff in rows:
        for engine in ENGINES:
            mine = runs[engine]
            rate = Spread.of([r["rate"] for r in mine])
            ratio = Spread.of([r["rate"] / local["rate"] for r, local in zip(mine, runs["local"], strict=True)])
            startup = Spread.of([r["t1"] for r in mine])
            actor_mb = max(r["actor_mb"] or 0 for r in mine)
            actor = f"{actor_mb / 1024:.2f} GB" if actor_mb else "-"
            driver_mb = max(r["driver_mb"] for r in mine)
            lines.append(f"| resnet18 @{size} px | {engine} | {rate.text('.1f')} | {ratio.text('.2f', 'x')} "
                         f"| {startup.text('.1f')} | {driver_mb / 1024:.2f} GB | {actor} | {diff:.1e} |")
    lines += ["", f"{machine_line()} Load average at the start and the end: {load[0]:.1f}, {load[-1]:.1f}.", ""]
    publish(args.section or "tag-engines", "\n".join(lines), args.page)


if __name__ == "__main__":
    sys.exit(main())
