"""End-to-end fine-tuning in the user's view, sized for a lent GPU.

1. ``python -m bench.fine_tune_e2e bundle -o BUNDLE`` (here, on the CPU): each real development set as a user holds it
   (one label per training and validation image, test fully labelled) written as the package's CSV format, its images
   already at the runs' 224 px (WebP at quality 90: small enough to travel), plus ``hidden.npz``,
   the full val labels that only score.
2. ``bash bench/fine_tune_e2e.sh BUNDLE`` (on a CUDA machine): the head alone, then each recipe candidate (method,
   random resized crops, EMA, a slower backbone with a warm-up), 3 seeds, every epoch scored on test and the hidden
   val labels; one ``<set>-seed<S>-<tag>.json`` per run. The runs are the product's own :class:`train.Trainer`.
3. ``python -m bench.fine_tune_e2e report``: the results page section ``fine-tune-e2e``.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bench.choices import DEV_SETS, TITLES, full_labels_by_path
from bench.results_page import add_page_options, publish
from models.evaluation.criteria import LABEL_FREE_CRITERIA
from models.evaluation.expected_positives import estimate_expected_positives
from models.evaluation.metrics import mean_average_precision
from models.preprocess import read_image
from train import Trainer, build_parser, config_from_args

OUT = Path("runs/fine-tune-e2e")
SECTION = "fine-tune-e2e"
HEAD = "head"  # the tag of the head-alone reference runs (the script's first wave)
IMAGE_SIZE = 224
PATIENCE = 3  # the package's fine-tune patience, applied to the recorded epochs
CRITERION = "observed-map"  # what a run selects by when val has no full labels (--select auto)
REAL_SETS = ("tuxpaint", "icons-phosphor", "openclipart")


class ScoredTrainer(Trainer):
    """The product's trainer, scoring each epoch's pick (the model or its EMA) on test, on the hidden full val labels
    (``hidden_val(run)``, which nothing in the run reads) and by every label-free criterion, with the label-free k."""

    def __init__(self, cfg: Any, hidden_val: Callable[[Any], np.ndarray]) -> None:
        super().__init__(cfg)
        self.val_full = hidden_val(self.run)
        self.epochs: list[dict[str, Any]] = []
        self._test_inputs: tuple[Any, tuple[torch.Tensor, torch.Tensor]] | None = None  # (phase, its cached inputs)

    def _test_logits(self, phase: Any, module: Any) -> tuple[np.ndarray, np.ndarray]:
        """The test logits of the epoch's pick and the readable rows: on the phase's cached inputs, else on images."""
        test = self.run.splits.test
        if phase is None:
            rows = self._predict(module, self.run.predictor.eval_loader(test), "test")
            return rows.values[rows.present].numpy(), rows.present.numpy()
        if self._test_inputs is None or self._test_inputs[0] is not phase:
            self._test_inputs = (phase, phase._extract(test, "test"))
        inputs, present = self._test_inputs[1]
        return phase._logits(inputs[present.to(inputs.device)]).numpy(), present.numpy()

    def _candidates(self, linear: Any) -> list[Any]:
        candidates = super()._candidates(linear)
        run = self.run
        chosen = max(candidates, key=lambda c: c.assessment.score)
        test, present = self._test_logits(linear, chosen.module)
        val, observed = chosen.assessment.logits, run.splits.val.labels
        record: dict[str, Any] = {name: float(fn(val, observed)) for name, fn in LABEL_FREE_CRITERIA.items()}
        record.update(val_full=float(mean_average_precision(val, self.val_full)),
                      test=float(mean_average_precision(test, run.splits.test.labels[present])),
                      k=float(estimate_expected_positives(val, observed)), weights=chosen.name,
                      phase=2 if linear is None or linear is self.top else 1, seconds=time.perf_counter())
        self.epochs.append(record)
        return candidates


def hidden_val_labels(dev: Any) -> Callable[[Any], np.ndarray]:
    """The full labels of a prepared run's val images, from the development set ``dev`` (they only score)."""

    def labels(run: Any) -> np.ndarray:
        full = full_labels_by_path(dev, list(run.splits.classes), run.data.dataset)
        return np.stack([full[str(p)] for p in run.splits.val.paths])

    return labels


