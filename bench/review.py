"""Label review per minute of a reviewer's time: ``python -m bench.review measure``, then ``report``.

On each development set as a user holds it (bench/choices.py's view, fixed EfficientNet-Lite0 features), the hidden
keywords answer the product's suggestions (``python -m train suggest``) by plan ``MODE/ROUND/SPLIT``: ``pair`` asks
one (image, label) at a time, ``imageM`` shows an image with at most M (default 5) of its likeliest suggestions as
toggles (from a file of 5,000); every ROUND answers the suggesting heads are retrained and the pairs re-ranked (0:
once); SPLIT ``both`` suggests validation pairs too. At each checkpoint an ``an`` head on the answers so far (through
``--review``'s own code, its epoch picked label-free) is scored on test and on the hidden full val labels.

The time model (``--seconds``): a yes/no question about an image 1.6 s (Papadopoulos et al., CVPR 2016, "We don't need
no bounding-boxes": the mean time to verify a box); each further label judged on an image in view 1.0 s (Bearman et
al., ECCV 2016, "What's the point": image-level labels at 1 s per class); a key press (a tick, a save) 0.28 s (Card,
Moran and Newell 1980, the keystroke-level model's K). An image showing m labels, y ticked: 1.6 + (m-1) + 0.28 (y+1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.choices import DEV_SETS, TITLES, dev_config, full_labels_by_path, prepare_with_test
from bench.choices_report import BASELINE
from bench.results_page import add_page_options, machine_line, publish
from models.data.review_file import AnswerLog
from models.data.reviewed_labels import apply_review
from models.evaluation.metrics import mean_average_precision
from models.files.atomic_writes import atomic_write_text
from train import ORDERS, Candidate, fit_candidate, out_of_fold_logits, rank_pairs, training_pool

__all__ = ["PLANS", "Plan", "measure", "report", "reviewer_seconds"]

RUNS = Path("runs/review")
PLANS = tuple(f"pair/{n}/train/rare" for n in (0, 100, 250)) + tuple(f"{p}/balanced" for p in (
    "pair/0/train", "pair/100/train", "image/100/train", "pair/100/both", "pair/250/train", "pair/50/train",
    "image/0/train", "image2/0/train"))
ANSWERS = (250, 500, 1000)
MINUTES = (10, 20, 30)
SECONDS = (1.6, 1.0, 0.28)  # a question, each further label of an image in view, a key press
TOGGLES = 5  # the Review-by-image tab's default --per-image-toggles
IMAGE_FILE = 5000  # suggestions in the file the image mode reviews
Pair = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the reviewer works: mode, answers per round (0: one ranking), whose pairs, ``--order``, toggles."""

    mode: str
    round: int
    split: str
    order: str
    toggles: int = TOGGLES

    @classmethod
    def parse(cls, text: str) -> Plan:
        """``MODE/ROUND/SPLIT/ORDER``, e.g. ``pair/100/train/rare``; ``imageM``: at most M toggles (``image``: 5)."""
        mode, size, split, order = [*text.split("/"), "", "", ""][:4]
        toggles = (mode[5:] or str(TOGGLES)) if mode.startswith("image") else str(TOGGLES) * (mode == "pair")
        if not (toggles.isdigit() and int(toggles) > 0 and size.isdigit() and split in ("train", "both")) or order \
                not in ORDERS:
            raise ValueError(f"bad plan {text!r}: pair|image|imageM / N >= 0 / train|both / {'|'.join(ORDERS)}")
        return cls(mode[:5], int(size), split, order, int(toggles))


def reviewer_seconds(shown: int, ticked: int, mode: str, seconds: tuple[float, float, float] = SECONDS) -> float:
    """The reviewer's time for one step: a pair (``shown`` 1), or an image with ``shown`` toggles, ``ticked`` yes."""
    question, label, key = seconds
    return question if mode == "pair" else question + label * (shown - 1) + key * (ticked + 1)


