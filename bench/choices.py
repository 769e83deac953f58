"""Choices that hold: ``python -m bench.choices measure`` and ``python -m bench.choices report``.

The package chooses the method, its learning rate, the epoch, k and the thresholds on the user's own labels
(``python -m train --method auto``, train/choose.py). This benchmark checks that those choices hold on every
development set - data built as a user holds it (training AND validation images with ONE positive each, the
protocol's draw), whose hidden full labels score the choices and nothing else:

* ``openclipart``: the Open Clip Art Library's keyword labels (78 classes, 1.99 labels per image);
* ``tuxpaint``: the Tux Paint stamps, folders and description words (63 classes, 2.02 labels per image);
* ``dense-small``: ``builtin:dense-small``, procedural shapes with 7 attributes (5.8 labels per image).

``measure`` trains a linear head on the fixed features of EfficientNet-Lite0 (ImageNet weights) for every candidate
method at every learning rate and batch size of the grid, three seeds, through the chooser's own code
(:func:`train.fit_candidate`), and keeps, per epoch: every label-free criterion on the single-positive val
labels, the val mAP on the hidden full val labels (the papers' selection, for reference) and the test mAP; the
val and test logits of the epochs each criterion picks are stored too (``<dataset>-seed<S>-b<B>.npz``).
``report`` reads them back and writes the results page's sections: every method with the package's defaults, the
searched optimum beside it, the chooser's pick and its loss against the best method, the selection criteria's
losses, k and tags per image.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.choices_report import BASELINE, CHOICE_CRITERION
from bench.results_page import add_page_options, machine_line, publish
from models.evaluation.criteria import LABEL_FREE_CRITERIA
from models.evaluation.expected_positives import estimate_expected_positives
from models.evaluation.metrics import mean_average_precision
from models.files.atomic_writes import atomic_path, atomic_write_text
from train import Candidate, build_parser, config_from_args, fit_candidate, prepare

__all__ = ["DEV_SETS", "DevSet", "dev_config", "measure"]

RUNS = Path("runs/choices")
BACKBONE = ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--trainable", "head"]
#: The user's view of a benchmark: one positive per training and validation image, test fully labelled.
USER_VIEW = ["--observed", "single?val=observed"]
FULL_VAL = "val_mAP_full"  # the papers' selection on the hidden full val labels (reference only)


@dataclass(frozen=True)
class DevSet:
    """A development set: its ``--data`` spec and the training arguments of its heads."""

    name: str
    data: str
    train_args: tuple[str, ...]
    full_data: str = ""  # the spec whose labels are every image's full labels (default: data itself)


#: Where the npm icon sets are unpacked (``<dir>/<tabler, lucide or phosphor>/package``; docs/datasets.md).
ICON_SETS = os.environ.get("SPML_ICON_SETS", "~/icon-sets")

DEV_SETS: dict[str, DevSet] = {d.name: d for d in (
    DevSet("openclipart", "openclipart", (*BACKBONE, "--image-size", "224", *USER_VIEW)),
    DevSet("tuxpaint", "tuxpaint", (*BACKBONE, "--image-size", "224", *USER_VIEW)),
    DevSet("dense-small", "builtin:dense-small", (*BACKBONE, "--image-size", "64", *USER_VIEW)),
    # the same drawings with the label a person filing them gives: each image's category folder
    DevSet("openclipart-folders", "openclipart:?view=folders", (*BACKBONE, "--image-size", "224"), "openclipart"),
    DevSet("tuxpaint-folders", "tuxpaint:?view=folders", (*BACKBONE, "--image-size", "224"), "tuxpaint"),
    # real sets the chooser's rule was not fitted on: npm icon sets, their keyword tags as labels
    DevSet("icons-tabler", f"icons:{ICON_SETS}/tabler", (*BACKBONE, "--image-size", "224", *USER_VIEW)),
    DevSet("icons-lucide", f"icons:{ICON_SETS}/lucide", (*BACKBONE, "--image-size", "224", *USER_VIEW)),
    DevSet("icons-phosphor", f"icons:{ICON_SETS}/phosphor", (*BACKBONE, "--image-size", "224", *USER_VIEW)),
)}


#: The development sets the chooser's rule (criterion, guard, switching margin, left-out methods) was fitted on; the
#: others are reported out of sample.
FITTED_ON = ("openclipart", "tuxpaint", "dense-small", "openclipart-folders", "tuxpaint-folders")
#: The development sets the audit's margins were picked on (docs/choosing.md).
AUDIT_FITTED_ON = (*FITTED_ON, "icons-lucide", "icons-phosphor")

#: The dev sets as the results page names them.
TITLES = {
    "openclipart": "the clip art, a random label per image",
    "tuxpaint": "the Tux Paint stamps, a random label per image",
    "dense-small": "`builtin:dense-small`, a random label per image",
    "openclipart-folders": "the clip art, the label of its folder",
    "tuxpaint-folders": "the Tux Paint stamps, the label of its folder",
    "icons-tabler": "the Tabler icons, a random keyword per icon",
    "icons-lucide": "the Lucide icons, a random keyword per icon",
    "icons-phosphor": "the Phosphor icons, a random keyword per icon",
}


def labels_by_path(dataset: Any, classes: list[str]) -> dict[str, np.ndarray]:
    """Every image's labels in ``dataset`` (its train, val and test parts) over ``classes`` (a subset of its own),
    by path."""
    column = {name: i for i, name in enumerate(dataset.classes)}
    keep = [column[name] for name in classes]
    return {str(path): row[keep] for part in (dataset.train, dataset.val, dataset.test) if part is not None
            for path, row in zip(part.paths, part.labels, strict=True)}


def full_labels_by_path(dev: DevSet, classes: list[str], dataset: Any) -> dict[str, np.ndarray]:
    """Every image's full labels over ``classes`` by path: from the dev set's full-label spec (its keyword view for a
    folder view), else from ``dataset`` itself."""
    if dev.full_data:
        from models.data.registry import load_dataset

        dataset = load_dataset(dev.full_data)
    return labels_by_path(dataset, classes)


def measure(dev: DevSet, seed: int, batch_size: int, lrs: list[float], methods: list[str], out: Path,
            scheduler: str | None = None, epochs: int | None = None) -> Path:
    """Train every (method, lr) head of one dev set, seed and batch size and write ``out/<name>.json`` (+ ``.npz``
    with the val/test logits of each criterion's pick); finished files are kept."""
    tag = f"{dev.name}-seed{seed}-b{batch_size}" + (f"-{scheduler}" if scheduler else "") + (
        f"-e{epochs}" if epochs else "")
    target = out / f"{tag}.json"
    if target.is_file():
        print(f"{tag}: done already", flush=True)
        return target
    cfg, argv = dev_config(dev, seed, "--batch-size", str(batch_size), *(["--epochs", str(epochs)] if epochs else []),
                           *(["--scheduler", scheduler] if scheduler else []))
    started = time.perf_counter()
    prepared = prepare_with_test(cfg)
    data, _model, _forward, features = prepared
    splits = data.splits
    full = full_labels_by_path(dev, list(splits.classes), data.dataset)
    val_full = np.stack([full[str(p)] for p in splits.val.paths])
    val_obs = splits.val.labels
    test_labels = splits.test.labels
    test_features = features["test"].values
    records: dict[str, Any] = {"dev_set": dev.name, "seed": seed, "batch_size": batch_size, "argv": argv,
                               "classes": len(splits.classes), "train": len(splits.train), "val": len(splits.val),
                               "test": len(splits.test), "true_k_val": float(val_full.sum(1).mean()),
                               "true_k_test": float(test_labels.sum(1).mean()),
                               "true_k_train": float(np.stack([full[str(p)] for p in splits.train.paths])
                                                     .sum(1).mean()),
                               "candidates": {}}
    arrays: dict[str, np.ndarray] = {"val_full": val_full.astype(np.uint8), "val_observed": val_obs.astype(np.uint8),
                                     "test_labels": test_labels.astype(np.uint8)}
    per_epoch: dict[str, list[Any]] = {}

    def observer(candidate: Candidate, epoch: int, model: Any, phase: Any, assessment: Any) -> None:
        import torch

        val_logits = assessment.logits
        with torch.inference_mode():
            test_logits = model.head(test_features.to(phase.predictor.device)).float().cpu().numpy()
        per_epoch.setdefault("val", []).append(val_logits.astype(np.float32))
        per_epoch.setdefault("test", []).append(test_logits.astype(np.float32))

    k_an: float | None = None
    for method in methods:
        for lr in lrs:
            per_epoch.clear()
            candidate = Candidate(method, lr)
            k_given = None
            if k_an is not None:
                from models.evaluation.expected_positives import ExpectedPositives

                k_given = ExpectedPositives(k_an, "estimated", "the best an head of this measurement")
            result = fit_candidate(candidate, cfg, data, _model, _forward, features, k_given, observer=observer)
            entry: dict[str, Any] = {"method": method, "lr": lr, "failed": result.failed,
                                     "seconds": round(result.seconds, 2)}
            if per_epoch:
                vals, tests = per_epoch["val"], per_epoch["test"]
                crit = {name: [float(fn(v, val_obs)) for v in vals] for name, fn in LABEL_FREE_CRITERIA.items()}
                crit[FULL_VAL] = [float(mean_average_precision(v, val_full)) for v in vals]
                entry["val"] = crit
                entry["test_mAP"] = [float(mean_average_precision(t, test_labels)) for t in tests]
                picks = {name: int(np.nanargmax(values)) for name, values in crit.items()
                         if not all(math.isnan(x) for x in values)}
                picks["last"] = len(vals) - 1
                entry["picks"] = {name: e + 1 for name, e in picks.items()}
                for epoch in sorted(set(picks.values())):
                    arrays[f"{method}@{lr:g}/e{epoch + 1}/val"] = vals[epoch].astype(np.float16)
                    arrays[f"{method}@{lr:g}/e{epoch + 1}/test"] = tests[epoch].astype(np.float16)
            records["candidates"][candidate.name] = entry
            outcome = f"failed {result.failed}"
            if not result.failed:
                picked = entry["test_mAP"][entry["picks"][CHOICE_CRITERION] - 1]
                outcome = f"test mAP at {CHOICE_CRITERION} pick {picked:.2f}"
            print(f"{tag}: {candidate.name:<16} {outcome} [{result.seconds:.1f} s]", flush=True)
        if method == BASELINE:
            k_an = _an_k(records, arrays)
            records["k_estimate_an"] = k_an
    records["seconds"] = round(time.perf_counter() - started, 1)
    return write_measurement(target, records, arrays)


def write_measurement(target: Path, records: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """``target`` (the JSON record) and the arrays beside it (``.npz``), each written whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target.with_suffix(".npz"), suffix=".npz") as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    atomic_write_text(target, json.dumps(records))
    return target


def _an_k(records: dict[str, Any], arrays: dict[str, np.ndarray]) -> float | None:
    """k estimated from the val scores of the an head with the best observed-auc at its CHOICE_CRITERION pick (what the
    chooser does), for the methods that need k."""
    best = None
    for name, entry in records["candidates"].items():
        if entry["method"] != BASELINE or entry["failed"]:
            continue
        epoch = entry["picks"][CHOICE_CRITERION]
        score = entry["val"]["observed-auc"][epoch - 1]
        if best is None or score > best[0]:
            best = (score, name, epoch)
    if best is None:
        return None
    logits = arrays[f"{best[1]}/e{best[2]}/val"].astype(np.float32)
    return float(estimate_expected_positives(logits, arrays["val_observed"]))


def measure_crossfit(dev: DevSet, seed: int, lrs: list[float], methods: list[str], out: Path) -> Path:
    """Cross-fitted (out-of-fold) scores of every (method, lr) candidate over the pooled training and validation
    images (train/cross_fitting.py), batch 32: every label-free criterion on them, their mAP against the hidden
    full labels, and the best-bin k estimate; ``out/<dev>-seed<S>-crossfit.json`` (+ ``.npz`` with the logits)."""
    from models.evaluation.expected_positives import ExpectedPositives
    from train import labelled_pool, out_of_fold_logits

    tag = f"{dev.name}-seed{seed}-crossfit"
    target = out / f"{tag}.json"
    if target.is_file():
        print(f"{tag}: done already", flush=True)
        return target
    cfg, argv = dev_config(dev, seed, "--batch-size", "32")
    started = time.perf_counter()
    data, model, forward, features = prepare(cfg)
    pool = labelled_pool(data, features)
    full = full_labels_by_path(dev, list(data.splits.classes), data.dataset)
    pool_full = np.stack([full[str(p)] for p in pool.images.paths])
    records: dict[str, Any] = {"dev_set": dev.name, "seed": seed, "argv": argv, "pool": len(pool),
                               "selection": cfg.select,
                               "true_k_pool": float(pool_full.sum(1).mean()), "candidates": {}}
    arrays: dict[str, np.ndarray] = {"pool_full": pool_full.astype(np.uint8),
                                     "pool_observed": pool.images.labels.astype(np.uint8), "folds": pool.folds}
    k: ExpectedPositives | None = None
    for method in methods:
        for lr in lrs:
            candidate = Candidate(method, lr)
            t0 = time.perf_counter()
            logits, failed = out_of_fold_logits(candidate, cfg, data, model, forward, pool, k)
            entry: dict[str, Any] = {"method": method, "lr": lr, "failed": failed,
                                     "seconds": round(time.perf_counter() - t0, 2)}
            if not failed:
                keep = ~np.isnan(logits).any(1)
                entry["criteria"] = {name: float(fn(logits[keep], pool.images.labels[keep]))
                                     for name, fn in LABEL_FREE_CRITERIA.items()}
                entry["true_mAP"] = float(mean_average_precision(logits[keep], pool_full[keep]))
                entry["k_best_bin"] = float(estimate_expected_positives(logits[keep], pool.images.labels[keep]))
                arrays[f"{candidate.name}/oof"] = logits.astype(np.float16)
            records["candidates"][candidate.name] = entry
            print(f"{tag}: {candidate.name:<16} " + (f"failed {failed}" if failed else
                  f"observed-map {entry['criteria']['observed-map']:.2f} auc {entry['criteria']['observed-auc']:.2f}"
                  f" true {entry['true_mAP']:.2f} k {entry['k_best_bin']:.2f}") + f" [{entry['seconds']:.0f} s]",
                  flush=True)
        if method == BASELINE:
            ks = [e["k_best_bin"] for e in records["candidates"].values() if not e["failed"]]
            if ks:
                k = ExpectedPositives(min(ks), "estimated", "cross-fitted an heads")
    records["seconds"] = round(time.perf_counter() - started, 1)
    return write_measurement(target, records, arrays)


def dev_config(dev: DevSet, seed: int, *extra: str) -> tuple[Any, list[str]]:
    """The config of ``dev``'s ``an`` heads for ``seed``, with ``extra`` options, and its command line."""
    argv = [*dev.train_args, "--data", dev.data, "--seed", str(seed), "--no-progress", "--method", BASELINE, *extra]
    return config_from_args(build_parser().parse_args(argv)), argv


def prepare_with_test(cfg: Any) -> tuple[Any, ...]:
    """:func:`train.prepare` with the test split's features too (to score every epoch)."""
    from train import extract_features

    data, model, forward, features = prepare(cfg)
    features.update(extract_features(dataclasses.replace(cfg, trainable="head"), data, model, forward, ("test",)))
    return data, model, forward, features


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.choices", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="train and record every candidate head")
    m.add_argument("--dev-sets", default=",".join(DEV_SETS), help="default: %(default)s")
    m.add_argument("--seeds", default="0,1,2")
    m.add_argument("--batch-sizes", default="32")
    m.add_argument("--lrs", default="1e-2,5e-3,2e-3,1e-3,5e-4,2e-4")
    m.add_argument("--methods", default="", help="default: the chooser's candidates")
    m.add_argument("--scheduler", default=None)
    m.add_argument("--epochs", type=int, default=None)
    m.add_argument("--out", type=Path, default=RUNS)
    m.add_argument("--crossfit", action="store_true", help="cross-fitted scores over train+val instead (batch 32)")
    r = sub.add_parser("report", help="write the results page's sections from the measurements")
    r.add_argument("--out", type=Path, default=RUNS)
    r.add_argument("--criterion", default=CHOICE_CRITERION, choices=list(LABEL_FREE_CRITERIA),
                   help="what --method auto compares the candidates' cross-fitted scores by (docs/choosing.md; "
                   "default: %(default)s)")
    r.add_argument("--audit-margins", type=lambda v: tuple(float(x) for x in v.split(",")), default=None,
                   metavar="Z,V", help="the audit's switching and veto margins (default: the package's)")
    add_page_options(r, "choices-summary and choices-<dev set>")
    args = p.parse_args(argv)
    if args.command == "report" and args.audit_margins is not None and len(args.audit_margins) != 2:
        p.error("--audit-margins takes two numbers: Z,V")
    if args.command == "report":
        from bench.choices_report import dev_section, load, summary_section

        devs = {name: dev for name in DEV_SETS if (dev := load(args.out, args.criterion).get(name)) is not None
                and dev.seeds}
        machine = machine_line()
        command = ("python -m bench.choices measure --batch-sizes 32 --lrs 1e-2,2e-3,5e-4   # every epoch\n"
                   "python -m bench.choices measure --crossfit --lrs 1e-2,2e-3,5e-4   # the chooser's scores\n"
                   "python -m bench.choices report")
        publish("choices-summary", summary_section(devs, TITLES, command, machine, FITTED_ON, AUDIT_FITTED_ON,
                                                   args.audit_margins), args.page)
        for name, dev in devs.items():
            publish(f"choices-{name}", dev_section(dev, TITLES[name], command, machine), args.page)
        return 0
    if args.command == "measure":
        from train import candidate_methods

        methods = [x for x in args.methods.split(",") if x] or [BASELINE, *[
            m for m in candidate_methods(np.zeros((1, 1))) if m != BASELINE]]
        for name in args.dev_sets.split(","):
            for seed in [int(s) for s in args.seeds.split(",")]:
                if args.crossfit:
                    measure_crossfit(DEV_SETS[name], seed, [float(x) for x in args.lrs.split(",")], methods, args.out)
                    continue
                for batch in [int(b) for b in args.batch_sizes.split(",")]:
                    measure(DEV_SETS[name], seed, batch, [float(x) for x in args.lrs.split(",")], methods,
                            args.out, args.scheduler, args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
