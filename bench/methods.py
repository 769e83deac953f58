"""Compare methods on one benchmark: ``python -m bench.methods``.

Trains every (method, seed) pair with the same protocol and budget (the extra arguments after ``--`` go to
``python -m train`` unchanged), each in its own subprocess and run folder ``RUNS_DIR/<method>-seed<seed>``.
Finished runs are reused and interrupted ones resumed, so a long comparison can be continued by running the
same command again; a run folder trained with other settings is an error, never silently reused.
A method name may carry a model option: ``ll-r+boostlu`` trains ``ll-r`` with ``--boostlu`` (its own row and
run folders). ``--warm-start DIR`` starts every run of seed N from the backbone of ``DIR/an-seedN`` (an AN run
with the same arguments, trained first when missing) with a new head: the papers fine-tune pretrained features,
which a from-scratch CPU budget does not give. ``--grid NAME=V1,V2,...`` trains every (method, seed) pair once per value
of a training option (run folders ``<method>-seed<seed>-<NAME><V>``; repeated, once per combination) and keeps the
run with the best validation mAP, as Cole et al. pick each method's learning rate and batch size.

The results table - val-selected test mAP mean +- std over seeds, the gap recovered ``(method - an) /
(bce - an)``, the difference to ``an`` trained with the same seed (mean +- std, and on how many seeds the
method is above), the validation mAP of the best and of the last epoch (a last epoch far below the best one is a
network fitting its wrong targets) and Cole et al.'s label recovery (training-set mAP against the hidden full
labels) - goes to section ``methods-<data>`` of the results page with the exact command, plus a bar plot
(``plots/<section>.png`` beside the page, linked from the section) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from bench.results_page import add_page_options, command_line, machine_line, publish
from models.data.observed_file import OBSERVED_FILE
from models.files.run_folder import BEST, CONFIG_FILE, LAST, METRICS_FILE, SCORES_FILE, SUMMARY_FILE
from train.methods import BASELINE, METHODS, UPPER_BOUND, method_names

# every registered method, the full-label reference bounds first; not iu, which trains on observed negatives that
# the default protocol does not observe
DEFAULT_METHODS = [name for name in method_names() if not METHODS[name].uses_observed_negatives]


def is_reference_bound(method: str) -> bool:
    """Whether ``method`` trains on the full labels (an oracle bound, not a single-positive method)."""
    return method in METHODS and METHODS[method].trains_on_full_labels
# Model options a method name may carry in --methods: METHOD+OPTION trains METHOD with these training flags
VARIANTS: dict[str, list[str]] = {"boostlu": ["--boostlu"]}


class RunMismatch(Exception):
    """An existing run folder was trained with settings other than the ones this comparison asks for."""


def parse_method(spec: str) -> tuple[str, list[str]]:
    """``METHOD[+OPTION...]`` -> (the registered method, the training flags of its :data:`VARIANTS` options), e.g.
    ``ll-r+boostlu`` -> (``ll-r``, ``["--boostlu"]``); ``ValueError`` for an unknown method or option."""
    method, *options = spec.split("+")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} in {spec!r}; known: {', '.join(sorted(METHODS))}")
    unknown = [o for o in options if o not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown option {'+'.join(unknown)!r} in {spec!r}; known: {', '.join(VARIANTS)}")
    return method, [flag for o in options for flag in VARIANTS[o]]


#: How the benchmarks' fine-tunes of pretrained weights train unless their arguments say otherwise (they come
#: after it and win): end to end from the first epoch with BatchNorm statistics updated, the one-cycle schedule and no
#: early stop - the papers' protocol and the package's defaults before its fine-tune defaults (train/config.py,
#: FINE_TUNE_DEFAULTS), so that the published commands keep training what they measured.
END_TO_END_PROTOCOL = ["--linear-init", "0", "--bn-stats", "train", "--scheduler", "onecycle", "--patience", "0"]


def _train_argv(spec: str, seed: int, data: str, runs_dir: Path, name: str, train_args: list[str]) -> list[str]:
    method, variant = parse_method(spec)
    return [*END_TO_END_PROTOCOL, *train_args, *variant, "--data", data, "--method", method, "--seed", str(seed),
            "--runs-dir", str(runs_dir), "--name", name, "--no-progress"]


def check_existing_run(run: Path, argv: list[str]) -> None:
    """Raise :class:`RunMismatch` naming the fields in which ``run``'s saved config differs from the config
    ``python -m train ARGV`` would train (machine-specific fields such as workers or device excepted)."""
    from train.config import MACHINE_FIELDS, TrainConfig, build_parser, config_from_args

    config_path = run / CONFIG_FILE
    if not config_path.is_file():
        return
    stored = TrainConfig.from_dict(json.loads(config_path.read_text())["config"]).to_dict()
    wanted = config_from_args(build_parser().parse_args(argv)).to_dict()
    differ = [f"{key}: {stored.get(key)!r} there, {value!r} here" for key, value in wanted.items()
              if key not in (*MACHINE_FIELDS, "runs_dir", "name") and stored.get(key) != value]
    if differ:
        raise RunMismatch(f"{run} was trained with other settings ({'; '.join(differ)}); use another "
                          "--runs-dir or remove that folder")


def last_epoch_val_map(run: Path) -> float:
    """The validation mAP of the last epoch in ``run``'s metrics file (the better of the model's and its EMA's,
    as the trainer chooses); NaN when the file has none."""
    last = math.nan
    path = run / METRICS_FILE
    if path.is_file():
        for line in filter(str.strip, path.read_text().splitlines()):
            record = json.loads(line)
            values = [float(record[k]) for k in ("val_mAP", "val_mAP_ema") if isinstance(record.get(k), (int, float))]
            if values:
                last = max(values)
    return last


def run_one(method: str, seed: int, data: str, runs_dir: Path, train_args: list[str],
            suffix: str = "", module: str = "train") -> dict[str, Any] | None:
    """Train (or resume, or reuse) the run ``RUNS_DIR/<method>-seed<seed><suffix>`` with ``python -m MODULE`` (the
    product's ``train``, or a benchmark's recording variant of it); returns its summary.json content plus
    ``last_val`` (the last epoch's validation mAP), None if it failed.

    Raises :class:`RunMismatch` when the run folder exists with other settings."""
    run = runs_dir / f"{method}-seed{seed}{suffix}"
    summary = run / SUMMARY_FILE
    check_existing_run(run, _train_argv(method, seed, data, runs_dir, run.name, train_args))
    if summary.is_file():
        print(f"{run.name}: done already", flush=True)
        return {**json.loads(summary.read_text()), "last_val": last_epoch_val_map(run)}
    if (run / LAST).is_file():
        cmd = [sys.executable, "-m", module, "--resume", str(run), "--no-progress"]
    else:
        # stopped before the first last.pt was written: nothing to resume, so start it again - but only when the
        # folder holds nothing but the trainer's own files (anything else stays, and the trainer refuses it)
        leftovers = {p.name for p in run.iterdir()} if run.is_dir() else set()
        if leftovers and leftovers <= {CONFIG_FILE, METRICS_FILE, BEST, OBSERVED_FILE, SCORES_FILE}:
            print(f"{run.name}: interrupted before its first resumable epoch; starting it again", flush=True)
            for name in leftovers:
                (run / name).unlink()
        cmd = [sys.executable, "-m", module, *_train_argv(method, seed, data, runs_dir, run.name, train_args)]
    print(f"{run.name}: {shlex.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd)
    if proc.returncode != 0 or not summary.is_file():
        print(f"{run.name}: FAILED (exit {proc.returncode})", file=sys.stderr, flush=True)
        return None
    return {**json.loads(summary.read_text()), "last_val": last_epoch_val_map(run)}


def parse_grid(spec: str, train_args: list[str]) -> tuple[str, list[str]]:
    """``NAME=V1,V2,...`` -> (``NAME``, values); ``ValueError`` when malformed, when a value repeats or when
    ``--NAME`` is also among the fixed ``train_args``."""
    name, _, values_text = spec.partition("=")
    name = name.strip().removeprefix("--")
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not name or not values:
        raise ValueError(f"--grid takes NAME=V1,V2,... (e.g. linear-init-lr=1e-2,1e-3), got {spec!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"--grid {spec!r} repeats a value")
    if any(a == f"--{name}" or a.startswith(f"--{name}=") for a in train_args):
        raise ValueError(f"--{name} is both in --grid and in the fixed training arguments")
    return name, values


def best_of_grid(method: str, seed: int, data: str, runs_dir: Path, train_args: list[str],
                 grids: list[tuple[str, list[str]]]) -> dict[str, Any] | None:
    """Train ``method`` / ``seed`` once per combination of the grids' values (``--NAME VALUE`` for each grid) and
    return the summary (with ``grid_value``: the values, comma-joined) of the run with the best validation mAP;
    None when every run failed."""
    best: dict[str, Any] | None = None
    names = [name for name, _ in grids]
    for combination in itertools.product(*(values for _, values in grids)):
        flags = [item for name, value in zip(names, combination, strict=True) for item in (f"--{name}", value)]
        suffix = "".join(f"-{name}{value}" for name, value in zip(names, combination, strict=True))
        summary = run_one(method, seed, data, runs_dir, [*train_args, *flags], suffix)
        if summary is not None and (best is None or summary["val"]["mAP"] > best["val"]["mAP"]):
            best = {**summary, "grid_value": ",".join(combination)}
    return best


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std of the finite ``values``; std is NaN (unknown, not 0) for a single value."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def paired_vs_an(summaries: list[dict[str, Any]], an: list[dict[str, Any]]) -> tuple[float, float, int, int]:
    """Test mAP minus ``an``'s on the same training seed, over the seeds both have: (mean, sample std, seeds
    above ``an``, seeds compared). A summary's seed is its ``seed`` key, else its position in the list. Runs
    of one seed share their initialisation, batch order and augmentation (the split and the observed labels
    are the same for every run), so these differences carry less noise than the difference of the means."""
    def by_seed(items: list[dict[str, Any]]) -> dict[int, float]:
        return {int(s.get("seed", i)): s.get("test", {}).get("mAP", math.nan) for i, s in enumerate(items)}

    mine, base = by_seed(summaries), by_seed(an)
    diffs = [mine[seed] - base[seed] for seed in sorted(mine.keys() & base.keys())]
    diffs = [d for d in diffs if not math.isnan(d)]
    mean, std = _mean_std(diffs)
    return mean, std, sum(d > 0 for d in diffs), len(diffs)


def aggregate(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per method: seeds, test / best-val / last-epoch-val / label-recovery mAP mean and std, the gap
    recovered vs an and bce, and the same-seed difference to an (:func:`paired_vs_an`)."""
    rows = []
    for method, summaries in results.items():
        test = _mean_std([s.get("test", {}).get("mAP", math.nan) for s in summaries])
        val = _mean_std([s["val"]["mAP"] for s in summaries])
        last_val = _mean_std([s.get("last_val", math.nan) for s in summaries])
        recovery = _mean_std([s.get("train_recovery", {}).get("mAP", math.nan) for s in summaries])
        rows.append({"method": method, "seeds": len(summaries), "test": test, "val": val, "last_val": last_val,
                     "recovery": recovery, "chosen": [str(s["grid_value"]) for s in summaries if "grid_value" in s],
                     "vs_an": paired_vs_an(summaries, results.get(BASELINE, []))})
    means = {r["method"]: r["test"][0] for r in rows}
    an, bce = means.get(BASELINE, math.nan), means.get(UPPER_BOUND, math.nan)
    for r in rows:
        span = bce - an
        r["gap"] = (r["test"][0] - an) / span if span and not math.isnan(span) and span > 0 else math.nan
    return rows


