"""Fine-tuning where the methods matter: ``python -m bench.fine_tune measure`` and ``python -m bench.fine_tune report``.

Each real development set as a user holds it (one label per training and validation image, test fully labelled and
only scoring), EfficientNet-Lite0 ImageNet at 224 px, ``--trainable top``: LinearInit's head on fixed features, then
the last stage and the head on cached last-stage inputs with random flips, every epoch run (no patience: the report
applies the package's patience afterwards). The runs are the product's own (:class:`train.trainer.Trainer`); this
module only scores every epoch on the test split and on the hidden full val labels, which nothing in a run reads.

The report: per set and method, the test mAP of the epoch the label-free criterion picks over both phases (with
``--patience 3`` counted from the start of the last-stage phase), against the head alone (``--trainable head
--method an``, the choices benchmark's runs of the same seeds), the best epoch's test mAP (the selection's loss) and
the hidden val mAP (how a setting is picked); the cost per 1,000 training images.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.choices import DEV_SETS, RUNS, TITLES, USER_VIEW, full_labels_by_path
from bench.results_page import add_page_options, machine_line, publish
from models.evaluation.criteria import LABEL_FREE_CRITERIA
from models.evaluation.expected_positives import estimate_expected_positives
from models.evaluation.metrics import mean_average_precision
from train import Trainer, build_parser, config_from_args

OUT = Path("runs/fine-tune")
SECTION = "fine-tune-top"
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


def measure(dev_name: str, seed: int, method: str, lr: float, epochs: int, linear_init: int) -> Path:
    """One run of ``method`` on a development set and seed, every epoch scored: ``runs/fine-tune/<tag>.json``."""
    dev = DEV_SETS[dev_name]
    tag = f"{dev_name}-seed{seed}-{method}-lr{lr:g}-e{epochs}"
    target = OUT / f"{tag}.json"
    if target.is_file():
        print(f"{tag}: done already", flush=True)
        return target
    argv = ["--data", dev.data, "--arch", "tf_efficientnet_lite0", "--weights", "imagenet", "--image-size", "224",
            *USER_VIEW, "--trainable", "top", "--method", method, "--lr", str(lr), "--epochs", str(epochs),
            "--linear-init", str(linear_init), "--patience", "0", "--seed", str(seed), "--no-progress",
            "--runs-dir", str(OUT / "runs"), "--name", tag]
    shutil.rmtree(OUT / "runs" / tag, ignore_errors=True)  # a measurement killed before its record: run it again
    started = time.perf_counter()
    given_k = ["--hp", f"k={chooser_k(dev_name, seed):.4f}"]  # k estimated without labels, not the full labels'
    try:
        trainer = ScoredTrainer(config_from_args(build_parser().parse_args([*argv, *given_k])), hidden_val_labels(dev))
        argv += given_k
    except ValueError as exc:  # a method without k refuses it before the run folder is made
        if "hyperparameter 'k'" not in str(exc):
            raise
        trainer = ScoredTrainer(config_from_args(build_parser().parse_args(argv)), hidden_val_labels(dev))
    trainer.fit()
    for record in trainer.epochs:
        record["seconds"] -= started
    top_seconds = [b["seconds"] - a["seconds"] for a, b in zip(trainer.epochs, trainer.epochs[1:], strict=False)
                   if a["phase"] == b["phase"] == 2]
    result = {"dev_set": dev_name, "seed": seed, "method": method, "lr": lr, "epochs": epochs,
              "linear_init": linear_init, "argv": argv, "train": len(trainer.run.splits.train),
              "per_epoch": trainer.epochs,
              "seconds": round(time.perf_counter() - started, 1),
              "top_epoch_seconds": float(np.median(top_seconds)) if top_seconds else None}
    OUT.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=1))
    print(f"{tag}: {summarise(result)} [{result['seconds']:.0f} s]", flush=True)
    return target


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


def summarise(result: dict[str, Any]) -> str:
    """One line: the pick's test mAP, the head phase's pick and the best epoch."""
    per = result["per_epoch"]
    chosen = per[pick(per, CRITERION)]
    head = per[pick([e for e in per if e["phase"] == 1], CRITERION)]
    return (f"picked test {chosen['test']:.2f} (phase {chosen['phase']}), head phase {head['test']:.2f}, best epoch "
            f"{max(e['test'] for e in per):.2f}")


def chooser_k(dev_name: str, seed: int) -> float:
    """k as ``--method auto`` estimates it without labels (the choices benchmark's ``an`` heads, same seed)."""
    path = RUNS / f"{dev_name}-seed{seed}-b32.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run python -m bench.choices measure --dev-sets {dev_name} first")
    return float(json.loads(path.read_text())["k_estimate_an"])


