"""Suggested labels to review: ``python -m train suggest RUN -o FILE`` (docs/label-review.md).

It ranks the unobserved (image, label) pairs of a run's training (``--split val``: validation) images most likely
present, from linear ``an`` heads on cached backbone features cross-fitted in folds (train/cross_fitting.py), so no
image is scored by a head that saw its labels; the run's own model is not used (it repeats the labels it learnt).
``--audit N`` writes an audit file instead: N validation images, each with every class, the most likely first. The
answers of ``--review`` files join the labels before scoring, so a second round never asks a pair again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.command_line import UsageError, run_command
from models.data.review_file import ReviewItem, write_review
from models.data.types import DataError
from models.files.atomic_writes import atomic_write_text
from train.choose import Candidate, head_config, out_of_fold_logits, prepare
from train.config import TrainConfig, run_config
from train.console import log
from train.cross_fitting import FOLDS, Pool, labelled_pool, training_pool
from train.methods import BASELINE

__all__ = ["AUDIT_SEED", "DEFAULT_ORDER", "DEFAULT_SPLIT", "DEFAULT_TOP", "ORDERS", "SPLITS", "Suggestions",
           "audit_items", "main", "rank_pairs", "suggest"]

#: Pairs written by default: about half an hour of a reviewer's time at 1.6 s a yes/no question (the time model of
#: bench/review.py, from published annotation times).
DEFAULT_TOP = 1000
#: How the pairs are ordered: ``balanced``, every class's most likely pair (strongest first), then every class's
#: second, ...; ``rare``, the same with a class's k-th pair at k x sqrt(its labels + 1), so a class with few labels
#: is asked more often; ``score``, by probability alone. A class with few labels gains more from one more than a
#: frequent class: balanced beat score, and rare beat balanced, on the hidden validation labels of the three real
#: development sets (docs/label-review.md, section 6).
ORDERS = ("rare", "balanced", "score")
DEFAULT_ORDER = "rare"
#: Whose pairs are suggested. ``train`` by default: in the same reviewer time, training and validation pairs together
#: closed less of the gap than training pairs, which teach the model (docs/label-review.md, section 6).
SPLITS = ("train", "val", "both")
DEFAULT_SPLIT = "train"
#: Seed of the draw of the validation images of an audit file.
AUDIT_SEED = 0


@dataclass
class Suggestions:
    """The ranked pairs, how many unobserved pairs were scored over how many images, and how long it took."""

    items: list[ReviewItem]
    images: int
    scored_pairs: int
    seconds: float


def rank_pairs(pool: Pool, logits: np.ndarray, top: int, per_image: int = 0,
               order_by: str = DEFAULT_ORDER) -> tuple[list[ReviewItem], int]:
    """The ``top`` unobserved pairs of ``pool`` in order ``order_by`` (``per_image`` cap), and the count."""
    if order_by not in ORDERS:
        raise ValueError(f"unknown order {order_by!r}; choose from {', '.join(ORDERS)}")
    classes = pool.images.classes
    scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    open_pairs = (pool.observed == 0) & ~np.isnan(scores)
    rows, columns = np.nonzero(open_pairs)
    values = scores[rows, columns]
    if order_by == "score":
        order = np.argsort(-values, kind="stable")
    else:  # each pair's rank among its class's pairs first (rare: stretched by the class's labels), then its score
        by_class = np.lexsort((-values, columns))
        depth = np.empty(len(values), dtype=np.int64)
        starts = np.searchsorted(columns[by_class], columns[by_class], side="left")
        depth[by_class] = np.arange(len(values)) - starts + 1
        stretch = np.sqrt((pool.observed > 0).sum(0) + 1.0) if order_by == "rare" else np.ones(len(classes))
        order = np.lexsort((-values, depth * stretch[columns]))
    taken: dict[int, int] = {}
    items = []
    for k in order:
        i, j = int(rows[k]), int(columns[k])
        if per_image and taken.get(i, 0) >= per_image:
            continue
        taken[i] = taken.get(i, 0) + 1
        given = tuple(classes[c] for c in np.flatnonzero(pool.observed[i] > 0))
        items.append(ReviewItem(str(pool.images.paths[i]), classes[j], float(scores[i, j]), None, given))
        if len(items) == top:
            break
    return items, len(rows)


def audit_items(pool: Pool, logits: np.ndarray, rows: np.ndarray) -> list[ReviewItem]:
    """Every class of each of ``rows`` as a pair, most likely first, with the image's labels."""
    classes = pool.images.classes
    items = []
    for i in rows:
        given = tuple(classes[c] for c in np.flatnonzero(pool.observed[i] > 0))
        scores = 1.0 / (1.0 + np.exp(-logits[i].astype(np.float64)))
        for j in np.argsort(-scores, kind="stable"):
            items.append(ReviewItem(str(pool.images.paths[i]), classes[j], float(scores[j]), None, given))
    return items