def pick(per_epoch: list[dict[str, float]], criterion: str, patience: int = PATIENCE) -> int:
    """The epoch (0-based) ``criterion`` picks over both phases, the last-stage phase stopped by ``patience``."""
    first_top = next((i for i, e in enumerate(per_epoch) if e["phase"] == 2), len(per_epoch))
    best, best_score = 0, -np.inf
    for i, epoch in enumerate(per_epoch):
        if epoch[criterion] > best_score:
            best, best_score = i, epoch[criterion]
        if patience and i >= first_top and i + 1 - max(best + 1, first_top) >= patience:
            break  # the trainer's rule: the last stage gets `patience` epochs to beat the stages before
    return best


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def bundle(names: list[str], out: Path) -> None:
    """Write each development set in the user's view into ``out/<set>/``: ``labels.csv`` (train and val: their one
    observed label; test: full), ``classes.txt``, ``images/`` at the runs' size and ``hidden.npz`` (full val labels)."""
    for name in names:
        dev = DEV_SETS[name]
        with tempfile.TemporaryDirectory() as runs:
            argv = ["--data", dev.data, *dev.train_args, "--runs-dir", runs, "--no-progress"]
            run = Trainer(config_from_args(build_parser().parse_args(argv))).run
        splits = run.splits  # a class named '-...' would read as a known negative in labels.csv: renamed
        classes = [f"minus{c[1:]}" if c.startswith("-") else c for c in run.classes]
        folder = out / name
        (folder / "images").mkdir(parents=True, exist_ok=True)
        transform = run.predictor.eval_transform
        rows = []
        parts = (("train", splits.train, splits.train_observed == 1), ("val", splits.val, splits.val.labels),
                 ("test", splits.test, splits.test.labels))
        for split, images, labels in parts:
            for path, row in zip(images.paths, np.asarray(labels), strict=True):
                file = f"images/{len(rows):05d}.webp"
                pixels = transform.resize(read_image(path)).permute(1, 2, 0).numpy()
                Image.fromarray(pixels).save(folder / file, "WEBP", quality=90)
                rows.append((file, ";".join(classes[c] for c in np.flatnonzero(row > 0)), split))
        with (folder / "labels.csv").open("w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([("image", "labels", "split"), *rows])
        (folder / "classes.txt").write_text("".join(f"{c}\n" for c in classes), encoding="utf-8")
        np.savez_compressed(folder / "hidden.npz", val=hidden_val_labels(dev)(run))
        size = sum(p.stat().st_size for p in folder.rglob("*")) / 2**20
        print(f"{name}: {len(rows)} images, {len(classes)} classes, {size:.1f} MiB in {folder}", flush=True)


def label_free_k(out: Path, name: str, seed: int) -> float:
    """k as the head alone estimates it without labels, at its label-free pick (what ``--method auto`` gives)."""
    per = json.loads((out / f"{name}-seed{seed}-{HEAD}.json").read_text())["per_epoch"]
    return per[pick(per, CRITERION)]["k"]


def measure(folder: Path, seed: int, tag: str, train_args: list[str], out: Path, k: bool) -> Path:
    """One run of ``train_args`` on the bundled set ``folder`` with ``seed``: ``out/<set>-seed<S>-<tag>.json``."""
    name = folder.name
    target = out / f"{name}-seed{seed}-{tag}.json"
    if target.is_file():
        print(f"{target.name}: done already", flush=True)
        return target
    argv = ["--data", f"csv:{folder}", "--labels", "test=full", "--arch", "tf_efficientnet_lite0", "--weights",
            "imagenet", "--image-size", str(IMAGE_SIZE), "--seed", str(seed), "--patience", "0", "--no-progress",
            "--name", f"{name}-seed{seed}-{tag}", *train_args,
            *(["--hp", f"k={label_free_k(out, name, seed):.4f}"] if k else [])]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs:
        hidden = np.load(folder / "hidden.npz")["val"]
        trainer = ScoredTrainer(config_from_args(build_parser().parse_args([*argv, "--runs-dir", runs])),
                                lambda run: hidden)
        trainer.fit()
    for record in trainer.epochs:
        record["seconds"] -= started
    gaps = [b["seconds"] - a["seconds"] for a, b in zip(trainer.epochs, trainer.epochs[1:], strict=False)
            if a["phase"] == b["phase"] == 2]
    result = {"dev_set": name, "seed": seed, "tag": tag, "argv": argv, "train": len(trainer.run.splits.train),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "per_epoch": trainer.epochs, "seconds": round(time.perf_counter() - started, 1),
              "epoch_seconds": float(np.median(gaps)) if gaps else None}
    out.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=1))
    chosen = result["per_epoch"][pick(result["per_epoch"], CRITERION)]
    print(f"{target.name}: picked test {chosen['test']:.2f} (phase {chosen['phase']}), best "
          f"{max(e['test'] for e in result['per_epoch']):.2f} [{result['seconds']:.0f} s]", flush=True)
    return target


