"""Your own single-positive data, measured end to end: ``python -m bench.own_data``.

A user's data has one label per image in the training AND the validation images. This benchmark builds such
data from built-in datasets whose full labels are known, hides them from every run, and uses them only to
score. Per dataset it writes, under ``RUNS_DIR/data/``:

* ``<dataset>/labels.csv``: the training pool with ONE positive per image (drawn by the protocol's sampler, the
  same draw as ``--observed single``), the test split with all its labels (only the test figures read them);
  the product holds out 20% of the pool as the validation split, single-positive like the rest;
* ``<dataset>-audit/labels.csv``: an audit list, ``--audit-size`` training images with all their labels
  (what a user would label completely by hand).

Per dataset and training seed it trains through the product (:class:`~train.trainer.Trainer`, which sees only
the CSV) three runs: ``an``; ``epr`` with k estimated by the trainer from its validation scores; ``epr`` with the
true k given (``--hp k=...``). Each run selects its epoch as ``python -m train`` does on such data (``--select
auto``: ``an-loss``); :class:`~bench.recording_trainer.RecordingTrainer` keeps every epoch so that the epoch
that full validation labels would have picked (validation mAP, the papers' rule) can be scored too. Reported:

* test mAP of the epoch picked with full val labels vs the label-free pick (target: at most 0.5 lost on
  average);
* k, the expected positives per image: true, estimated (``train.expected_positives``, from the validation
  scores, as ``python -m export`` does for ``pu-f1``; and the ``epr`` run's own estimate), from the audit list;
* test F1 (OF1 overall, CF1 per class) at the label-free epoch with thresholds calibrated on full val labels
  (``f1``) vs positive-only ``pu-f1`` thresholds (``export.calibrate``) with K estimated or from the audit list
  (target: at least 95% of the full-label F1), and tags per image against the true mean.

``--backbone auto`` (default) fine-tunes from a ResNet-18 trained with full labels on ``builtin:default@seed1``
(other images than the benchmark's; trained once into ``RUNS_DIR/backbone`` when missing, then reused): from
random init a CPU budget gives models too weak for the comparisons to mean much. ``--backbone none`` trains from
scratch, ``--backbone FILE`` starts from any checkpoint. Finished runs are reused (their recorded epochs are in
``record.npz``); a run folder trained with other settings is an error.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_line
from bench.methods import RunMismatch, check_existing_run, run_one
from bench.recording_trainer import RecordingTrainer
from bench.results_page import add_page_options, command_line, publish
from export.calibrate import calibrate
from models.atomic_files import atomic_path
from serve.records import sigmoid
from train.config import build_parser, config_from_args
from train.data.audit_list import load_audit
from train.data.csv_format import write_csv
from train.data.observed_spec import ObservedSpec
from train.data.protocol import PROTOCOL_SEED, sample_observed
from train.data.registry import load_dataset
from train.data.types import LabelledImages
from train.expected_positives import estimate_expected_positives, mean_positives
from train.methods import BASELINE, UPPER_BOUND
from train.methods.epr import ExpectedPositiveRegularisation
from train.metrics import f1_scores, mean_average_precision
from train.runs import BEST, SUMMARY_FILE
from train.selection import validation_map

SECTION = "own-data"
RECORD = "record.npz"
DEFAULT_TRAIN_ARGS = ["--epochs", "10", "--lr", "3e-4", "--no-lgconv"]
BACKBONE_DATA = "builtin:default@seed1"
BACKBONE_ARGS = ["--observed", "full", "--epochs", "4", "--no-lgconv"]


@dataclass(frozen=True)
class Variant:
    """One training run per dataset and seed: ``method``, and for EPR where its k comes from (``estimated``: the
    trainer's estimate; ``true``: given with ``--hp k``)."""

    name: str
    method: str
    k: str = ""


EPR = ExpectedPositiveRegularisation.name  # the method whose k the benchmark sets (from the registry)
VARIANTS = (Variant(BASELINE, BASELINE), Variant(f"{EPR}-k-estimated", EPR, "estimated"),
            Variant(f"{EPR}-k-true", EPR, "true"))


@dataclass
class UserData:
    """A benchmark dataset as a user holds it (``spec``: single-positive training images, full test labels),
    its audit list, and the full labels of the training pool by image path, which only the scoring reads."""

    name: str
    spec: str
    audit_spec: str
    classes: list[str]
    pool_full: dict[str, np.ndarray]

    @property
    def true_k(self) -> float:
        """The mean number of positives per image of the training pool's full labels."""
        return mean_positives(np.stack(list(self.pool_full.values())))

    def full_labels(self, paths: list[Path]) -> np.ndarray:
        """The full labels (N, C) of training-pool images ``paths``."""
        return np.stack([self.pool_full[str(Path(p).resolve())] for p in paths])


def folder_name(spec: str) -> str:
    """A dataset spec as a folder name: ``builtin:dense-small`` -> ``builtin-dense-small``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", spec).strip("-").lower()


def make_user_data(spec: str, data_dir: Path, audit_size: int) -> UserData:
    """Write dataset ``spec`` as a user's data (module docstring) into ``data_dir`` and return it."""
    source = load_dataset(spec)
    pool = source.train
    if source.val is not None and len(source.val):
        raise ValueError(f"{spec} has an explicit val split; use a dataset whose val is held out from train")
    if source.test is None or not len(source.test):
        raise ValueError(f"{spec} has no test split to score on")
    if not 0 < audit_size < len(pool):
        raise ValueError(f"--audit-size must be between 1 and {len(pool) - 1} for {spec}")
    single = sample_observed(pool.labels, ObservedSpec("single"), PROTOCOL_SEED) == 1
    folder = data_dir / folder_name(spec)
    csv = write_csv(folder, {"train": LabelledImages(pool.paths, single, pool.classes), "test": source.test})
    audit_rows = np.sort(np.random.default_rng(PROTOCOL_SEED).choice(len(pool), audit_size, replace=False))
    audit_csv = write_csv(folder.with_name(folder.name + "-audit"), {"train": pool.subset(audit_rows)})
    return UserData(spec, f"csv:{csv}", f"csv:{audit_csv}", list(pool.classes),
                    {str(Path(p).resolve()): row for p, row in zip(pool.paths, pool.labels, strict=True)})


def ensure_backbone(choice: str, runs_dir: Path) -> Path | None:
    """The checkpoint to fine-tune from: None for ``none``, the file for a path, and for ``auto`` the backbone
    run ``RUNS_DIR/backbone/bce-seed0`` (trained first when missing)."""
    if choice == "none":
        return None
    if choice != "auto":
        path = Path(choice)
        if not path.is_file():
            raise FileNotFoundError(f"--backbone {choice}: no such checkpoint")
        return path
    folder = runs_dir / "backbone"
    if run_one(UPPER_BOUND, 0, BACKBONE_DATA, folder, BACKBONE_ARGS) is None:
        raise RuntimeError(f"training the backbone in {folder} failed")
    return folder / f"{UPPER_BOUND}-seed0" / BEST


@dataclass
class RunRecord:
    """What one run left for scoring: every epoch's validation logits, the validation labels the run saw
    (single-positive) and their full labels, the test labels and the test logits of the epoch picked with full
    val labels (``clean_epoch``) and of the run's own pick (``selected_epoch``), and its k."""

    val_logits: np.ndarray  # (epochs, N_val, C)
    val_observed: np.ndarray
    val_full: np.ndarray
    test_labels: np.ndarray
    test_clean: np.ndarray
    test_selected: np.ndarray
    clean_epoch: int
    selected_epoch: int
    k: float  # the run's final k (NaN for a method without one)
    k_source: str
    selection: str  # the criterion the run selected its epoch with

    def save(self, path: Path) -> None:
        """Write the record as one ``.npz`` (atomically)."""
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez_compressed(tmp, **{k: np.asarray(v) for k, v in self.__dict__.items()})

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """Read a record written by :meth:`save`."""
        with np.load(path) as z:
            values = {k: z[k] for k in z.files}
        scalars = {"clean_epoch": int, "selected_epoch": int, "k": float, "k_source": str, "selection": str}
        return cls(**{k: scalars[k](v) if k in scalars else v for k, v in values.items()})


def train_and_record(argv: list[str], data: UserData) -> RunRecord:
    """Train ``python -m train ARGV`` with :class:`RecordingTrainer`; the full validation labels pick the epoch
    that val mAP would have picked, after training, and both picks are predicted on the test split."""
    trainer = RecordingTrainer(config_from_args(build_parser().parse_args(argv)))
    summary = trainer.fit()
    val_full = data.full_labels(trainer.splits.val.paths)
    maps = [validation_map(logits, val_full) for logits in trainer.val_logits]
    clean, selected = int(np.argmax(maps)) + 1, int(summary["best_epoch"])
    test_clean = trainer.test_logits(clean)
    test_selected = test_clean if selected == clean else trainer.test_logits(selected)
    k = summary.get("expected_positives") or {}
    assert trainer.splits.test is not None
    return RunRecord(np.stack(trainer.val_logits), np.asarray(trainer.splits.val.labels), val_full,
                     np.asarray(trainer.splits.test.labels), test_clean, test_selected, clean, selected,
                     float(k.get("k", math.nan)), str(k.get("source", "")), str(summary["selection"]))


def run_variant(variant: Variant, data: UserData, seed: int, runs_dir: Path, train_args: list[str],
                backbone: Path | None) -> RunRecord:
    """The record of ``variant`` on ``data`` with ``seed``: read from its run folder when it finished with the
    same settings, else trained (an unfinished folder is started again). Raises :class:`RunMismatch`."""
    run = runs_dir / folder_name(data.name) / f"{variant.name}-seed{seed}"
    argv = [*train_args, "--data", data.spec, "--method", variant.method, "--seed", str(seed),
            "--runs-dir", str(run.parent), "--name", run.name, "--no-progress"]
    if backbone is not None:
        argv += ["--weights", str(backbone), "--reset-head"]
    if variant.k == "true":
        argv += ["--hp", f"k={data.true_k:.4f}"]
    check_existing_run(run, argv)
    if (run / RECORD).is_file() and (run / SUMMARY_FILE).is_file():
        print(f"{data.name} {run.name}: done already", file=sys.stderr, flush=True)
        return RunRecord.load(run / RECORD)
    if run.exists():
        print(f"{data.name} {run.name}: unfinished; training it again", file=sys.stderr, flush=True)
        shutil.rmtree(run)
    print(f"{data.name} {run.name}: python -m train {' '.join(argv)}", file=sys.stderr, flush=True)
    record = train_and_record(argv, data)
    record.save(run / RECORD)
    return record


def _thresholded(probs: np.ndarray, labels: np.ndarray, thresholds: list[float]) -> dict[str, float]:
    t = np.asarray(thresholds)
    return {**f1_scores(probs, labels, t), "tags": float((probs >= t).sum(1).mean())}


def score(record: RunRecord, audit_k: float) -> dict[str, Any]:
    """The figures of one run: test mAP of both picks, and at the run's pick the test F1 and tags per image with
    full-label ``f1`` thresholds and with ``pu-f1`` thresholds (K estimated from the validation scores, and K
    of the audit list), all calibrated on the validation split."""
    e = record.selected_epoch - 1
    val_logits = record.val_logits[e]
    val_probs, test_probs = sigmoid(val_logits), sigmoid(record.test_selected)
    k_estimated = estimate_expected_positives(val_logits, record.val_observed)
    thresholds = {
        "full": calibrate(val_probs, record.val_full, "f1").thresholds,
        "estimated": calibrate(val_probs, record.val_observed, "pu-f1", expected_positives=k_estimated).thresholds,
        "audit": calibrate(val_probs, record.val_observed, "pu-f1", expected_positives=audit_k).thresholds,
    }
    clean = mean_average_precision(record.test_clean, record.test_labels)
    selected = mean_average_precision(record.test_selected, record.test_labels)
    return {"clean_epoch": record.clean_epoch, "selected_epoch": record.selected_epoch, "clean": clean,
            "selected": selected, "lost": clean - selected, "k_estimated": k_estimated,
            "true_tags": float(record.test_labels.sum(1).mean()),
            **{name: _thresholded(test_probs, record.test_labels, t) for name, t in thresholds.items()}}


def _share(part: dict[str, float], whole: dict[str, float], key: str) -> float:
    return 100 * part[key] / whole[key] if whole[key] else math.nan


def _k_text(variant: Variant, record: RunRecord) -> str:
    if not variant.k:
        return "-"
    return f"{record.k:.2f} ({record.k_source}{', final' if record.k_source == 'estimated' else ''})"


def _pct(value: float, truth: float) -> str:
    return f"{value:.2f} ({100 * (value - truth) / truth:+.0f}%)"


def backbone_text(choice: str, backbone: Path | None) -> str:
    """The sentence of the results section that says what the runs start from."""
    if backbone is None:
        return "Every run trains from random init (`--backbone none`)."
    if choice != "auto":
        return f"Every run fine-tunes `{backbone}` with a new head (`--backbone`)."
    return (f"Every run fine-tunes a ResNet-18 trained with full labels on `{BACKBONE_DATA}` (other images; "
            f"`--backbone auto`: `python -m train --data {BACKBONE_DATA} --method bce {' '.join(BACKBONE_ARGS)}`, "
            "trained once) with a new head: from random init this CPU budget gives models too weak to compare.")


def markdown(results: list[dict[str, Any]], command: str, train_args: list[str], backbone: str,
             audit_size: int) -> str:
    """The results section: the settings (``backbone``: :func:`backbone_text`), the command, one row per run and
    one per dataset and seed for k."""
    selection = sorted({r["record"].selection for r in results})
    lines = [
        "## Your own single-positive data: selection, k and thresholds without full labels", "",
        "Built-in data written as a user holds it: a `labels.csv` whose training images carry one positive each "
        "(the protocol's draw; 20% held out as the single-positive validation split) and whose test images carry "
        f"all their labels, plus an audit list of {audit_size} training images with all their labels. Every run "
        "is `python -m train` on that CSV (the full labels of the training and validation images are hidden from "
        "it and read only to score); it selects its epoch with "
        f"{', '.join(f'`{s}`' for s in selection)} (`--select auto` on single-positive val). Full-val pick = the "
        "epoch the validation mAP on full labels would have picked (the papers' rule); lost = its test mAP minus "
        "the label-free pick's. Thresholds are calibrated on the validation split at the label-free pick: `f1` on "
        "the full val labels (the reference), `pu-f1` on the single-positive ones with K estimated from the "
        "validation scores (what `python -m export` does) or K from the audit list (`--audit`); test OF1 / CF1, "
        "as a share of the reference's, and tags per image against the true mean. "
        + backbone,
        "", "```", command, "```", "",
        f"Training arguments of every run: `{' '.join(train_args)}`. " + machine_line(), "",
        "| dataset | seed | run | k | test mAP, full-val pick | test mAP, label-free pick | lost | full-label `f1`: "
        "OF1 / CF1 | `pu-f1`, K estimated: OF1 / CF1 | `pu-f1`, K audit: OF1 / CF1 | tags per image: `f1` / "
        "`pu-f1` est. / `pu-f1` audit / true |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["score"]
        full, est, aud = s["full"], s["estimated"], s["audit"]
        lines.append(
            f"| {r['dataset']} | {r['seed']} | {r['variant'].name} | {_k_text(r['variant'], r['record'])} | "
            f"{s['clean_epoch']}: {s['clean']:.2f} | {s['selected_epoch']}: {s['selected']:.2f} | {s['lost']:+.2f} | "
            f"{full['OF1']:.2f} / {full['CF1']:.2f} | "
            f"{_share(est, full, 'OF1'):.0f}% / {_share(est, full, 'CF1'):.0f}% | "
            f"{_share(aud, full, 'OF1'):.0f}% / {_share(aud, full, 'CF1'):.0f}% | "
            f"{full['tags']:.1f} / {est['tags']:.1f} / {aud['tags']:.1f} / {s['true_tags']:.2f} |")

    def mean(get: Callable[[dict[str, Any]], float]) -> float:
        return float(np.mean([get(r["score"]) for r in results]))

    shares = {f"{name}_{key}": mean(lambda s, n=name, k=key: _share(s[n], s["full"], k))
              for name in ("estimated", "audit") for key in ("OF1", "CF1")}
    lines.append(f"| **mean** | | | | {mean(lambda s: s['clean']):.2f} | {mean(lambda s: s['selected']):.2f} | "
                 f"**{mean(lambda s: s['lost']):+.2f}** | 100% / 100% | "
                 f"**{shares['estimated_OF1']:.1f}% / {shares['estimated_CF1']:.1f}%** | "
                 f"{shares['audit_OF1']:.1f}% / {shares['audit_CF1']:.1f}% | |")
    lines += ["", "k, the expected positives per image (true: the training pool's full labels): estimated from `an`'s "
              "validation scores at its label-free pick (`python -m export`'s K for `pu-f1`), the estimate the "
              "`epr` run ended with, and the audit list's mean.", "",
              "| dataset | seed | true k | estimated, `an` val scores | estimated by the `epr` run | audit list |",
              "|---|---|---|---|---|---|"]
    for r in results:
        if r["variant"].name != BASELINE:
            continue
        epr = next((o["record"] for o in results if o["dataset"] == r["dataset"] and o["seed"] == r["seed"]
                    and o["variant"].k == "estimated"), None)
        truth = r["true_k"]
        lines.append(f"| {r['dataset']} | {r['seed']} | {truth:.2f} | {_pct(r['score']['k_estimated'], truth)} | "
                     f"{_pct(epr.k, truth) if epr is not None else '-'} | {_pct(r['audit_k'], truth)} |")
    lines += ["", f"Targets (issue 33): label-free selection loses at most 0.5 test mAP on average "
              f"({mean(lambda s: s['lost']):+.2f}); `pu-f1` thresholds reach at least 95% of the full-label F1 "
              f"(K estimated: OF1 {shares['estimated_OF1']:.1f}%, CF1 {shares['estimated_CF1']:.1f}%; K from the "
              f"audit list: {shares['audit_OF1']:.1f}%, {shares['audit_CF1']:.1f}%); k within 25% of the truth "
              "(table above)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 for bad arguments or a run folder trained otherwise)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    original = list(argv)
    train_args = list(DEFAULT_TRAIN_ARGS)
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.own_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python -m bench.own_data --seeds 0 -- --epochs 3 --no-lgconv "
                                "(arguments after -- replace the training defaults: "
                                f"{' '.join(DEFAULT_TRAIN_ARGS)})")
    p.add_argument("--datasets", default="builtin:small,builtin:dense-small",
                   help="comma-separated built-in (or other) dataset specs with a test split (default: %(default)s)")
    p.add_argument("--seeds", default="0,1", help="comma-separated training seeds (default: %(default)s)")
    p.add_argument("--backbone", default="auto", help="auto (a backbone trained once with full labels on "
                   f"{BACKBONE_DATA}), none (random init) or a checkpoint FILE (default: %(default)s)")
    p.add_argument("--audit-size", type=int, default=20, help="images in the audit list (default: %(default)s)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/own-data"), help="default: %(default)s")
    add_page_options(p, SECTION)
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error("--seeds takes comma-separated integers")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    results: list[dict[str, Any]] = []
    try:
        backbone = ensure_backbone(args.backbone, args.runs_dir)
        for spec in datasets:
            data = make_user_data(spec, args.runs_dir / "data", args.audit_size)
            audit_k = load_audit(data.audit_spec, data.classes).mean_positives
            for seed in seeds:
                for variant in VARIANTS:
                    record = run_variant(variant, data, seed, args.runs_dir, train_args, backbone)
                    results.append({"dataset": spec, "seed": seed, "variant": variant, "record": record,
                                    "true_k": data.true_k, "audit_k": audit_k,
                                    "score": score(record, audit_k)})
    except (RunMismatch, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    publish(args.section or SECTION, markdown(results, command_line("bench.own_data", original), train_args,
                                              backbone_text(args.backbone, backbone), args.audit_size), args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
