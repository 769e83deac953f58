"""Your own data, measured end to end for every method: ``python -m bench.own_data``.

A user's data has one label per image in the training AND the validation images (or a few, as someone gave
them), and no image is known to carry all of its labels. This benchmark builds such data from datasets whose full
labels are known, hides them from every run, and uses them only to score:

* ``builtin:small`` and ``builtin:dense-small`` (2.9 and 5.8 labels per image), written as a user's ``labels.csv``:
  the training pool with ONE positive per image (the protocol's draw), 20% held out by the product as the
  validation split, single-positive like the rest; the test split with all its labels (``--labels test=full``);
* ``openclipart-folders``: the real case, the clip art sorted into one category folder per drawing
  (``--data openclipart?view=folders``: train and val one positive each, the folder's class); its test images,
  and for scoring only its val images, carry their uploaders' keyword labels.

Backbones (``--backbones``): ``scratch`` (ResNet-18 from random init, 64 px, 6 epochs), ``imagenet``
(EfficientNet-Lite0 ImageNet fine-tuned: 64 px on the built-in shapes, 96 px on the clip art; 6 epochs), ``fixed``
(the same backbone fixed, heads on its features, 64 / 224 px) and ``default`` (``python -m train``'s defaults:
Lite0 ImageNet fine-tuned at 224 px for 3 epochs; for the k and tags figures of the model a user gets). Methods:
every registered method a user can train on such data (not the oracles, which need full training labels; not
``iu``, which needs observed negatives; not those that need CLIP pseudo-labels; not ``lac``, whose label-wise
head needs feature maps of 224 px or more).
Every run is ``python -m train`` on that data through :class:`~bench.tracked_training.RecordingTrainer`, which
keeps every epoch's val and test logits.

Reported, all from the records (``record.npz`` per run; finished runs are reused):

* **selection**: for every label-free criterion (``models.evaluation.criteria``), the test mAP lost against the
  epoch that the validation mAP on FULL labels picks (the papers' rule), mean and worst over every run, per
  dataset and backbone, and per method for the product's default (``--select auto``);
* **k**, the expected positives per image: the estimate from the validation scores of the default model (Lite0
  ImageNet fine-tuned, the default method) at its label-free pick against the truth, and an audit list's;
* **tags per image**: test tags per image with ``pu-f1`` thresholds (K estimated, no full label anywhere) and
  with thresholds calibrated on the full val labels, against the true mean; test OF1 / CF1 of both.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.methods import END_TO_END_PROTOCOL, RunMismatch, check_existing_run
from bench.results_page import add_page_options, command_line, machine_line, publish
from bench.tracked_training import RecordingTrainer
from export.threshold_calibration import calibrate
from models.data.csv_format import write_csv
from models.data.observed_spec import ObservedSpec
from models.data.protocol import PROTOCOL_SEED, sample_observed
from models.data.registry import load_dataset
from models.data.types import LabelledImages
from models.evaluation.criteria import LABEL_FREE_CRITERIA, default_criterion, validation_map
from models.evaluation.expected_positives import estimate_expected_positives, mean_positives
from models.evaluation.metrics import f1_scores, mean_average_precision
from models.files.atomic_writes import atomic_path
from models.files.run_folder import SUMMARY_FILE
from train.config import build_parser, config_from_args
from train.methods import BASELINE, METHODS, method_names

SECTION = "own-data"
RECORD = "record.npz"
BUILTIN = ("builtin:small", "builtin:dense-small")
CLIPART = "openclipart-folders"
DEFAULT_METHOD = BASELINE  # the method the k and tags figures are measured on (README's own-data command)
AUDIT_SIZE = 20

#: backbone -> (its training arguments on the built-in shapes, on the clip art)
BACKBONES: dict[str, tuple[list[str], list[str]]] = {
    "scratch": (["--arch", "resnet18", "--weights", "none", "--no-lgconv", "--image-size", "64", "--epochs", "6"],
                ["--arch", "resnet18", "--weights", "none", "--no-lgconv", "--image-size", "64", "--epochs", "6"]),
    "imagenet": ([*END_TO_END_PROTOCOL, "--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--image-size",
                  "64", "--epochs", "6", "--lr", "3e-4"],
                 [*END_TO_END_PROTOCOL, "--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--image-size",
                  "96", "--epochs", "6", "--lr", "3e-4"]),
    # what python -m train does with no model option (Lite0 ImageNet, 224 px, the fine-tune defaults): k and tags of
    # the default
    "default": ([], []),
    "fixed": (["--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--image-size", "64", "--trainable", "head",
               "--epochs", "25"],
              ["--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--image-size", "224", "--trainable",
               "head", "--epochs", "25"]),
}


def user_methods(backbone: str) -> list[str]:
    """The methods a user can train on single-positive data of their own with this backbone."""
    out = []
    for name in method_names():
        m = METHODS[name]
        if m.trains_on_full_labels or m.uses_observed_negatives or m.uses_pseudo_labels:
            continue
        if m.required_head and backbone != "default":  # lac: fixed features have no map; below 224 px its
            continue  # label-wise head sees too few positions to be label-wise (the run warns), so it is not measured
        out.append(name)
    return out


@dataclass
class UserData:
    """A dataset as a user holds it: the ``--data`` spec and training arguments of its runs, and the hidden full
    labels of its validation images by path (only the scoring reads them)."""

    name: str
    spec: str
    train_args: list[str]
    full_by_path: dict[str, np.ndarray]
    audit_k: float  # the mean positives of an audit list of AUDIT_SIZE images with all their labels

    def val_full(self, paths: list[Path]) -> np.ndarray:
        """The full labels (N, C) of validation images ``paths``."""
        return np.stack([self.full_by_path[str(Path(p).resolve())] for p in paths])


def folder_name(spec: str) -> str:
    """A dataset spec as a folder name: ``builtin:dense-small`` -> ``builtin-dense-small``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", spec).strip("-").lower()


