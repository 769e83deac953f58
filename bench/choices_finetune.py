"""Fine-tune settings that hold: ``python -m bench.choices finetune`` runs the grid, ``python -m bench.choices
finetune-report`` writes its results-page section.

Each run fine-tunes the whole network on a development set as a user holds it (one positive per training and
validation image, test fully labelled), through ``bench.tracked_training``: the product's trainer, which keeps the
epoch its label-free criterion picks over both phases (LinearInit's head on fixed features, then the whole network),
plus, per epoch, the val mAP on the hidden full val labels and the test mAP. The package's default is the setting with
the best hidden-label val mAP at the picked epoch, averaged over the development sets; test only scores.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from bench.choices_report import fmt, mean_std
from models.files.run_folder import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE

FINETUNE_RUNS = Path("runs/choices-finetune")


@dataclass(frozen=True)
class FineTuneSetting:
    """One fine-tune of the grid: the end-to-end learning rate, LinearInit epochs (the head first, on fixed features,
    at the default head learning rate), schedule, batch and epoch limit (``--patience`` stops it earlier)."""

    lr: str
    linear_init: str
    scheduler: str
    batch_size: str
    epochs: int
    patience: int
    bn_stats: str = "frozen"

    @property
    def suffix(self) -> str:
        """The run folder's suffix after ``<method>-seed<S>``."""
        return (f"-lr{self.lr}-li{self.linear_init}-{self.scheduler}-b{self.batch_size}-e{self.epochs}"
                f"-p{self.patience}-bn{self.bn_stats}")

    @property
    def label(self) -> str:
        """How the results page names the setting."""
        head = f"LinearInit {self.linear_init}, " if self.linear_init != "0" else ""
        return (f"{head}lr {float(self.lr):g} ({self.scheduler}), batch {self.batch_size}, {self.epochs} epochs"
                + (f", patience {self.patience}" if self.patience else "") + f", BatchNorm statistics {self.bn_stats}")

    def args(self, train_args: tuple[str, ...]) -> list[str]:
        """Training arguments: ``train_args`` (a dev set's backbone and view) with the whole network trained and these
        settings."""
        base = [a for a in train_args if a not in ("--trainable", "head")]
        return [*base, "--epochs", str(self.epochs), "--patience", str(self.patience), "--lr", self.lr,
                "--linear-init", self.linear_init, "--scheduler", self.scheduler, "--batch-size", self.batch_size,
                "--bn-stats", self.bn_stats]


def measure_finetune(dev_name: str, data: str, train_args: tuple[str, ...], seed: int, methods: list[str],
                     settings: list[FineTuneSetting], out: Path) -> None:
    """Fine-tune every method on a dev set once per setting with per-epoch test and hidden-label val mAP: run folders
    ``out/<dev>/<method>-seed<S><suffix>``, reused when finished and resumed when interrupted."""
    from bench.methods import run_one

    for setting in settings:
        for method in methods:
            run_one(method, seed, data, out / dev_name, setting.args(train_args), setting.suffix,
                    module="bench.tracked_training")


@dataclass
class FineTuneRun:
    """A finished run of the grid: what the user gets (the picked epoch) and what the head alone gave."""

    dev: str
    method: str
    seed: int
    setting: FineTuneSetting
    picked_epoch: int
    epochs_run: int
    test: float  # test mAP at the picked epoch
    val_full: float  # hidden-label val mAP at the picked epoch
    head_test: float  # test mAP at the epoch the criterion picks within LinearInit's head phase (NaN: none)
    end_to_end_picked: bool


def read_run(folder: Path, dev: str) -> FineTuneRun | None:
    """The figures of a finished run folder of the grid; None when it is not finished."""
    summary_path = folder / SUMMARY_FILE
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text())
    cfg = json.loads((folder / CONFIG_FILE).read_text())["config"]
    setting = FineTuneSetting(f"{cfg['lr']:g}", str(cfg["linear_init"]), cfg["scheduler"], str(cfg["batch_size"]),
                              int(cfg["epochs"]), int(cfg["patience"]), cfg.get("bn_stats", "train"))
    epochs = {}
    for line in (folder / "epochs.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            epochs[int(record["epoch"])] = record
    picked = int(summary["best_epoch"])
    linear = int(cfg["linear_init"])
    head_test = math.nan
    if linear:
        key = f"val_{summary['selection']}"
        scores = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines() if line.strip()]
        head = [(r[key], -r["epoch"]) for r in scores if r["epoch"] <= linear and r.get(key) is not None]
        if head:
            head_test = float(epochs[-max(head)[1]]["test_mAP"])
    return FineTuneRun(dev, str(cfg["method"]), int(cfg["seed"]), setting, picked, int(summary["epochs_run"]),
                       float(summary["test"]["mAP"]), float(epochs[picked].get("val_full_mAP", math.nan)),
                       head_test, picked > linear)