class Reviewer:
    """One dev set and seed: the features, the hidden labels, the suggestions and the head that scores answers."""

    def __init__(self, dev_name: str, seed: int, folder: Path) -> None:
        dev = DEV_SETS[dev_name]
        self.cfg = dev_config(dev, seed)[0]
        self.data, self.model, self.forward, self.features = prepare_with_test(self.cfg)
        splits = self.data.splits
        self.full = full_labels_by_path(dev, list(splits.classes), self.data.dataset)
        self.column = {c: j for j, c in enumerate(splits.classes)}
        self.val_full = np.stack([self.full[str(p)] for p in splits.val.paths])
        self.test_labels = splits.test.labels  # type: ignore[union-attr]
        self.folder, self.candidate = folder, Candidate(BASELINE, self.cfg.lr)

    def truth(self, pair: Pair) -> bool:
        """The hidden keywords' answer to ``pair``."""
        return bool(self.full[pair[0]][self.column[pair[1]]])

    def reviewed(self, answers: dict[Pair, bool]) -> Any:
        """The run's splits with ``answers`` applied as ``--review`` applies an answer log."""
        if not answers:
            return self.data.splits
        log = AnswerLog(Path(tempfile.mkdtemp(dir=self.folder)) / "answers.jsonl")
        log.record_many([(image, label, answer) for (image, label), answer in answers.items()])
        return apply_review(self.data.splits, [str(log.path)])[0]

    def ranking(self, answers: dict[Pair, bool], split: str, top: int, order: str) -> list[tuple[str, str, float]]:
        """The product's top ``top`` suggestions given ``answers`` (train/suggestions.py's ranking)."""
        data = dataclasses.replace(self.data, splits=self.reviewed(answers))
        pool = training_pool(data, self.features, held_out_val=split == "both")
        logits, failed = out_of_fold_logits(self.candidate, self.cfg, data, self.model, self.forward, pool, None)
        if failed:
            raise RuntimeError(failed)
        return [(i.image, i.label, float(i.score or 0)) for i in rank_pairs(pool, logits, top, order_by=order)[0]]

    def score(self, splits: Any, train_observed: np.ndarray | None = None) -> dict[str, float]:
        """Test mAP and full-val mAP of an ``an`` head on ``splits`` (``train_observed`` replacing its labels)."""
        if train_observed is not None:
            splits = dataclasses.replace(splits, train_observed=train_observed)
        data = dataclasses.replace(self.data, splits=splits)
        features = {**self.features, "scored": self.features["test"]}
        result = fit_candidate(self.candidate, self.cfg, data, self.model, self.forward, features, None)
        if result.failed or result.val_logits is None or result.scored_logits is None:
            raise RuntimeError(result.failed or "no logits")
        return {"val_mAP_full": float(mean_average_precision(result.val_logits, self.val_full)),
                "test_mAP": float(mean_average_precision(result.scored_logits, self.test_labels))}


def simulate(r: Any, plan: Plan, seconds: tuple[float, float, float]) -> tuple[list[tuple[Pair, bool, float]],
                                                                                     list[float]]:
    """Answer ``plan``'s suggestions until the last checkpoint (``r``: ``ranking`` and ``truth`` as
    :class:`Reviewer`'s): every answer with the reviewer's clock when given, and each ranking's seconds."""
    answered: dict[Pair, bool] = {}
    steps: list[tuple[Pair, bool, float]] = []
    clock, rankings = 0.0, []

    def more() -> bool:
        return len(steps) < max(ANSWERS) or clock < max(MINUTES) * 60 - 1e-6
    while more():
        started = time.perf_counter()
        top = IMAGE_FILE if plan.mode == "image" else plan.round or max(ANSWERS) * 2
        ranked = [row for row in r.ranking(answered, plan.split, top, plan.order) if row[:2] not in answered]
        rankings.append(time.perf_counter() - started)
        if not ranked:
            break
        given = 0
        while ranked and (plan.round == 0 or given < plan.round) and more():
            image = ranked[0][0]
            shown = [ranked[0]] if plan.mode == "pair" else sorted(
                (row for row in ranked if row[0] == image), key=lambda row: -row[2])[:plan.toggles]
            truths = [r.truth(row[:2]) for row in shown]
            clock += reviewer_seconds(len(shown), sum(truths), plan.mode, seconds)
            for row, truth in zip(shown, truths, strict=True):
                answered[row[:2]] = truth
                steps.append((row[:2], truth, clock))
            ranked = [row for row in ranked if row[:2] not in answered]
            given += len(shown)
    return steps, rankings


