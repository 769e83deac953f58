"""Where the head's bias should start: ``python -m bench.head_bias``.

Trains every (method, seed) pair twice with the same settings - ``--head-bias default`` (PyTorch's
initialisation) and ``--head-bias prior`` (logit(k / C), the label prior) - and reports the val-selected test mAP
of both, mean ± std over seeds, with the paired difference (prior - default, same seed) and on how many seeds the
prior is above. Runs go to ``RUNS_DIR/<method>-seed<seed>-head-bias<VALUE>`` and are reused when the command is
repeated (:func:`bench.methods.run_one`). The extra arguments after ``--`` go to ``python -m train``; the section
name says which regime was measured (``--section head-bias-fixed-features``, ...).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from bench.methods import _fmt, _mean_std, run_one
from bench.results_page import add_page_options, command_line, machine_line, publish

VALUES = ("default", "prior")


def compare(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per method: test mAP mean/std per head-bias value, and the paired prior - default difference."""
    rows = []
    for method, by_value in results.items():
        row: dict[str, Any] = {"method": method}
        for value in VALUES:
            row[value] = _mean_std([s["test"]["mAP"] for s in by_value.get(value, [])])
        default = {s["seed"]: s["test"]["mAP"] for s in by_value.get("default", [])}
        prior = {s["seed"]: s["test"]["mAP"] for s in by_value.get("prior", [])}
        diffs = [prior[k] - default[k] for k in sorted(default.keys() & prior.keys())]
        row["diff"] = _mean_std(diffs)
        row["above"] = (sum(d > 0 for d in diffs), len(diffs))
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, data: str, train_args: list[str], title: str) -> str:
    """The results section."""
    lines = [f"## Head bias: {title}", "", machine_line(gpu=torch.cuda.is_available()), "", "Command:", "", "```",
             command, "```", "",
             f"`{data}`, training arguments `{shlex.join(train_args)}`; test mAP of the val-selected epoch, mean ± "
             "std over seeds; prior - default is the paired difference on the same seed (same initialisation of "
             "everything else, same batches).", "",
             "| method | default | prior | prior - default | seeds above |", "|---|---|---|---|---|"]
    for r in rows:
        mean, std = r["diff"]
        diff = "n/a" if math.isnan(mean) else (f"{mean:+.2f}" + ("" if math.isnan(std) else f" ± {std:.2f}"))
        lines.append(f"| {r['method']} | {_fmt(r['default'])} | {_fmt(r['prior'])} | {diff} | "
                     f"{r['above'][0]}/{r['above'][1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns 1 if any run failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    original = list(argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.head_bias", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="bce,an,epr", help="comma-separated (default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2", help="default: %(default)s")
    p.add_argument("--data", default="builtin:small", help="default: %(default)s")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/head-bias"), help="default: %(default)s")
    p.add_argument("--title", default="fixed features", help="what the section measured (its heading)")
    add_page_options(p, "head-bias")
    args = p.parse_args(argv)
    if any(a.startswith("--head-bias") for a in train_args):
        p.error("the benchmark sets --head-bias itself")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    failed = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for method in args.methods.split(","):
            for value in VALUES:
                summary = run_one(method, seed, args.data, args.runs_dir, [*train_args, "--head-bias", value],
                                  f"-head-bias{value}")
                if summary is None:
                    failed.append(f"{method}-seed{seed}-{value}")
                    continue
                results.setdefault(method, {}).setdefault(value, []).append({**summary, "seed": seed})
    publish(args.section or "head-bias", markdown(compare(results), command_line("bench.head_bias", original),
                                                  args.data, train_args, args.title), args.page)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