def suggest(cfg: TrainConfig, top: int = DEFAULT_TOP, per_image: int = 0,
            order_by: str = DEFAULT_ORDER, audit: int = 0, split: str = DEFAULT_SPLIT) -> Suggestions:
    """Cross-fitted ``an`` heads on ``cfg``'s training images and the ``top`` pairs of ``split``'s images they rank
    highest; with ``audit``, every class of ``audit`` random validation images."""
    started = time.perf_counter()
    head_cfg = dataclasses.replace(head_config(cfg), method=BASELINE)
    if not cfg.fixed_features:
        head_cfg = dataclasses.replace(head_cfg, lr=TrainConfig.lr)  # the run's lr is a fine-tune's
    data, model, forward, features = prepare(head_cfg)
    if (audit or split != "train") and data.splits.has_full_labels("val"):
        raise ValueError("the validation images of this run are labelled completely already: they need no "
                         + ("audit" if audit else "review"))
    pool = labelled_pool(data, features) if audit else training_pool(data, features, held_out_val=split != "train")
    held_out = int((pool.folds < 0).sum())
    log(f"suggest: {FOLDS} {BASELINE} heads at lr {head_cfg.lr:g} on fixed {head_cfg.arch} features, cross-fitted "
        f"over the {len(pool) - held_out} training" + (" and validation" if audit else "") + " images"
        + (f"; the {held_out} validation images held out, each scored by one of them" if held_out else ""))
    logits, failed = out_of_fold_logits(Candidate(BASELINE, head_cfg.lr), head_cfg, data, model, forward, pool, None)
    if failed:
        raise RuntimeError(f"the cross-fitted heads could not be trained: {failed}")
    if audit:
        val_rows = np.arange(len(data.splits.train), len(pool))
        val_rows = val_rows[~np.isnan(logits[val_rows]).any(1)]
        drawn = np.sort(np.random.default_rng(AUDIT_SEED).permutation(val_rows)[:audit])
        items = audit_items(pool, logits, drawn)
        return Suggestions(items, len(pool), len(items), time.perf_counter() - started)
    if split == "val":
        logits[pool.folds >= 0] = np.nan  # the training images: not asked
    items, scored = rank_pairs(pool, logits, top, per_image, order_by)
    return Suggestions(items, len(pool) - (len(data.splits.train) if split == "val" else 0), scored,
                       time.perf_counter() - started)