def measure(dev_name: str, seed: int, plans: list[str], out: Path, seconds: tuple[float, float, float]) -> Path:
    """Every plan on one dev set and seed; writes ``out/<dev>-seed<S>.json`` (plans already there are kept)."""
    target = out / f"{dev_name}-seed{seed}.json"
    record: dict[str, Any] = json.loads(target.read_text()) if target.is_file() else {}
    if not (todo := [p for p in plans if p not in record.get("plans", {})]):
        return target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        r = Reviewer(dev_name, seed, Path(folder))
        if not record:
            train = r.data.splits.train
            full = np.stack([r.full[str(p)] for p in train.paths]).astype(np.int8)
            an, bound = r.score(r.data.splits), r.score(r.data.splits, full)
            record = {"dev_set": dev_name, "seed": seed, "train_images": len(train),
                      "unobserved_present": int(((full == 1) & (r.data.splits.train_observed != 1)).sum()),
                      "given": an, "full": bound, "seconds_model": seconds, "plans": {}}
        for text in todo:
            started, plan = time.perf_counter(), Plan.parse(text)
            steps, rankings = simulate(r, plan, seconds)
            rows = []
            for kind, mark in [("answers", n) for n in ANSWERS] + [("minutes", n) for n in MINUTES]:
                taken = steps[:mark] if kind == "answers" else [s for s in steps if s[2] <= mark * 60 + 1e-6]
                answers = {pair: truth for pair, truth, _ in taken}
                rows.append({"kind": kind, "at": mark, "answers": len(taken), "yes": sum(answers.values()),
                             "minutes": taken[-1][2] / 60 if taken else 0.0, **r.score(r.reviewed(answers))})
                print(f"{dev_name} seed {seed} {text} {mark} {kind}: {len(taken)} answers, test mAP "
                      f"{rows[-1]['test_mAP']:.2f}", flush=True)
            record["plans"][text] = {"rows": rows, "rankings": len(rankings), "ranking_seconds": float(np.mean(
                rankings)), "seconds": round(time.perf_counter() - started, 1)}
            atomic_write_text(target, json.dumps(record, indent=1))
    return target


def _mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=len(values) > 1):.2f}"


