"""Label review with a simulated reviewer: how much test mAP a number of reviewed (image, label) pairs buys.

``python -m bench.review measure [--dev-sets openclipart,tuxpaint] [--seeds 0,1,2] [--budgets 250,500,1000,2000]``
then ``python -m bench.review report``.

On each development set, as the user holds it (one positive per training and validation image; the chooser's
benchmark view, bench/choices.py) and with fixed EfficientNet-Lite0 features (224 px, ``--trainable head``): the
hidden keywords answer every reviewed pair (yes where the label is present, no where it is not), and an ``an`` head
is trained on the enlarged labels (confirmed positives, known negatives), its epoch selected by ``observed-map`` on
the single-positive validation labels, scored on the fully labelled test split. Strategies, each at every budget:

- ``balanced``: the product's suggestions (``python -m train suggest``: cross-fitted ``an`` heads on the training
  images, the unobserved pairs ranked across the set, every class's most likely first, train/suggestions.py), one
  round;
- ``balanced-rounds``: the same in rounds of ``--round`` pairs, the labels (and the cross-fitted heads) updated
  with the answers before the next round;
- ``score``: the suggestions ranked by probability alone (``--order score``), one round;
- ``random``: unobserved pairs drawn uniformly.

Each row also keeps the mAP on the hidden full labels of the validation images at the selected epoch: the
suggestions' order was chosen by it, never by test.

The reference points: ``an`` on the labels as given (0 reviews) and ``an`` on every training label (the full-label
bound: AN with nothing unobserved is BCE); gap closed = (mAP - an) / (full - an). Every answer goes through the
product's ``apply_answers`` (models/data/reviewed_labels.py), the same as ``--review``. Results: one JSON per dev set
and seed under ``runs/review/``; the report writes section ``review-simulated`` of the results page.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.choices import DEV_SETS, TITLES, full_labels_by_path, prepare_with_test
from bench.results_page import add_page_options, machine_line, publish
from models.data.reviewed_labels import apply_answers
from models.evaluation.metrics import mean_average_precision
from models.files.atomic_writes import atomic_write_text
from train.choose import Candidate, fit_candidate, out_of_fold_logits
from train.config import build_parser, config_from_args
from train.cross_fitting import Pool, training_pool
from train.methods import BASELINE
from train.run_setup import RunData
from train.suggestions import rank_pairs

__all__ = ["STRATEGIES", "measure", "report"]

RUNS = Path("runs/review")
STRATEGIES = ("balanced", "balanced-rounds", "score", "random")
LR = 2e-3  # the head's default learning rate (TrainConfig.lr)


def _answers(pairs: list[tuple[str, str]], full: dict[str, np.ndarray], classes: list[str]) -> dict[tuple[str, str],
                                                                                                     bool]:
    """The hidden labels' answer to every pair."""
    column = {c: j for j, c in enumerate(classes)}
    return {(image, label): bool(full[image][column[label]]) for image, label in pairs}


def _with_observed(data: RunData, observed: np.ndarray) -> RunData:
    """``data`` whose training images observe ``observed``."""
    return dataclasses.replace(data, splits=dataclasses.replace(data.splits, train_observed=observed))


