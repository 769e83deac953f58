"""What a new user's first runs cost on this machine: ``python -m bench.first_run``.

Runs the commands README gives figures for, each as its own process with the state a new user has, and times them:

- **quick start**: ``python -m train`` (method ``an`` on the built-in data, every default) with an empty cache, so
  the built-in images are generated as on a first run, then ``python -m export`` of that run;
- **own-data fine-tune**: ``python -m train --data DATA --epochs 1`` (the own-data defaults: EfficientNet-Lite0
  ImageNet, 224 px), DATA a real image set (default: the clip art sorted into one folder per drawing, the layout of
  a user's folders): the epoch's training seconds per 1,000 training images, and the run's wall time;
- **head only**: ``python -m train --data DATA --trainable head`` twice, the first with no cached features (the
  feature pass over train, val and test plus the head's epochs), the second with them cached: the feature pass per
  1,000 images is the difference of the two wall times over the images of the three splits; a head epoch is the
  second run's training seconds per epoch.

Every run gets a fresh ``SPML_CACHE`` holding links to the real cache's rendered datasets (never its built-in images
or its features), and a temporary runs folder. ``--repeats`` runs each step that many times, interleaved (quick start,
fine-tune, head, then the reverse); the table gives the median (min-max). The table, the commands and the machine
(with its load average) go to section ``first-run`` of the results page.
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
from pathlib import Path
from typing import Any

from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.timing import Spread, interleaved_order
from models.data.builtin import cache_root

DEFAULT_DATA = "openclipart?view=folders"
#: Cache entries never linked into a run's fresh cache: a first run computes them.
COMPUTED_BY_A_FIRST_RUN = ("builtin", "features")
#: The measured steps (``--steps``), each a method of :class:`Steps` (``-`` -> ``_``).
STEPS = ("quick-start", "fine-tune", "head-only")


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

    def _add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def quick_start(self) -> None:
        """``python -m train`` from an empty cache, then ``python -m export``."""
        cache, runs = self._folders()
        seconds, run = run_command(["train", *self.extra], cache, runs)
        self._add("quick_start_train", seconds)
        assert run is not None
        self._add("quick_start_export", run_command(["export", str(run)], cache, runs)[0])

    def fine_tune(self) -> None:
        """One epoch of the own-data default fine-tune."""
        cache, runs = self._folders()
        seconds, run = run_command(["train", "--data", self.data, "--epochs", "1", *self.extra], cache, runs)
        assert run is not None
        info = read_run(run)
        self.notes["fine_tune_images"] = info["images"]
        self._add("fine_tune_wall", seconds)
        self._add("fine_tune_epoch_per_1000", 1000 * info["train_seconds"][0] / info["images"]["train"])

    def head_only(self) -> None:
        """``--trainable head`` with no cached features, then again with them cached."""
        cache, runs = self._folders()
        head = ["train", "--data", self.data, "--trainable", "head", *self.extra]
        cold, _ = run_command(head, cache, runs)
        warm, run = run_command(head, cache, runs)
        assert run is not None
        info = read_run(run)
        images = info["images"]["train"] + info["images"]["val"]  # the feature cache's splits (test: full network)
        self.notes["head_images"] = info["images"]
        self.notes["head_epochs"] = len(info["train_seconds"])
        self._add("head_cold_wall", cold)
        self._add("head_warm_wall", warm)
        self._add("feature_pass_per_1000", 1000 * (cold - warm) / images)
        self._add("head_epoch", sum(info["train_seconds"]) / len(info["train_seconds"]))


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
    lines = [
        "## First runs on this machine: the quick start, an own-data fine-tune, a head-only run", "",
        f"Command: `{command}`", "", machine_line(), "",
        "Each step is its own process with a fresh cache (links to the rendered datasets only: the built-in images and "
        f"the features are computed as on a first run) and a fresh runs folder; {repeats} repeat(s) interleaved, "
        f"median (min-max).{sizes}", "",
        "| step | command | measured |",
        "|---|---|---|",
    ]
    if "quick_start_train" in values:
        lines += [f"| quick start, training | `python -m train{plus}` (built-in data generated first) | "
                  f"{minutes('quick_start_train')} |",
                  f"| quick start, export | `python -m export RUN` | {seconds('quick_start_export')} |"]
    if "fine_tune_wall" in values:
        lines.append(f"| own-data fine-tune, one epoch | `python -m train --data {data} --epochs 1{plus}` | "
                     f"{seconds('fine_tune_epoch_per_1000')} per 1,000 training images (run: "
                     f"{minutes('fine_tune_wall')}) |")
    if "head_cold_wall" in values:
        head = notes["head_images"]
        lines += [f"| head only, feature pass | `python -m train --data {data} --trainable head{plus}`, features not "
                  f"cached | {seconds('feature_pass_per_1000')} per 1,000 images (train + val: "
                  f"{head['train'] + head['val']:,}; run: {minutes('head_cold_wall')}) |",
                  f"| head only, the head's epochs | the same, features cached | {seconds('head_epoch', '.1f')} per "
                  f"epoch ({notes['head_epochs']} epochs; run: {minutes('head_warm_wall')}) |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.first_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA,
                        help="the own data of the fine-tune and head-only steps (any --data of python -m train; "
                             "default: %(default)s)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="which steps to measure, comma-separated (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each step, interleaved (default: 1)")
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
        steps = Steps(Path(tmp), args.data, cache_root(), shlex.split(args.train_options))
        calls: dict[str, Callable[[], None]] = {name: getattr(steps, name.replace("-", "_")) for name in order}
        for round_ in range(args.repeats):
            for name in interleaved_order(order, round_):
                print(f"round {round_ + 1}/{args.repeats}: {name} ...", file=sys.stderr, flush=True)
                try:
                    calls[name]()
                except RuntimeError as exc:
                    print(f"python -m bench.first_run: error: {exc}", file=sys.stderr)
                    return 1
                print({k: [round(x, 1) for x in v] for k, v in steps.values.items()}, file=sys.stderr, flush=True)
        values = {name: Spread.of(v) for name, v in steps.values.items()}
        text = to_markdown(values, steps.notes, args.data, args.repeats, command_line("bench.first_run", argv),
                           args.train_options)
    publish(args.section or "first-run", text, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