def _audit_k(labels: np.ndarray) -> float:
    rows = np.random.default_rng(PROTOCOL_SEED).choice(len(labels), min(AUDIT_SIZE, len(labels)), replace=False)
    return mean_positives(labels[np.sort(rows)])


def builtin_user_data(spec: str, data_dir: Path) -> UserData:
    """Built-in data written as a user's ``labels.csv`` (module docstring)."""
    source = load_dataset(spec)
    pool = source.train
    if source.test is None or not len(source.test):
        raise ValueError(f"{spec} has no test split to score on")
    single = sample_observed(pool.labels, ObservedSpec("single"), PROTOCOL_SEED) == 1
    csv = write_csv(data_dir / folder_name(spec), {"train": LabelledImages(pool.paths, single, pool.classes),
                                                   "test": source.test})
    full = {str(Path(p).resolve()): row for p, row in zip(pool.paths, pool.labels, strict=True)}
    return UserData(spec, f"csv:{csv}", ["--labels", "test=full"], full, _audit_k(pool.labels))


def clipart_user_data(root: str = "") -> UserData:
    """The clip art's folder view (module docstring); the val images' keyword labels, restricted to the view's
    classes, score the full-label pick."""
    folders = load_dataset(f"openclipart:{root}?view=folders")
    keywords = load_dataset(f"openclipart:{root}" if root else "openclipart")
    columns = [keywords.classes.index(name) for name in folders.classes]
    full = {}
    for part in (keywords.train, keywords.val):
        assert part is not None
        for path, row in zip(part.paths, part.labels[:, columns], strict=True):
            full[str(Path(path).resolve())] = row
    assert folders.val is not None
    audit = np.stack([full[str(Path(p).resolve())] for p in folders.train.paths])
    return UserData(CLIPART, f"openclipart:{root}?view=folders", [], full, _audit_k(audit))