def gap_rows(runs: list[dict[str, Any]], plan: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Per checkpoint of ``plan`` over ``runs`` (seeds): answers, yes, minutes, test mAPs, test and val gaps (%)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run in runs:
        an, full = run["given"], run["full"]
        for row in run["plans"].get(plan, {}).get("rows", []):
            gaps = {key: (row[m] - an[m]) / (full[m] - an[m]) * 100 for key, m in (("gap", "test_mAP"),
                                                                                  ("val_gap", "val_mAP_full"))}
            for key, value in {**row, **gaps, "test": row["test_mAP"]}.items():
                out.setdefault((row["kind"], row["at"]), {}).setdefault(key, []).append(value)
    return out


def report(out: Path, section: str = "review-minutes") -> str:
    """The results page section from every record under ``out``, with the commands that make it."""
    records: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*-seed*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["dev_set"], []).append(record)
    seconds = sum(p["seconds"] for runs in records.values() for r in runs for p in r["plans"].values())
    model = next(iter(records.values()))[0]["seconds_model"] if records else SECONDS
    plans = ",".join(p for p in PLANS if any(p in r["plans"] for runs in records.values() for r in runs))
    command = (f"python -m bench.review measure --dev-sets {','.join(records)} --plans {plans} --out {out}\n"
               f"python -m bench.review report --out {out} --section {section}")
    title = "" if out == RUNS else ": " + ", ".join(records)
    lines = [f"## Label review per minute of a reviewer's time{title} (simulated reviewer, fixed Lite0 features)",
             "", machine_line(), "", f"Command (about {seconds / 60:.0f} minutes in all here):", "", "```", command,
             "```", "",
             "Plans MODE/ROUND/SPLIT/ORDER: `pair` asks one (image, label) at a time (the Review tab), `imageM` shows "
             "an image with at most M (`image`: 5) of its likeliest suggestions as toggles (Review by image); ROUND N "
             "re-ranks every N answers (`--rounds`; 0: once); SPLIT `both` asks validation pairs too; ORDER: `train "
             "suggest --order`. Gap closed = (mAP - an) / (full - an), `an` on the labels as given, full on every "
             "training label, on test and on the hidden full val labels (val gap: by which defaults are chosen, never "
             f"by test). Minutes by the time model of bench/review.py (sources there): {model[0]} s per yes/no "
             f"question, {model[1]} s per further label of an image in view, {model[2]} s per key press.", ""]
    summary: dict[str, list[dict[tuple[str, int], dict[str, Any]]]] = {}
    for dev_name, runs in records.items():
        an, full = ([r[k]["test_mAP"] for r in runs] for k in ("given", "full"))
        lines += [f"**{TITLES.get(dev_name, dev_name)}** ({runs[0]['train_images']:,} training images, "
                  f"{runs[0]['unobserved_present']:,} present labels unobserved; {len(runs)} seeds): `an` "
                  f"{_mean_std(an)}, full {_mean_std(full)}. Gap: seeds mean (lowest at 30 min).",
                  "", "| plan | in 30 minutes: answers (yes) | val gap: 500 answers / 30 min | test gap: 250 / 500 / "
                  "1,000 answers | test gap: 10 / 20 / 30 min | test mAP at 30 min |", "|---|---|---|---|---|---|"]
        for plan in [p for p in PLANS if any(p in r["plans"] for r in runs)]:
            c = gap_rows(runs, plan)
            summary.setdefault(plan, []).append(c)
            at = [np.mean(c[k, n]["gap"]) for k, marks in (("answers", ANSWERS), ("minutes", MINUTES)) for n in marks]
            end, half = c["minutes", max(MINUTES)], c["answers", 500]
            lines.append(f"| {plan} | {np.mean(end['answers']):.0f} ({np.mean(end['yes']):.0f}) | "
                         f"{np.mean(half['val_gap']):.1f}% / {np.mean(end['val_gap']):.1f}% "
                         f"| {' / '.join(f'{g:.1f}%' for g in at[:3])} | {' / '.join(f'{g:.1f}%' for g in at[3:])} "
                         f"({min(end['gap']):.1f}%) | {_mean_std(end['test'])} |")
        lines.append("")
    lines += ["**Per plan**, mean over the sets: gap closed at 500 answers and in 30 reviewer minutes, and per minute.",
              "", "| plan | sets | val gap: 500 answers / 30 min | test gap: 500 answers / 30 min | per minute |",
              "|---|---|---|---|---|"]
    for plan, cells in summary.items():
        val, test = ([np.mean([np.mean(c[k][key]) for c in cells]) for k in (("answers", 500), ("minutes", 30))]
                     for key in ("val_gap", "gap"))
        lines.append(f"| {plan} | {len(cells)} | {val[0]:.1f}% / {val[1]:.1f}% | {test[0]:.1f}% / {test[1]:.1f}% | "
                     f"{test[1] / 30:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.review", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="simulate the reviewer on the dev sets")
    m.add_argument("--dev-sets", default="openclipart,tuxpaint,icons-phosphor", help="default: %(default)s")
    m.add_argument("--seeds", default="0,1,2", help="default: %(default)s")
    m.add_argument("--plans", default=",".join(PLANS), help="MODE/ROUND/SPLIT/ORDER,... (default: %(default)s)")
    m.add_argument("--seconds", default=",".join(map(str, SECONDS)), help="the time model: a question, a further "
                   "label of an image in view, a key press (default: %(default)s)")
    m.add_argument("--out", type=Path, default=RUNS)
    r = sub.add_parser("report", help="write the results page's section from the measurements")
    r.add_argument("--out", type=Path, default=RUNS)
    add_page_options(r, "review-minutes")
    args = p.parse_args(argv)
    if args.command == "report":
        section = args.section or "review-minutes"
        publish(section, report(args.out, section), args.page)
        return 0
    plans, names, seconds = args.plans.split(","), args.dev_sets.split(","), args.seconds.split(",")
    try:
        list(map(Plan.parse, plans))
        model, runs = tuple(map(float, seconds)), [(n, int(seed)) for n in names for seed in args.seeds.split(",")]
        if len(model) != 3 or set(names) - set(DEV_SETS):
            raise ValueError(f"--seconds takes three numbers; --dev-sets from {', '.join(DEV_SETS)}")
    except ValueError as exc:
        p.error(str(exc))
    for name, seed in runs:
        measure(name, seed, plans, args.out, model)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