def _run_config(run: str, runs_dir: str | None, review: list[str]) -> tuple[Path, TrainConfig]:
    """The run's folder and config with ``review`` files added (absolute paths; each must exist)."""
    try:
        folder, cfg = run_config(run, runs_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for file in review:
        if not Path(file).is_file():
            raise UsageError(f"--review {file}: no such file")
    return folder, dataclasses.replace(cfg, review=[*cfg.review, *(str(Path(f).resolve()) for f in review)])


def write_sidecar(args: argparse.Namespace, folder: Path) -> None:
    """``FILE.suggest.json`` beside the review file: how it was made, for the demo's rounds to make it again."""
    made = {"run": str(folder.resolve()), "runs_dir": str(Path(args.runs_dir).resolve()) if args.runs_dir else None,
            "top": args.top, "per_image": args.per_image, "order": args.order, "split": args.split,
            "review": [str(Path(f).resolve()) for f in args.review]}
    atomic_write_text(args.output.with_suffix(".suggest.json"), json.dumps(made, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m train suggest`` argument parser."""
    p = argparse.ArgumentParser(prog="python -m train suggest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a run folder of python -m train (or its name under --runs-dir)")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="FILE",
                   help="the review file to write: .csv (columns image, label, score, given, answer) or .jsonl")
    p.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="N",
                   help="how many pairs to suggest, best first (default: %(default)s)")
    p.add_argument("--per-image", type=int, default=0, metavar="M",
                   help="at most M suggestions per image (default: no cap; 1 spreads them over the images)")
    p.add_argument("--audit", type=int, default=0, metavar="N",
                   help="write an audit file instead: N validation images drawn at random, each with every class "
                   "(the most likely first), to label completely in the demo's Audit tab (`python -m serve demo "
                   "--audit FILE`); 50 let --method auto choose on them (docs/choosing.md)")
    p.add_argument("--order", choices=ORDERS, default=DEFAULT_ORDER, help="rare: as balanced, a class with few "
                   "labels asked more often (the most mAP per review); balanced: every class's most likely missing "
                   "label first, then every class's second, ...; score: by probability alone (the most labels found "
                   "per review). Default: %(default)s")
    p.add_argument("--split", choices=SPLITS, default=DEFAULT_SPLIT, help="whose labels to suggest: the training "
                   "images' (answers teach the model), the validation images' (answers reach the selection criterion "
                   "and the export's thresholds; the val split stays partial, so selection stays label-free) or both, "
                   "ranked together. Default: %(default)s (the measured gains of a review are the training answers')")
    p.add_argument("--review", action="append", default=[], metavar="FILE",
                   help="answers given since the run (repeatable): they join the labels and are not asked again")
    p.add_argument("--runs-dir", help="where run names are looked up (default: the runs folder of python -m train)")
    p.add_argument("--overwrite", action="store_true", help="replace FILE if it exists (it may hold answers)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m train suggest``; the exit code (0, 1 failed, 2 usage, 130 interrupted)."""
    args = build_parser().parse_args(argv)

    def body() -> None:
        if args.top < 1 or args.per_image < 0 or args.audit < 0:
            raise UsageError("--top must be at least 1, --per-image and --audit at least 0")
        if args.output.suffix.lower() not in (".csv", ".jsonl"):
            raise UsageError(f"-o {args.output}: give a .csv or .jsonl file")
        if args.output.exists() and not args.overwrite:
            raise UsageError(f"-o {args.output} exists (it may hold answers); choose another file or --overwrite")
        folder, cfg = _run_config(args.run, args.runs_dir, args.review)
        cfg = dataclasses.replace(cfg, progress=args.progress)
        try:
            result = suggest(cfg, args.top, args.per_image, args.order, args.audit, args.split)
        except (DataError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_review(args.output, result.items)
        answers = args.output.with_suffix(".answers.jsonl")
        images = len({item.image for item in result.items})
        if args.audit:
            print(f"wrote every class of {images} validation images to {args.output} ({result.seconds:.0f} s)")
            print(f"label them completely: python -m serve demo --audit {args.output} (answers go to {answers}); "
                  f"then: python -m train --from-run {args.run} --method auto --audit {answers}")
            return
        write_sidecar(args, folder)
        whose = {"train": "training", "val": "validation", "both": "training and validation"}[args.split]
        print(f"wrote {len(result.items)} suggestions on {images} of {result.images} {whose} images to "
              f"{args.output} (the best of {result.scored_pairs:,} unobserved pairs; {result.seconds:.0f} s)")
        print(f"review them: python -m serve demo --review {args.output} (answers go to {answers}), or fill in "
              f"its answer column (yes / no); then retrain: python -m train --from-run {args.run} --review "
              f"{answers} (or --review {args.output})")

    return run_command("python -m train suggest", body)


if __name__ == "__main__":
    sys.exit(main())