@dataclass
class RunRecord:
    """What one run left for scoring: every epoch's validation and test logits, the validation labels the run saw
    and their hidden full labels, the test labels, the epoch the run picked and its k."""

    val_logits: np.ndarray  # (epochs, N_val, C)
    test_logits: np.ndarray  # (epochs, N_test, C)
    val_observed: np.ndarray
    val_full: np.ndarray
    test_labels: np.ndarray
    selected_epoch: int
    selection: str
    k: float
    k_source: str

    def save(self, path: Path) -> None:
        """Write the record as one ``.npz`` (atomically)."""
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez_compressed(tmp, **{k: np.asarray(v) for k, v in self.__dict__.items()})

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """Read a record written by :meth:`save`."""
        with np.load(path) as z:
            values = {k: z[k] for k in z.files}
        scalars = {"selected_epoch": int, "selection": str, "k": float, "k_source": str}
        return cls(**{k: scalars[k](v) if k in scalars else v for k, v in values.items()})

    def test_map(self, epoch: int) -> float:
        """Test mAP of the model of ``epoch`` (1-based)."""
        return mean_average_precision(self.test_logits[epoch - 1], self.test_labels)

    def pick(self, criterion: Callable[[np.ndarray, np.ndarray], float], labels: np.ndarray) -> int:
        """The epoch (1-based) with the best ``criterion`` on the validation logits against ``labels`` (the first
        on a tie; an undefined value never wins)."""
        scores = [criterion(v, labels) for v in self.val_logits]
        scores = [-math.inf if s is None or math.isnan(s) else s for s in scores]
        return int(np.argmax(scores)) + 1

    @property
    def full_pick(self) -> int:
        """The epoch the validation mAP on full labels picks (the papers' rule)."""
        return self.pick(validation_map, self.val_full)


def train_and_record(argv: list[str], data: UserData) -> RunRecord:
    """Train ``python -m train ARGV`` with :class:`RecordingTrainer` and return what it recorded."""
    trainer = RecordingTrainer(config_from_args(build_parser().parse_args(argv)))
    summary = trainer.fit()
    assert trainer.splits.test is not None
    k = summary.get("expected_positives") or {}
    return RunRecord(np.stack(trainer.val_logits), np.stack(trainer.test_logits),
                     np.asarray(trainer.splits.val.labels), data.val_full(trainer.splits.val.paths),
                     np.asarray(trainer.splits.test.labels), int(summary["best_epoch"]), str(summary["selection"]),
                     float(k.get("k", math.nan)), str(k.get("source", "")))


def run(data: UserData, backbone: str, method: str, seed: int, runs_dir: Path,
        extra: list[str] | None = None, train: bool = True) -> RunRecord | None:
    """The record of ``method`` on ``data`` with ``backbone`` and ``seed``: read from its run folder when it
    finished with the same settings, else trained (an unfinished folder is started again), or None when
    ``train`` is false. Raises :class:`~bench.methods.RunMismatch`."""
    folder = runs_dir / folder_name(data.name) / backbone
    name = f"{method}-seed{seed}"
    args = BACKBONES[backbone][1 if data.name == CLIPART else 0]
    argv = [*args, *(extra or []), *data.train_args, "--data", data.spec, "--method", method, "--seed", str(seed),
            "--runs-dir", str(folder), "--name", name, "--no-progress"]
    check_existing_run(folder / name, argv)
    if (folder / name / RECORD).is_file() and (folder / name / SUMMARY_FILE).is_file():
        print(f"{data.name} {backbone} {name}: done already", file=sys.stderr, flush=True)
        return RunRecord.load(folder / name / RECORD)
    if not train:
        return None
    if (folder / name).exists():
        shutil.rmtree(folder / name)
    print(f"{data.name} {backbone} {name}: python -m train {' '.join(argv)}", file=sys.stderr, flush=True)
    record = train_and_record(argv, data)
    record.save(folder / name / RECORD)
    return record


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


#: candidate rules beside the product's criteria: a per-method rule (an-loss for the losses that take unobserved
#: labels as negatives, observed-auc for the others) and the last epoch
EXTRA_RULES = ("per-method", "last epoch")


def selection_losses(record: RunRecord, method: str) -> dict[str, float]:
    """Per label-free criterion (and :data:`EXTRA_RULES`): the test mAP of the full-label pick minus that of the
    rule's pick."""
    reference = record.test_map(record.full_pick)

    def lost(epoch: int) -> float:
        return reference - record.test_map(epoch)

    out = {name: lost(record.pick(fn, record.val_observed)) for name, fn in LABEL_FREE_CRITERIA.items()}
    negative = METHODS[method].starts_at_label_prior
    out["per-method"] = out["an-loss"] if negative else out["observed-auc"]
    out["last epoch"] = lost(len(record.val_logits))
    return out