def load_runs(folder: Path) -> list[FineTuneRun]:
    """Every finished run under ``folder/<dev>/``."""
    runs = []
    for dev_dir in sorted(p for p in Path(folder).iterdir() if p.is_dir()) if Path(folder).is_dir() else []:
        for run_dir in sorted(p for p in dev_dir.iterdir() if p.is_dir()):
            run = read_run(run_dir, dev_dir.name)
            if run is not None:
                runs.append(run)
    return runs


def best_setting(runs: list[FineTuneRun], method: str) -> FineTuneSetting | None:
    """The setting of ``method`` with the best hidden-label val mAP at the picked epoch, averaged over the grid's
    development sets (those where more than one setting was measured) and, on each, over the seeds every candidate
    has; the candidates are the settings measured on all of them. A set measured at one setting only checks the
    pick."""
    val: dict[FineTuneSetting, dict[str, dict[int, float]]] = {}
    for r in runs:
        if r.method == method:
            val.setdefault(r.setting, {}).setdefault(r.dev, {})[r.seed] = r.val_full
    devs = {d for per_dev in val.values() for d in per_dev}
    grid = {d for d in devs if sum(d in per_dev for per_dev in val.values()) > 1}
    candidates = [s for s, per_dev in val.items() if grid and grid <= set(per_dev)]
    if not candidates:
        return None
    seeds = {d: set.intersection(*(set(val[s][d]) for s in candidates)) for d in grid}
    scored = {s: sum(mean_std([val[s][d][seed] for seed in seeds[d]])[0] for d in grid) / len(grid)
              for s in candidates}
    return max(scored, key=lambda s: scored[s])


def finetune_section(runs: list[FineTuneRun], titles: dict[str, str], default: FineTuneSetting | None,
                     command: str, machine: str, note: str = "") -> str:
    """The results page's section: per dev set, setting and method the picked epoch's test and hidden-label val mAP,
    the head phase's test mAP, and the picked epochs."""
    devs = [d for d in titles if any(r.dev == d for r in runs)]
    lines = ["## Choices that hold: fine-tuning the whole network", "", machine, "", "Commands:", "", "```", command,
             "```", "",
             "Each development set as a user holds it (one label per training and validation image, test fully "
             "labelled); EfficientNet-Lite0 ImageNet, the whole network trained at each setting; the epoch the "
             "package's label-free criterion picks over both phases (LinearInit's head on fixed features, then the "
             "whole network) is what the user gets. Val mAP = on the hidden full val labels at that epoch (how the "
             "default is picked: the best mean over the development sets); test only scores. Head alone = the test "
             "mAP of the epoch the criterion picks within the head phase (what `--trainable head` would give).", "",
             "| development set | setting | method | seeds | test mAP | head alone | fine-tune gain, same seed | "
             "val mAP (hidden) | picked epoch / epochs run |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, FineTuneSetting, str], list[FineTuneRun]] = {}
    for r in sorted(runs, key=lambda r: (devs.index(r.dev) if r.dev in devs else 99, -float(r.setting.lr),
                                         r.setting.label, r.method, r.seed)):
        groups.setdefault((r.dev, r.setting, r.method), []).append(r)
    for (dev, setting, method), group in groups.items():
        gains = [r.test - r.head_test for r in group]
        mark = "**" if setting == default else ""
        lines.append(
            f"| {titles.get(dev, dev)} | {mark}{setting.label}{mark} | {method} | {len(group)} | "
            f"{fmt(mean_std([r.test for r in group]))} | {fmt(mean_std([r.head_test for r in group]))} | "
            + ("n/a" if all(math.isnan(g) for g in gains) else f"{mean_std(gains)[0]:+.2f} "
               f"({sum(g > 0 for g in gains)}/{len(gains)} above)")
            + f" | {fmt(mean_std([r.val_full for r in group]))} | "
            + " ".join(f"{r.picked_epoch}/{r.epochs_run}" for r in group) + " |")
    if default is not None:
        lines += ["", f"The package's fine-tune default (in bold): {default.label}, the best hidden-label val mAP "
                  f"averaged over the development sets measured at more than one setting, on the seeds every candidate "
                  f"has (a setting measured on only some of them is shown, not a candidate; a set measured at one "
                  f"setting checks the pick)."]
    if note:
        lines += ["", note]
    return "\n".join(lines)