def _fmt(pair: tuple[float, float]) -> str:
    mean, std = pair
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"  # one seed: no spread to show


def _fmt_vs_an(row: dict[str, Any]) -> str:
    mean, std, above, compared = row["vs_an"]
    if row["method"] == BASELINE:
        return "0"
    if not compared:
        return "n/a"
    spread = "" if math.isnan(std) else f" ± {std:.2f}"
    return f"{mean:+.2f}{spread} ({above}/{compared} above)"


def grid_text(grids: list[tuple[str, list[str]]]) -> str:
    """``value of `--lr` in {1e-3, 1e-4}``, or ``combination of `--lr` in {...} and `--batch-size` in {...}``."""
    parts = [f"`--{name}` in {{{', '.join(values)}}}" for name, values in grids]
    return ("value of " if len(parts) == 1 else "combination of ") + " and ".join(parts)


def markdown(rows: list[dict[str, Any]], command: str, data: str, train_args: list[str], failed: list[str],
             warm_start: Path | None = None, grid: list[tuple[str, list[str]]] | None = None,
             plot_link: str | None = None) -> str:
    """The results section: settings, command, table (with the chosen grid value per seed when ``grid`` is
    given), the methods that do not beat ``an`` and, with ``plot_link``, the bar plot at that relative path."""
    an = next((r["test"][0] for r in rows if r["method"] == BASELINE), math.nan)
    bounds = " and ".join(f"`{name}`" for name in method_names() if is_reference_bound(name))
    lines = [
        f"## Method comparison on `{data}`", "",
        machine_line(gpu=torch.cuda.is_available()), "",
        "Command:", "", "```", command, "```", "",
        f"Training arguments shared by every run: `{shlex.join(train_args) or '(defaults)'}`. Test mAP is the "
        "test-set mAP of the epoch with the best validation mAP (the papers' protocol), mean ± std over seeds. "
        f"Gap recovered = (method - {BASELINE}) / ({UPPER_BOUND} - {BASELINE}). Vs {BASELINE}, same seed = the "
        f"method's test mAP minus that of `{BASELINE}` trained with the same seed (the same initialisation, batch "
        f"order and augmentation), mean ± std over the seeds both have, and on how many of them the method is "
        f"above `{BASELINE}`. Val mAP is the best epoch's; the last epoch's is below it when the network has "
        "started to fit its wrong targets (memorisation). Label recovery = mAP of the best epoch's model on the "
        f"training set against its hidden full labels (Cole et al.). {bounds} train on the full labels: reference "
        "bounds that see labels the other methods do not." + (
            f" Every run of seed N starts from the backbone of `{warm_start}/{BASELINE}-seedN/best.pt` "
            f"(`{BASELINE}` with the same arguments) and a new head (`--weights ... --reset-head`)."
            if warm_start else "") + (
            f" Each method and seed is trained with every {grid_text(grid)}; the run with the best validation "
            "mAP is the one in the table (its value per seed in the last column)." if grid else ""), "",
        f"| method | seeds | test mAP | gap recovered | vs {BASELINE}, same seed | val mAP | val mAP, last epoch | "
        "label recovery mAP |" + (f" chosen {', '.join(f'--{name}' for name, _ in grid)} |" if grid else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if grid else ""),
    ]
    for r in rows:
        gap = "n/a" if math.isnan(r["gap"]) else f"{100 * r['gap']:.0f}%"
        chosen = f" {' / '.join(r['chosen'])} |" if grid else ""
        lines.append(f"| {r['method']} | {r['seeds']} | {_fmt(r['test'])} | {gap} | {_fmt_vs_an(r)} | "
                     f"{_fmt(r['val'])} | {_fmt(r['last_val'])} | {_fmt(r['recovery'])} |{chosen}")
    compared = [r for r in rows if r["method"] != BASELINE and not is_reference_bound(r["method"])]
    if not math.isnan(an) and compared:  # without a baseline row, or with nothing else, there is nothing to compare
        below = [r["method"] for r in compared if r["test"][0] < an]
        lines += ["", f"Methods below `{BASELINE}`: " + (", ".join(below) if below else "none") + "."]
    if failed:
        lines += ["", "Runs that failed (not in the table): " + ", ".join(failed) + "."]
    if plot_link:
        lines += ["", f"![test mAP per method on {data}]({plot_link})"]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, data: str) -> bool:
    """Bar chart of test mAP with std error bars; False (nothing written) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(rows)), 4.0))
    names = [r["method"] for r in rows]
    colours = ["0.6" if is_reference_bound(n) else ("tab:red" if n == BASELINE else "tab:blue") for n in names]
    spreads = [0.0 if math.isnan(r["test"][1]) else r["test"][1] for r in rows]  # one seed: no error bar
    ax.bar(names, [r["test"][0] for r in rows], yerr=spreads, color=colours, capsize=3)
    ax.set_ylabel("test mAP (%)")
    ax.set_title(f"val-selected test mAP on {data} (mean ± std over seeds)")
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def section_for(data: str) -> str:
    """The default results section of a comparison on ``data``: ``methods-<data>`` in section-name characters."""
    return "methods-" + re.sub(r"[^a-z0-9]+", "-", data.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (1 if any run failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    original = list(argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.methods", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python -m bench.methods --seeds 0,1,2 -- --epochs 3")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated; METHOD+boostlu trains "
                   "METHOD with --boostlu (e.g. an,em,ll-r,ll-r+boostlu; default: every method)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default: %(default)s)")
    p.add_argument("--data", default="builtin", help="dataset spec as in python -m train (default: %(default)s)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/compare"), help="default: %(default)s")
    add_page_options(p, "methods-DATA, the plot in plots/SECTION.png beside the page")
    p.add_argument("--warm-start", type=Path, metavar="DIR", help="start every run of seed N from the backbone "
                   "of DIR/an-seedN/best.pt with a new head (--weights FILE --reset-head); DIR/an-seedN is "
                   "trained first, with the same arguments, when missing")
    p.add_argument("--grid", metavar="NAME=V1,V2,...", action="append", help="train each method and seed once "
                   "per value of a training option (e.g. linear-init-lr=1e-2,1e-3,1e-4; repeat for several options: "
                   "every combination) and keep the run with the best validation mAP (Cole et al.'s per-method "
                   "search over batch size x learning rate)")
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for spec in methods:
        try:
            parse_method(spec)
        except ValueError as exc:
            p.error(str(exc))
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error("--seeds takes comma-separated integers")
    if args.warm_start is not None and any(a.startswith(("--weights", "--reset-head")) for a in train_args):
        p.error("--warm-start sets --weights and --reset-head itself; leave them out of the training arguments")
    grid = None
    if args.grid:
        try:
            grid = [parse_grid(spec, train_args) for spec in args.grid]
        except ValueError as exc:
            p.error(str(exc))
        if len({name for name, _ in grid}) < len(grid):
            p.error("--grid names one option twice")
    results: dict[str, list[dict[str, Any]]] = {}
    failed = []
    try:
        for seed in seeds:
            seed_args = list(train_args)
            if args.warm_start is not None:
                if run_one(BASELINE, seed, args.data, args.warm_start, train_args) is None:
                    failed += [f"{method}-seed{seed} (no warm start)" for method in methods]
                    continue
                seed_args += ["--weights", str(args.warm_start / f"{BASELINE}-seed{seed}" / BEST), "--reset-head"]
            for method in methods:
                if grid is None:
                    summary = run_one(method, seed, args.data, args.runs_dir, seed_args)
                else:
                    summary = best_of_grid(method, seed, args.data, args.runs_dir, seed_args, grid)
                if summary is None:
                    failed.append(f"{method}-seed{seed}")
                else:
                    results.setdefault(method, []).append({**summary, "seed": seed})
    except RunMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = {method: results[method] for method in methods if method in results}  # table in --methods order
    rows = aggregate(results)
    section = args.section or section_for(args.data)
    plot_link = f"plots/{section}.png"
    drew = plot(rows, args.page.parent / plot_link, args.data)
    if not drew:
        print("no plot: pip install matplotlib", file=sys.stderr)
    publish(section, markdown(rows, command_line("bench.methods", original), args.data, train_args, failed,
                              args.warm_start, grid, plot_link if drew else None), args.page)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