def tags_and_k(record: RunRecord) -> dict[str, float]:
    """At the epoch the product's label-free criterion picks (``--select auto``): k estimated from the validation
    scores, the true k of the val images, tags per test image and OF1 / CF1 with ``pu-f1`` thresholds (K estimated)
    and with ``f1`` thresholds on full val labels."""
    e = record.pick(LABEL_FREE_CRITERIA[default_criterion(False)], record.val_observed) - 1
    val_p, test_p = _sigmoid(record.val_logits[e]), _sigmoid(record.test_logits[e])
    k = estimate_expected_positives(record.val_logits[e], record.val_observed)
    out = {"k_estimated": k, "k_true": mean_positives(record.val_full),
           "tags_true": float(record.test_labels.sum(1).mean())}
    for name, thresholds in (("pu", calibrate(val_p, record.val_observed, "pu-f1", expected_positives=k).thresholds),
                             ("full", calibrate(val_p, record.val_full, "f1").thresholds)):
        t = np.asarray(thresholds)
        f1 = f1_scores(test_p, record.test_labels, t)
        out.update({f"tags_{name}": float((test_p >= t).sum(1).mean()), f"OF1_{name}": f1["OF1"],
                    f"CF1_{name}": f1["CF1"]})
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def markdown(results: list[dict[str, Any]], command: str, missing: list[str] | None = None) -> str:
    """The results section: selection per criterion, per setting and per method; k; tags per image; the runs left
    out (``missing``, with ``--finished-only``)."""
    default = default_criterion(False)
    criteria = [*LABEL_FREE_CRITERIA, *EXTRA_RULES]
    settings = sorted({(r["data"], r["backbone"]) for r in results})
    lines = [
        "## Your own data: selection, k and tags per image without full labels, every method", "",
        machine_line(), "", "```", command, "```", "",
        "Data as a user holds it (one positive per training and validation image; the full labels hidden from every "
        "run, read only to score): `builtin:small` and `builtin:dense-small` written as a `labels.csv`, and the "
        "clip art sorted into one category folder per drawing (`openclipart?view=folders`, scored on the "
        "uploaders' keywords). Backbones: `scratch` (ResNet-18, random init, 64 px, 6 epochs), `imagenet` "
        "(EfficientNet-Lite0 ImageNet fine-tuned, 6 epochs at lr 3e-4: 64 px on the shapes, 96 px on the clip "
        "art), `fixed` (heads on its fixed features, 25 epochs, 64 / 224 px). Lost = test mAP of the epoch the "
        "validation mAP on FULL labels picks minus that of the criterion's pick (0 = as good as the papers' rule).",
        "",
        "### Selection: test mAP lost per criterion", "",
        f"| criterion | runs | mean lost | worst run | {' | '.join(f'{d} {b}' for d, b in settings)} |",
        "|---|---|---|---|" + "---|" * len(settings),
    ]
    for name in criteria:
        lost = [r["lost"][name] for r in results]
        worst = max(results, key=lambda r: r["lost"][name])
        per = [_mean([r["lost"][name] for r in results if (r["data"], r["backbone"]) == s]) for s in settings]
        mark = " (default)" if name == default else ""
        lines.append(f"| `{name}`{mark} | {len(lost)} | {_mean(lost):+.2f} | {worst['lost'][name]:+.2f} "
                     f"({worst['method']}, {worst['data']} {worst['backbone']}) | "
                     + " | ".join(f"{v:+.2f}" for v in per) + " |")
    methods = sorted({r["method"] for r in results})
    lines += ["", "Per method: mean test mAP lost over its datasets and backbones, per criterion (worst of the default "
              "in brackets):", "",
              f"| method | runs | {' | '.join(f'`{c}`' + (' (default)' if c == default else '') for c in criteria)} |",
              "|---|---|" + "---|" * len(criteria)]
    for m in methods:
        mine = [r for r in results if r["method"] == m]
        cells = [f"{_mean([r['lost'][c] for r in mine]):+.2f}" + (
            f" ({max(r['lost'][c] for r in mine):+.2f})" if c == default else "") for c in criteria]
        lines.append(f"| {m} | {len(mine)} | {' | '.join(cells)} |")
    worst = {c: max(_mean([r["lost"][c] for r in results if r["method"] == m]) for m in methods) for c in criteria}
    lines.append(f"| **worst method** | | {' | '.join(f'{worst[c]:+.2f}' for c in criteria)} |")
    lines += ["", f"### k and tags per image (method `{DEFAULT_METHOD}`, at its label-free pick)", "",
              "| data | backbone | true k (val) | k estimated (error) | audit list of 20 (error) | tags per test "
              "image: `pu-f1` (K est.) / full-label `f1` / true | OF1 / CF1: `pu-f1` | OF1 / CF1: full-label `f1` |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["method"] != DEFAULT_METHOD:
            continue
        t = r["tags"]
        kt = t["k_true"]
        lines.append(f"| {r['data']} | {r['backbone']} | {kt:.2f} | {t['k_estimated']:.2f} "
                     f"({100 * (t['k_estimated'] - kt) / kt:+.0f}%) | {r['audit_k']:.2f} "
                     f"({100 * (r['audit_k'] - kt) / kt:+.0f}%) | {t['tags_pu']:.2f} / {t['tags_full']:.2f} / "
                     f"{t['tags_true']:.2f} | {t['OF1_pu']:.1f} / {t['CF1_pu']:.1f} | "
                     f"{t['OF1_full']:.1f} / {t['CF1_full']:.1f} |")
    if missing:
        lines += ["", f"Not run yet (`--finished-only`), so not in the tables ({len(missing)}): "
                  + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; 2 for bad arguments or a run folder trained with other settings."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.own_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default=",".join([CLIPART, *reversed(BUILTIN)]),
                   help="comma-separated: built-in specs and/or openclipart-folders (default: %(default)s)")
    p.add_argument("--backbones", default="fixed,imagenet,scratch", help=f"comma-separated from {', '.join(BACKBONES)} "
                   "(default: %(default)s)")
    p.add_argument("--methods", help="comma-separated (default: every method a user can train; see above)")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds (default: %(default)s)")
    p.add_argument("--clipart-root", default="", help="another copy of the clip art (default: the Debian package's)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/own-data"), help="default: %(default)s")
    p.add_argument("--train-args", default="", help="training arguments added to every run's (they win over the "
                   "backbone's), e.g. '--epochs 3' for a quick look")
    p.add_argument("--finished-only", action="store_true", help="train nothing: tables from the runs that have "
                   "finished, the others listed as not run")
    add_page_options(p, SECTION)
    args = p.parse_args(argv)
    backbones = [b for b in args.backbones.split(",") if b]
    unknown = [b for b in backbones if b not in BACKBONES]
    if unknown:
        p.error(f"unknown backbone {unknown[0]!r}; choose from {', '.join(BACKBONES)}")
    results: list[dict[str, Any]] = []
    missing: list[str] = []
    try:
        for spec in (d.strip() for d in args.datasets.split(",") if d.strip()):
            data = clipart_user_data(args.clipart_root) if spec == CLIPART else builtin_user_data(
                spec, args.runs_dir / "data")
            for backbone in backbones:
                methods = args.methods.split(",") if args.methods else user_methods(backbone)
                for seed in (int(s) for s in args.seeds.split(",")):
                    for method in methods:
                        record = run(data, backbone, method, seed, args.runs_dir, shlex.split(args.train_args),
                                     train=not args.finished_only)
                        if record is None:
                            missing.append(f"{data.name} {backbone} {method}-seed{seed}")
                            continue
                        results.append({"data": data.name, "backbone": backbone, "method": method, "seed": seed,
                                        "lost": selection_losses(record, method), "tags": tags_and_k(record),
                                        "audit_k": data.audit_k})
                # the section so far after every dataset and backbone: a long study shows its results as it goes
                if results:
                    publish(args.section or SECTION, markdown(results, command_line("bench.own_data", argv), missing),
                            args.page)
    except (RunMismatch, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