class Reviewer:
    """One dev set and seed: the prepared features, the hidden labels and the head that scores a label matrix."""

    def __init__(self, dev_name: str, seed: int) -> None:
        dev = DEV_SETS[dev_name]
        argv = [*dev.train_args, "--data", dev.data, "--seed", str(seed), "--no-progress", "--method", BASELINE]
        self.cfg = config_from_args(build_parser().parse_args(argv))
        self.data, self.model, self.forward, self.features = prepare_with_test(self.cfg)
        self.classes = list(self.data.splits.classes)
        self.full = full_labels_by_path(dev, self.classes, self.data.dataset)
        self.train_full = np.stack([self.full[str(p)] for p in self.data.splits.train.paths])
        self.observed = self.data.splits.train_observed.astype(np.int8)
        assert self.data.splits.test is not None
        self.test_labels = self.data.splits.test.labels
        self.val_full = np.stack([self.full[str(p)] for p in self.data.splits.val.paths])
        self.seed = seed

    def scores(self, observed: np.ndarray) -> dict[str, float]:
        """Val mAP on the hidden full val labels and test mAP of an ``an`` head trained on ``observed``, at the epoch
        ``observed-map`` picks on the single-positive val labels."""
        test_features = self.features["test"].values
        per_epoch: list[tuple[np.ndarray, np.ndarray]] = []

        def observer(candidate: Candidate, epoch: int, model: Any, phase: Any, assessment: Any) -> None:
            import torch

            with torch.inference_mode():
                test = model.head(test_features.to(phase.predictor.device)).float().cpu().numpy()
            per_epoch.append((assessment.logits, test))

        result = fit_candidate(Candidate(BASELINE, LR), self.cfg, _with_observed(self.data, observed), self.model,
                               self.forward, self.features, None, observer=observer)
        if result.failed:
            raise RuntimeError(result.failed)
        val, test = per_epoch[result.best_epoch - 1]
        return {"val_mAP_full": float(mean_average_precision(val, self.val_full)),
                "test_mAP": float(mean_average_precision(test, self.test_labels))}

    def rankings(self, observed: np.ndarray, count: int, orders: tuple[str, ...]) -> dict[str, list[tuple[str, str]]]:
        """The product's top ``count`` suggestions for ``observed`` in each order of ``orders``: one set of
        cross-fitted an heads (train/suggestions.py), ranked every way."""
        data = _with_observed(self.data, observed)
        pool: Pool = training_pool(data, self.features)
        logits, failed = out_of_fold_logits(Candidate(BASELINE, LR), self.cfg, data, self.model, self.forward, pool,
                                            None)
        if failed:
            raise RuntimeError(failed)
        return {order: [(item.image, item.label) for item in rank_pairs(pool, logits, count, order_by=order)[0]]
                for order in orders}

    def random_pairs(self, count: int) -> list[tuple[str, str]]:
        """``count`` unobserved training pairs drawn uniformly (seeded)."""
        rows, columns = np.nonzero(self.observed == 0)
        pick = np.random.default_rng(1000 + self.seed).permutation(len(rows))[:count]
        paths = self.data.splits.train.paths
        return [(str(paths[rows[k]]), self.classes[columns[k]]) for k in pick]

    def reviewed(self, pairs: list[tuple[str, str]], observed: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """``observed`` (default: the labels as given) with the hidden answers to ``pairs`` applied, and how many
        answers were yes."""
        answers = _answers(pairs, self.full, self.classes)
        out, counts = apply_answers(self.observed if observed is None else observed, self.data.splits.train.paths,
                                    self.classes, answers)
        return out, counts.confirmed


def measure(dev_name: str, seed: int, budgets: list[int], round_size: int, out: Path) -> Path:
    """Every strategy at every budget on one dev set and seed; writes ``out/<dev>-seed<S>.json`` (kept when done)."""
    target = out / f"{dev_name}-seed{seed}.json"
    if target.is_file():
        print(f"{target}: done already", flush=True)
        return target
    started = time.perf_counter()
    r = Reviewer(dev_name, seed)
    an, full = r.scores(r.observed), r.scores(r.train_full.astype(np.int8))
    record: dict[str, Any] = {"dev_set": dev_name, "seed": seed, "train_images": len(r.observed),
                              "true_positives_unobserved": int(((r.train_full == 1) & (r.observed == 0)).sum()),
                              "given": an["test_mAP"], "full": full["test_mAP"], "given_val": an["val_mAP_full"],
                              "full_val": full["val_mAP_full"], "budgets": budgets, "round": round_size,
                              "strategies": {}}
    print(f"{dev_name} seed {seed}: {BASELINE} {record['given']:.2f}, full {record['full']:.2f}", flush=True)
    top = max(budgets)
    orders = {**r.rankings(r.observed, top, ("balanced", "score")), "random": r.random_pairs(top)}
    for strategy, order in orders.items():
        rows = []
        for budget in budgets:
            observed, found = r.reviewed(order[:budget])
            rows.append({"reviews": budget, "found": found, **r.scores(observed)})
            print(f"  {strategy} {budget}: found {found}, test mAP {rows[-1]['test_mAP']:.2f}", flush=True)
        record["strategies"][strategy] = rows
    rows, observed, asked = [], r.observed, 0
    while asked < top:
        batch = r.rankings(observed, min(round_size, top - asked), ("balanced",))["balanced"]
        observed, _ = r.reviewed(batch, observed)
        asked += len(batch)
        if asked in budgets:
            found = int(((observed == 1) & (r.observed == 0)).sum())
            rows.append({"reviews": asked, "found": found, **r.scores(observed)})
            print(f"  balanced-rounds {asked}: found {found}, test mAP {rows[-1]['test_mAP']:.2f}", flush=True)
    record["strategies"]["balanced-rounds"] = rows
    record["seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(record, indent=1))
    return target


def _mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.2f}"


def report(out: Path, command: str) -> str:
    """The results page section from every record under ``out``."""
    records: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*-seed*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["dev_set"], []).append(record)
    seconds = sum(r["seconds"] for runs in records.values() for r in runs)
    lines = ["## Label review with a simulated reviewer (fixed EfficientNet-Lite0 features)", "", machine_line(), "",
             f"Command (about {seconds / 60:.0f} minutes in all here):", "", "```", command, "```", "",
             "The hidden keywords answer each reviewed pair: test mAP of an "
             "`an` head on fixed EfficientNet-Lite0 features (224 px) trained on the enlarged labels, by strategy and "
             "number of reviewed (image, label) pairs; mean ± std over seeds. Gap closed = (mAP - an) / (full - an), "
             "where `an` is the head on the labels as given and full the head on every training label. `balanced`: "
             "the product's suggestions (`python -m train suggest`: every class's most likely missing label, then "
             "every class's second, ...), one round; `balanced-rounds`: the same in rounds of 250 with the labels "
             "and the suggesting heads updated in between; `score`: the suggestions by probability alone; `random`: "
             "unobserved pairs drawn uniformly. Found: true labels among the reviewed pairs (the rest became known "
             "negatives). Val gap closed: the same on the hidden full labels of the validation images, by which "
             "the default order was chosen (never by test).", ""]
    for dev_name, runs in records.items():
        an = [r["given"] for r in runs]
        full = [r["full"] for r in runs]
        lines += [f"**{TITLES.get(dev_name, dev_name)}** ({runs[0]['train_images']:,} training images, "
                  f"{runs[0]['true_positives_unobserved']:,} present labels unobserved; {len(runs)} seeds): `an` "
                  f"{_mean_std(an)}, full {_mean_std(full)}.", "",
                  "| strategy | reviews | found (precision) | val gap closed | test mAP | test gap closed (min) | "
                  "per 100 reviews |", "|---|---|---|---|---|---|---|"]
        for strategy in STRATEGIES:
            by_budget: dict[int, list[dict[str, Any]]] = {}
            for run in runs:
                for row in run["strategies"].get(strategy, []):
                    by_budget.setdefault(row["reviews"], []).append({**row, **{k: run[k] for k in (
                        "given", "full", "given_val", "full_val")}})
            for reviews, rows in sorted(by_budget.items()):
                found = np.mean([row["found"] for row in rows])
                gaps = [(row["test_mAP"] - row["given"]) / (row["full"] - row["given"]) * 100 for row in rows]
                val = np.mean([(row["val_mAP_full"] - row["given_val"]) / (row["full_val"] - row["given_val"]) * 100
                               for row in rows])
                lines.append(f"| {strategy} | {reviews:,} | {found:.0f} ({found / reviews:.2f}) | {val:.1f}% | "
                             f"{_mean_std([row['test_mAP'] for row in rows])} | {np.mean(gaps):.1f}% "
                             f"({min(gaps):.1f}%) | {np.mean(gaps) / reviews * 100:.2f}% |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.review", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="simulate the reviews on the dev sets")
    m.add_argument("--dev-sets", default="openclipart,tuxpaint", help="default: %(default)s")
    m.add_argument("--seeds", default="0,1,2", help="default: %(default)s")
    m.add_argument("--budgets", default="250,500,1000,2000", help="reviewed pairs (default: %(default)s)")
    m.add_argument("--round", type=int, default=250, help="pairs per round of 'rounds' (default: %(default)s)")
    m.add_argument("--out", type=Path, default=RUNS)
    r = sub.add_parser("report", help="write the results page's section from the measurements")
    r.add_argument("--out", type=Path, default=RUNS)
    add_page_options(r, "review-simulated")
    args = p.parse_args(argv)
    if args.command == "report":
        publish(args.section or "review-simulated", report(args.out, "python -m bench.review measure\n"
                                                           "python -m bench.review report"), args.page)
        return 0
    budgets = sorted(int(b) for b in args.budgets.split(","))
    if any(b % args.round for b in budgets):
        p.error(f"--budgets must be multiples of --round {args.round}")
    for name in args.dev_sets.split(","):
        if name not in DEV_SETS:
            p.error(f"--dev-sets: unknown {name!r} (choose from {', '.join(DEV_SETS)})")
        for seed in [int(s) for s in args.seeds.split(",")]:
            measure(name, seed, budgets, args.round, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