def head_alone(dev_name: str, seed: int) -> float | None:
    """Test mAP of ``--trainable head --method an`` (lr 0.002) at its label-free pick: the choices benchmark's run."""
    path = RUNS / f"{dev_name}-seed{seed}-b32.json"
    if not path.is_file():
        return None
    entry = json.loads(path.read_text())["candidates"].get("an@0.002")
    return None if entry is None else float(entry["test_mAP"][entry["picks"][CRITERION] - 1])


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def report(note: str = "") -> str:
    """The results page section from every measured run."""
    results = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    lines = [
        "## Fine-tuning where the methods matter: the last stage on cached inputs (`--trainable top`)", "",
        "Command: `python -m bench.fine_tune measure` then `python -m bench.fine_tune report`", "",
        f"Machine: {machine_line().removeprefix('Machine: ')}", "",
        "Each set as a user holds it (one label per training and validation image, test fully labelled and only "
        "scoring); EfficientNet-Lite0 ImageNet at 224 px; LinearInit's head (25 epochs on fixed features) with the "
        "run's method, then the last stage and the head on cached last-stage inputs with random flips. Picked = the "
        f"epoch `{CRITERION}` picks over both phases with patience {PATIENCE} from the start of the last-stage "
        "phase: what the user gets. Methods that need k (`epr`) are given `--method auto`'s label-free estimate "
        "(`--hp k`), not the benchmark's full training labels. Head alone = `--trainable head --method an` at its "
        "label-free pick, same seed. "
        "Selection loss = the best epoch's test mAP minus the picked one's. Val (hidden) = the full val labels at "
        "the pick, which only score.", "",
        "| set | method | lr | seeds | picked test mAP | vs head alone, same seed | picked in phase 2 | selection "
        "loss | val mAP (hidden) | s per epoch per 1,000 images |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["dev_set"], r["method"], r["lr"]), []).append(r)
    for (dev, method, lr), runs in sorted(groups.items()):
        picked, gains, losses, vals, phase2, cost = [], [], [], [], 0, []
        for r in runs:
            per = r["per_epoch"]
            chosen = per[pick(per, CRITERION)]
            picked.append(chosen["test"])
            losses.append(max(e["test"] for e in per) - chosen["test"])
            vals.append(chosen["val_full"])
            phase2 += chosen["phase"] == 2
            reference = head_alone(dev, r["seed"])
            if reference is not None:
                gains.append(chosen["test"] - reference)
            if r.get("top_epoch_seconds"):
                cost.append(r["top_epoch_seconds"] / r["train"] * 1000)
        gain = f"{np.mean(gains):+.2f} ({sum(g > 0 for g in gains)}/{len(gains)} above)" if gains else "n/a"
        seconds = f"{np.median(cost):.1f}" if cost else "n/a"
        lines.append(f"| {TITLES.get(dev, dev)} | {method} | {lr:g} | {len(runs)} | {mean_std(picked)} | {gain} | "
                     f"{phase2}/{len(runs)} | {np.mean(losses):.2f} | {mean_std(vals)} | {seconds} |")
    lines += ["", "Selection loss by criterion (test mAP of the best epoch minus the picked one's, mean over the runs; "
              "patience as above; `val_full` = the hidden full val labels, for reference):", "",
              "| set | method | " + " | ".join(f"`{c}`" for c in [*LABEL_FREE_CRITERIA, "val_full"]) + " |",
              "|---|---|" + "---|" * (len(LABEL_FREE_CRITERIA) + 1)]
    for (dev, method, _lr), runs in sorted(groups.items()):
        cells = []
        for criterion in [*LABEL_FREE_CRITERIA, "val_full"]:
            losses = [max(e["test"] for e in r["per_epoch"]) - r["per_epoch"][pick(r["per_epoch"], criterion)]["test"]
                      for r in runs]
            cells.append(f"{np.mean(losses):.2f}")
        lines.append(f"| {TITLES.get(dev, dev)} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + note if note else "") + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.fine_tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run and score every (set, seed, method)")
    m.add_argument("--dev-sets", default=",".join(REAL_SETS))
    m.add_argument("--seeds", default="0,1,2")
    m.add_argument("--methods", default="an,epr")
    m.add_argument("--lr", type=float, default=1e-3)
    m.add_argument("--epochs", type=int, default=15)
    m.add_argument("--linear-init", type=int, default=25)
    r = sub.add_parser("report", help="write the results page's section")
    r.add_argument("--note", default="", help="a closing paragraph (what was not run, the machine's load)")
    add_page_options(r, SECTION)
    args = p.parse_args(argv)
    if args.command == "measure":
        for seed in (int(s) for s in args.seeds.split(",")):
            for dev in args.dev_sets.split(","):
                for method in args.methods.split(","):
                    measure(dev, seed, method, args.lr, args.epochs, args.linear_init)
        return 0
    publish(args.section or SECTION, report(args.note), args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
