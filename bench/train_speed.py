"""How long training takes on this machine, two benchmarks:

``python -m bench.train_speed`` -- training throughput and peak memory. Each configuration runs in a fresh
subprocess (so peak memory is its own) through the real trainer's ``train_step`` on batches from its DataLoader
(``--input data``, decoding and augmentation included) or on random tensors (``--input synthetic``, model step
only). Section ``train-cpu`` (``train-cuda`` when measured on a GPU) of the results page.

``python -m bench.train_speed first-run`` -- what a new user's first runs cost: the commands README gives figures
for, each as its own process with the state a new user has:

- **quick start**: ``python -m train`` (method ``an`` on the built-in data, every default) with an empty cache, so
  the built-in images are generated as on a first run, then ``python -m export`` of that run;
- **own-data fine-tune**: ``python -m train --data DATA --epochs 1`` (the own-data defaults: EfficientNet-Lite0
  ImageNet, 224 px), DATA a real image set (default: the clip art sorted into one folder per drawing, the layout of
  a user's folders): the epoch's training seconds per 1,000 training images, and the run's wall time;
- **head only**: ``python -m train --data DATA --trainable head`` twice, the first with no cached features (the
  feature pass plus the head's epochs), the second with them cached: the feature pass per 1,000 images is the
  difference of the two wall times over the images of the cached splits; a head epoch is the second run's training
  seconds per epoch.

- **auto, head only**: ``python -m train --data DATA --method auto --trainable head``, features not cached (the
  feature pass, the chooser's cross-fitted heads, the chosen head); ``--sample N`` makes DATA a CSV of its first N
  images as a user holds them (one label per training and validation image, the test images complete).

Every run gets a fresh ``SPML_CACHE`` holding links to the real cache's rendered datasets (never its built-in images
or its features), and a temporary runs folder. ``--repeats`` runs each step that many times, interleaved (quick start,
fine-tune, head, then the reverse); the table gives the median (min-max). Section ``first-run``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import Spread, interleaved_order
from models.data.cache_folders import cache_root

VARIANTS = {"fp32": ("off", "off"), "amp+cl": ("auto", "on"), "amp": ("auto", "off"), "cl": ("off", "on")}


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this process; returns images/s, seconds/step and peak memory."""
    from train import TrainConfig, Trainer

    amp, cl = VARIANTS[spec["variant"]]
    with tempfile.TemporaryDirectory() as runs:
        cfg = TrainConfig(data=spec["data"], arch=spec["arch"], weights=spec.get("weights", "none"),
                          image_size=spec["image_size"], batch_size=spec["batch_size"], workers=spec["workers"],
                          device=spec["device"], amp=amp, channels_last=cl, runs_dir=runs, name="bench",
                          progress=False, epochs=1, scheduler="none", trainable=spec.get("trainable", "all"))
        trainer = Trainer(cfg)
        device = trainer.run.device
        steps, warmup = spec["steps"], spec["warmup"]
        if spec["input"] == "synthetic":
            c = len(trainer.run.classes)
            fixed = {"images": torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size),
                     "observed": torch.zeros(cfg.batch_size, c), "index": torch.arange(cfg.batch_size)}
            batches = iter(lambda: fixed, None)
        else:
            def endless() -> Any:
                while True:
                    yield from trainer.run.train.loader
            batches = endless()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for i in range(warmup + steps):
            if i == warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            trainer.train_step(to_device(next(batches), device, trainer.run.channels_last))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    result = {**spec, "images_per_s": steps * cfg.batch_size / elapsed, "seconds_per_step": elapsed / steps,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        result["gpu"] = torch.cuda.get_device_name(device)
    return result


def to_device(batch: dict[str, torch.Tensor], device: torch.device, channels_last: bool) -> dict[str, torch.Tensor]:
    """A loader's batch on ``device``, its images channels-last when the run trains so (as the trainer's loop)."""
    out = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    for key in out:
        if channels_last and key.startswith("images"):
            out[key] = out[key].contiguous(memory_format=torch.channels_last)
    return out


def _markdown(results: list[dict[str, Any]], command: str) -> str:
    gpu = any("peak_cuda_mb" in r for r in results)
    head = "| arch | weights | px | batch | variant | input | workers | images/s | s/step | peak RSS (MB) |"
    rule = "|---|---|---|---|---|---|---|---|---|---|"
    if gpu:
        head += " peak CUDA (MB) |"
        rule += "---|"
    rows = [f"| {r['arch']} | {r.get('weights', 'none')} | {r['image_size']} | {r['batch_size']} | {r['variant']} | "
            f"{r['input']} | {r['workers']} | {r['images_per_s']:.1f} | {r['seconds_per_step']:.3f} | "
            f"{r['peak_rss_mb']:.0f} |" + (f" {r.get('peak_cuda_mb', float('nan')):.0f} |" if gpu else "")
            for r in results]
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
    """CLI: ``first-run ARGS`` -> :func:`first_run_main`; otherwise run every (arch, variant) in a subprocess and
    write the markdown table."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["first-run"]:
        return first_run_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.train_speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="first-run's options: python -m bench.train_speed first-run --help")
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
    from train import TrainConfig

    workers = TrainConfig().workers if args.workers is None else args.workers
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


# ------------------------------------------------------------------------------------------------------------------
# first-run: whole commands as a new user runs them

DEFAULT_DATA = "openclipart?view=folders"
#: Cache entries never linked into a run's fresh cache: a first run computes them.
COMPUTED_BY_A_FIRST_RUN = ("builtin", "features")
#: The measured steps (``--steps``), each a method of :class:`Steps` (``-`` -> ``_``).
STEPS = ("quick-start", "fine-tune", "head-only", "auto-head")


def fresh_cache(root: Path, real: Path) -> Path:
    """An empty cache folder at ``root`` with links to every entry of ``real`` except the built-in images and the
    feature cache (:data:`COMPUTED_BY_A_FIRST_RUN`)."""
    root.mkdir(parents=True)
    if real.is_dir():
        for entry in real.iterdir():
            if entry.name not in COMPUTED_BY_A_FIRST_RUN:
                (root / entry.name).symlink_to(entry.resolve())
    return root


def run_command(args: list[str], cache: Path, runs: Path) -> tuple[float, Path | None]:
    """Run ``python -m ARGS`` with ``SPML_CACHE=cache`` and ``SPML_RUNS=runs``; returns its wall seconds and the run
    folder it made (the newest in ``runs``, None when it made none). Raises ``RuntimeError`` when it fails."""
    env = {**os.environ, "SPML_CACHE": str(cache), "SPML_RUNS": str(runs)}
    before = set(runs.iterdir()) if runs.is_dir() else set()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args, "--no-progress"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"`python -m {' '.join(args)}` exited {done.returncode}:\n{tail}")
    made = sorted(set(runs.iterdir()) - before, key=lambda p: p.stat().st_mtime) if runs.is_dir() else []
    return seconds, (made[-1] if made else None)


#: The fine-tune step: one epoch of the whole network, end to end from the start.
FINE_TUNE_EPOCH = ["--epochs", "1", "--linear-init", "0"]


def read_run(run: Path) -> dict[str, Any]:
    """Training images and every epoch's training seconds of a finished run folder (its config.json and
    metrics.jsonl)."""
    config = json.loads((run / "config.json").read_text())
    splits = config["resolved"]["splits"]
    counts = {name: int(splits.split(f"{name} ", 1)[1].split()[0].rstrip(",")) for name in ("train", "val", "test")}
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"images": counts, "train_seconds": [float(e["train_seconds"]) for e in epochs if "train_seconds" in e]}


class Steps:
    """The three measured steps; each call runs one repeat in fresh folders under ``tmp`` and appends its
    figures to :attr:`values`."""

    def __init__(self, tmp: Path, data: str, real_cache: Path, extra: list[str] | None = None) -> None:
        self.tmp, self.data, self.real_cache, self.extra = tmp, data, real_cache, list(extra or [])
        self.values: dict[str, list[float]] = {}
        self.notes: dict[str, Any] = {}
        self._count = 0

    def _folders(self) -> tuple[Path, Path]:
        self._count += 1
        base = self.tmp / f"r{self._count}"
        return fresh_cache(base / "cache", self.real_cache), base / "runs"

    def _add(self, **values: float) -> None:
        for name, value in values.items():
            self.values.setdefault(name, []).append(value)

    def quick_start(self) -> None:
        """``python -m train`` from an empty cache, then ``python -m export``."""
        cache, runs = self._folders()
        seconds, run = run_command(["train", *self.extra], cache, runs)
        self._add(quick_start_train=seconds)
        assert run is not None
        self._add(quick_start_export=run_command(["export", str(run)], cache, runs)[0])

    def fine_tune(self) -> None:
        """One epoch of the own-data default fine-tune's whole network (without LinearInit's head phase, which the
        head-only step times)."""
        cache, runs = self._folders()
        seconds, run = run_command(["train", "--data", self.data, *FINE_TUNE_EPOCH, *self.extra], cache, runs)
        assert run is not None
        info = read_run(run)
        self.notes["fine_tune_images"] = info["images"]
        self._add(fine_tune_wall=seconds,
                  fine_tune_epoch_per_1000=1000 * info["train_seconds"][0] / info["images"]["train"])

    def head_only(self) -> None:
        """``--trainable head`` with no cached features, then again with them cached."""
        cache, runs = self._folders()
        head = ["train", "--data", self.data, "--trainable", "head", *self.extra]
        cold, _ = run_command(head, cache, runs)
        warm, run = run_command(head, cache, runs)
        assert run is not None
        info = read_run(run)
        images = info["images"]["train"] + info["images"]["val"]  # the feature cache's splits (test: full network)
        self.notes.update(head_images=info["images"], head_epochs=len(info["train_seconds"]))
        self._add(head_cold_wall=cold, head_warm_wall=warm, feature_pass_per_1000=1000 * (cold - warm) / images,
                  head_epoch=sum(info["train_seconds"]) / len(info["train_seconds"]))

    def auto_head(self) -> None:
        """``--method auto --trainable head`` with no cached features."""
        cache, runs = self._folders()
        seconds, run = run_command(["train", "--data", self.data, "--method", "auto", "--trainable", "head",
                                    *self.extra], cache, runs)
        assert run is not None
        self.notes["auto_images"] = read_run(run)["images"]
        self._add(auto_head_wall=seconds)


def sample_csv(spec: str, count: int, folder: Path, seed: int = 0) -> str:
    """``csv:`` spec of a labels.csv in ``folder``: the first ``count`` images of the dataset ``spec`` (train, val,
    test, in their order), each training and validation image with ONE of its labels (drawn with ``seed``), test
    images with all of theirs: a user's own data of that size."""
    import numpy as np

    from models.data.registry import load_dataset

    data = load_dataset(spec)
    rng = np.random.default_rng(seed)
    rows = ["image,labels,split"]
    for split in ("train", "val", "test"):
        part = getattr(data, split)
        for path, labels in zip(part.paths, part.labels, strict=True) if part is not None else []:
            if len(rows) > count:
                break
            names = [data.classes[j] for j in np.flatnonzero(labels)]
            given = names if split == "test" else [names[int(rng.integers(len(names)))]]
            rows.append(f"{path},{';'.join(given)},{split}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return f"csv:{folder / 'labels.csv'}"


def to_markdown(values: dict[str, Spread], notes: dict[str, Any], data: str, repeats: int, command: str,
                extra: str = "") -> str:
    """The results section (``extra``: the options added to every ``python -m train``)."""
    plus = f" {extra}" if extra else ""
    def minutes(name: str) -> str:
        return values[name].scaled(1 / 60).text(".1f", " min")

    def seconds(name: str, spec: str = ".0f") -> str:
        return values[name].text(spec, " s")

    first = notes.get("fine_tune_images") or notes.get("head_images") or {}
    sizes = (f" `{data}`: {first['train']:,} training, {first['val']:,} validation, {first['test']:,} test images."
             if first else "")
    parts = [title for key, title in (("quick_start_train", "the quick start"),
                                      ("fine_tune_wall", "an own-data fine-tune"),
                                      ("head_cold_wall", "a head-only run"),
                                      ("auto_head_wall", "`--method auto` on fixed features")) if key in values]
    lines = [
        f"## First runs on this machine: {', '.join(parts)}", "",
        f"Command: `{command}`", "", machine_line(), "",
        "Each step is its own process with a fresh cache (links to the rendered datasets only: the built-in images and "
        f"the features are computed as on a first run) and a fresh runs folder; {repeats} repeat(s) interleaved, "
        f"median (min-max).{sizes}", "", "| step | command | measured |", "|---|---|---|"]
    if "quick_start_train" in values:
        lines += [f"| quick start, training | `python -m train{plus}` (built-in data generated first) | "
                  f"{minutes('quick_start_train')} |",
                  f"| quick start, export | `python -m export RUN` | {seconds('quick_start_export')} |"]
    if "fine_tune_wall" in values:
        lines.append(f"| own-data fine-tune, one epoch | `python -m train --data {data} {shlex.join(FINE_TUNE_EPOCH)}"
                     f"{plus}` | {seconds('fine_tune_epoch_per_1000')} per 1,000 training images (run: "
                     f"{minutes('fine_tune_wall')}) |")
    if "head_cold_wall" in values:
        head = notes["head_images"]
        lines += [f"| head only, feature pass | `python -m train --data {data} --trainable head{plus}`, features not "
                  f"cached | {seconds('feature_pass_per_1000')} per 1,000 images (train + val: "
                  f"{head['train'] + head['val']:,}; run: {minutes('head_cold_wall')}) |",
                  f"| head only, the head's epochs | the same, features cached | {seconds('head_epoch', '.1f')} per "
                  f"epoch ({notes['head_epochs']} epochs; run: {minutes('head_warm_wall')}) |"]
    if "auto_head_wall" in values:
        auto = notes["auto_images"]
        lines.append(f"| `--method auto`, head only | `python -m train --data {data} --method auto --trainable head"
                     f"{plus}`, features not cached | {minutes('auto_head_wall')} ({auto['train'] + auto['val']:,} "
                     f"training and validation images, {auto['test']:,} test) |")
    return "\n".join(lines) + "\n"


def first_run_main(argv: list[str]) -> int:
    """``python -m bench.train_speed first-run ARGS``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.train_speed first-run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA,
                        help="the own data of the fine-tune and head-only steps (any --data of python -m train; "
                             "default: %(default)s)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="which steps to measure, comma-separated (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each step, interleaved (default: 1)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="the steps' data: the first N images of DATA as a user holds them (one label per "
                             "training and validation image; a CSV in a temporary folder). Default: DATA as it is")
    parser.add_argument("--train-options", default="", metavar="TEXT",
                        help="options added to every python -m train of the steps, e.g. '--arch resnet18' (default: "
                             "none: README's commands as they are)")
    add_page_options(parser, "first-run")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    order = [name.strip() for name in args.steps.split(",") if name.strip()]
    unknown = [name for name in order if name not in STEPS]
    if unknown or not order:
        parser.error(f"--steps: unknown step(s) {', '.join(unknown) or '(none given)'}; steps: {', '.join(STEPS)}")
    with tempfile.TemporaryDirectory(prefix="spml-first-run-") as tmp:
        data = sample_csv(args.data, args.sample, Path(tmp) / "sample") if args.sample else args.data
        steps = Steps(Path(tmp), data, cache_root(), shlex.split(args.train_options))
        calls: dict[str, Callable[[], None]] = {name: getattr(steps, name.replace("-", "_")) for name in order}
        for round_ in range(args.repeats):
            for name in interleaved_order(order, round_):
                print(f"round {round_ + 1}/{args.repeats}: {name} ...", file=sys.stderr, flush=True)
                try:
                    calls[name]()
                except RuntimeError as exc:
                    print(f"python -m bench.train_speed first-run: error: {exc}", file=sys.stderr)
                    return 1
                print({k: [round(x, 1) for x in v] for k, v in steps.values.items()}, file=sys.stderr, flush=True)
        values = {name: Spread.of(v) for name, v in steps.values.items()}
        command = command_line("bench.train_speed", ["first-run", *argv])
        shown = f"{args.data} (its first {args.sample:,} images, one label each)" if args.sample else args.data
        text = to_markdown(values, steps.notes, shown, args.repeats, command, args.train_options)
    publish(args.section or "first-run", text, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