def candidate_text(argv: list[str]) -> str:
    """A run's own arguments as the table shows them: after its name, without k's value (per seed) and workers."""
    own = argv[argv.index("--name") + 2:]
    dropped = {i + d for i, a in enumerate(own) if a in ("--hp", "--workers") for d in (0, 1)}
    shown = [a for i, a in enumerate(own) if i not in dropped]
    return f"`{' '.join(shown)}`" + (" (k: the head's estimate)" if "--hp" in own else "")


def _loss(per_epoch: list[dict[str, Any]], criterion: str, patience: int) -> float:
    """The test mAP the pick of ``criterion`` with ``patience`` loses against the run's best epoch."""
    return max(e["test"] for e in per_epoch) - per_epoch[pick(per_epoch, criterion, patience)]["test"]


def report(out: Path, note: str = "") -> str:
    """The results page section from every run in ``out``."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    picked = {(r["dev_set"], r["seed"], r["tag"]): r["per_epoch"][pick(r["per_epoch"], CRITERION)] for r in runs}
    device = next((r["device"] for r in runs), "none")
    lines = [
        "## Fine-tuning end to end in the user's view (GPU)", "",
        "Command: `python -m bench.fine_tune_e2e bundle -o BUNDLE` (CPU), then on a CUDA machine "
        "`bash bench/fine_tune_e2e.sh BUNDLE`, then `python -m bench.fine_tune_e2e report` (and `plot`)", "",
        f"Machine: {device}, PyTorch {torch.__version__}; bf16 autocast and channels_last (the package's `auto`)", "",
        "Each set as a user holds it (one label per training and validation image, test fully labelled and only "
        "scoring), EfficientNet-Lite0 ImageNet at 224 px, batch 32: LinearInit's head (25 epochs on fixed features), "
        f"then the whole network 15 epochs with the candidate's settings. Picked = the epoch `{CRITERION}` picks over "
        f"both phases, patience {PATIENCE} counted from the start of the end-to-end phase: what the user gets. Head "
        "alone = `--trainable head --method an --lr 0.002` at its pick, same seed; k for the methods that need it = "
        "the head alone's label-free estimate. Selection loss = the best epoch's test mAP minus the picked one's. Val "
        "(hidden) = the full val labels at the pick, which only score.", "",
        "| set | candidate | seeds | picked test mAP | vs head alone, same seed | picked end to end | selection loss "
        "| val mAP (hidden) | s per epoch per 1,000 images |",
        "|---|---|---|---|---|---|---|---|---|"]
    tags = list(dict.fromkeys(r["tag"] for r in runs))
    for name in dict.fromkeys(r["dev_set"] for r in runs):
        for tag in tags:
            group = [r for r in runs if r["dev_set"] == name and r["tag"] == tag]
            if not group:
                continue
            chosen = [picked[(name, r["seed"], tag)] for r in group]
            gains = [c["test"] - picked[(name, r["seed"], HEAD)]["test"] for r, c in zip(group, chosen, strict=True)
                     if (name, r["seed"], HEAD) in picked]
            losses = [_loss(r["per_epoch"], CRITERION, PATIENCE) for r in group]
            cost = [r["epoch_seconds"] / r["train"] * 1000 for r in group if r["epoch_seconds"]]
            gain = f"{np.mean(gains):+.2f} ({sum(g > 0 for g in gains)}/{len(gains)} above)" if tag != HEAD else "-"
            lines.append(f"| {TITLES.get(name, name)} | {candidate_text(group[0]['argv'])} "
                         f"| {len(group)} | {mean_std([c['test'] for c in chosen])} | {gain} | "
                         f"{sum(c['phase'] == 2 for c in chosen)}/{len(group)} | {np.mean(losses):.2f} | "
                         f"{mean_std([c['val_full'] for c in chosen])} | "
                         f"{f'{np.median(cost):.2f}' if cost else 'n/a'} |")
    lines += ["", "![test mAP of every epoch, mean over the seeds](fine_tune_e2e.png)"]
    criteria = [*LABEL_FREE_CRITERIA, "val_full"]
    lines += ["", "Selection loss by criterion over the three sets (test mAP of the best epoch minus the picked one's, "
              f"mean over the runs; patience {PATIENCE} / every epoch; `val_full` = the hidden full val labels, for "
              "reference):", "", "| candidate | runs | " + " | ".join(f"`{c}`" for c in criteria) + " |",
              "|---|---|" + "---|" * len(criteria)]
    for tag in tags:
        group = [r["per_epoch"] for r in runs if r["tag"] == tag]
        cells = [" / ".join(f"{np.mean([_loss(per, c, patience) for per in group]):.2f}" for patience in (PATIENCE, 0))
                 for c in criteria]
        lines.append(f"| {tag} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *(["", note] if note else [])]) + "\n"


def plot(out: Path, target: Path) -> None:
    """The test mAP of every epoch, mean over the seeds, per set and candidate with 2 seeds or more (the head alone's
    pick dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    names = list(dict.fromkeys(r["dev_set"] for r in runs))
    colours = {tag: f"C{i}" for i, tag in enumerate(dict.fromkeys(r["tag"] for r in runs))}
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for tag in dict.fromkeys(r["tag"] for r in runs if r["dev_set"] == name):
            curves = [[e["test"] for e in r["per_epoch"]] for r in runs if r["dev_set"] == name and r["tag"] == tag]
            if tag == HEAD:
                picks = [r["per_epoch"][pick(r["per_epoch"], CRITERION)]["test"] for r in runs
                         if r["dev_set"] == name and r["tag"] == tag]
                ax.axhline(float(np.mean(picks)), color="black", linestyle="--", label="head alone (picked)")
            elif len(curves) >= 2:  # a single seed is left out: noise
                width = min(len(c) for c in curves)
                mean = np.mean([c[:width] for c in curves], axis=0)
                ax.plot(range(1, width + 1), mean, colours[tag], label=f"{tag} ({len(curves)} seeds)")
        ax.set(title=TITLES.get(name, name), xlabel="epoch (head phase, then end to end)", ylabel="test mAP")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(target, dpi=90)
    print(f"wrote {target}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``bundle``, ``measure`` (one run) and ``report``."""
    p = argparse.ArgumentParser(prog="python -m bench.fine_tune_e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="write the development sets in the user's view (CPU)")
    b.add_argument("--dev-sets", default=",".join(REAL_SETS))
    b.add_argument("-o", "--out", type=Path, required=True)
    m = sub.add_parser("measure", help="one run: measure --bundle B --set S --seed N --tag T -- TRAIN ARGS")
    m.add_argument("--bundle", type=Path, required=True)
    m.add_argument("--set", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--tag", required=True)
    m.add_argument("--k", action="store_true", help="give the method the head alone's label-free k (--hp k=...)")
    m.add_argument("--out", type=Path, default=OUT)
    m.add_argument("train_args", nargs=argparse.REMAINDER)
    g = sub.add_parser("plot", help="draw the test mAP curves into a PNG")
    g.add_argument("--out", type=Path, default=OUT)
    g.add_argument("-o", "--target", type=Path, default=Path("bench/fine_tune_e2e.png"))
    r = sub.add_parser("report", help="write the results page section")
    r.add_argument("--out", type=Path, default=OUT)
    r.add_argument("--note", default="")
    add_page_options(r, SECTION)
    args = p.parse_args(argv)
    if args.command == "bundle":
        bundle([n for n in args.dev_sets.split(",") if n], args.out)
    elif args.command == "measure":
        train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        measure(args.bundle / args.set, args.seed, args.tag, train_args, args.out, args.k)
    elif args.command == "plot":
        plot(args.out, args.target)
    else:
        publish(args.section or SECTION, report(args.out, args.note), args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
