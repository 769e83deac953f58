"""The method chooser (train/choose.py, train/cross_fitting.py): the rule that keeps the baseline unless a candidate
beats it beyond the noise, the folds, and ``python -m train --method auto`` end to end on one label per image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.evaluation.criteria import observed_map
from train.__main__ import main
from train.choose import Candidate, CandidateResult, paired_difference, pick
from train.cross_fitting import fold_of


def _ranked(labels: np.ndarray, quality: float, rng: np.random.Generator) -> np.ndarray:
    """Logits that rank the labelled entries above the others with noise ``1 / quality``."""
    return labels * quality + rng.normal(size=labels.shape)


def _labels(rng: np.random.Generator, n: int = 400, c: int = 6) -> np.ndarray:
    labels = np.zeros((n, c), dtype=np.uint8)
    labels[np.arange(n), rng.integers(0, c, n)] = 1
    return labels


def test_paired_difference_and_its_error() -> None:
    rng = np.random.default_rng(0)
    labels = _labels(rng)
    weak, strong = _ranked(labels, 1.0, rng), _ranked(labels, 3.0, rng)
    mean, error = paired_difference(observed_map, strong, weak, labels, resamples=100)
    assert mean == pytest.approx(observed_map(strong, labels) - observed_map(weak, labels))
    assert mean > 10 * error > 0  # a real difference is many standard errors
    same, zero = paired_difference(observed_map, weak, weak, labels, resamples=20)
    assert same == 0.0 and zero == 0.0
    rows = weak.copy()
    rows[:5] = np.nan  # unreadable images are left out, not scored as zeros
    assert np.isfinite(paired_difference(observed_map, rows, weak, labels, resamples=20)[0])


def _result(name: str, lr: float, logits: np.ndarray, labels: np.ndarray) -> CandidateResult:
    return CandidateResult(Candidate(name, lr), score=observed_map(logits, labels), val_logits=logits)


def test_pick_keeps_the_baseline_unless_a_candidate_is_better_beyond_the_noise() -> None:
    rng = np.random.default_rng(1)
    labels = _labels(rng)
    base = _ranked(labels, 1.0, rng)
    baseline = Candidate("an", 2e-3)
    slightly = base + 0.05 * rng.normal(size=base.shape)  # a score a hair apart: chance
    results = [_result("an", 2e-3, base, labels), _result("wan", 2e-3, slightly, labels)]
    assert pick(results, baseline, observed_map, labels) == baseline
    clearly = _ranked(labels, 3.0, rng)
    results.append(_result("epr", 1e-2, clearly, labels))
    assert pick(results, baseline, observed_map, labels) == Candidate("epr", 1e-2)
    assert results[2].versus_baseline is not None and results[2].versus_baseline[0] > 0
    # the guard: a contender that wins by the criterion but scores lower than the baseline by the guard stays out
    def disagreeing(logits: np.ndarray, labels: np.ndarray) -> float:
        return -observed_map(logits, labels)

    assert pick(results, baseline, observed_map, labels, guard=disagreeing) == baseline
    assert pick(results, baseline, observed_map, labels, guard=observed_map) == Candidate("epr", 1e-2)
    failed = [CandidateResult(baseline, failed="diverged"), _result("wan", 2e-3, slightly, labels)]
    assert pick(failed, baseline, observed_map, labels) == Candidate("wan", 2e-3)  # no baseline: the best score
    with pytest.raises(ValueError, match="no candidate"):
        pick([CandidateResult(baseline, failed="diverged")], baseline, observed_map, labels)


def test_folds_are_balanced_and_fixed() -> None:
    folds = fold_of(23, 5)
    assert sorted(np.bincount(folds).tolist()) == [4, 4, 5, 5, 5]
    assert np.array_equal(folds, fold_of(23, 5)) and not np.array_equal(folds, fold_of(23, 5, seed=1))
    with pytest.raises(ValueError, match="at least 2 folds"):
        fold_of(3, 5)


@pytest.fixture(scope="module")
def single_positive_csv(squares_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The squares as a user holds them: train and val images with ONE label each (the first), test complete."""
    folder = tmp_path_factory.mktemp("single")
    rows = squares_csv.read_text().splitlines()
    out = [rows[0]]
    for i, row in enumerate(rows[1:]):
        image, labels, split = row.split(",")
        if split == "train":
            split = "val" if i % 4 == 0 else "train"
            labels = labels.split(";")[0]
        out.append(f"{squares_csv.parent / image},{labels},{split}")
    (folder / "labels.csv").write_text("\n".join(out) + "\n")
    return folder / "labels.csv"


def test_method_auto_chooses_then_trains_the_choice(single_positive_csv: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--method auto on one label per image: the candidates are cross-fitted, the table printed, the choice
    trained head-only, and config.json says what was chosen among what."""
    args = ["--data", f"csv:{single_positive_csv}", "--labels", "test=full", "--arch", "resnet18", "--weights", "none",
            "--no-lgconv", "--image-size", "32", "--batch-size", "16", "--workers", "0", "--no-progress",
            "--runs-dir", str(tmp_path)]
    assert main([*args, "--method", "auto", "--candidates", "an,wan,epr", "--trainable", "head", "--epochs", "3",
                 "--name", "auto"]) == 0
    out = capsys.readouterr()
    config = json.loads((tmp_path / "auto" / "config.json").read_text())["config"]
    chosen = config["chosen"]
    baseline_chosen = f"{chosen['method']}@{chosen['lr']:g}" == "an@0.002"
    assert "cross-fitted over the" in out.err and "<- chosen" in out.out
    assert ("(baseline)" in out.out) != baseline_chosen  # the baseline is marked as such unless it is the choice
    assert config["method"] == chosen["method"] in ("an", "wan", "epr") and config["lr"] == chosen["lr"]
    assert chosen["criterion"] == "observed-rank" and chosen["cross_fitted"] and chosen["baseline"] == "an@0.002"
    assert set(chosen["candidates"]) == {f"{m}@{lr:g}" for m in ("an", "wan", "epr") for lr in (1e-2, 2e-3, 5e-4)}
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["test"]["mAP"] > 0
    # fine-tuning from the chosen head: LinearInit at the chosen learning rate, then the whole network
    assert main([*args, "--method", "auto", "--candidates", "an,wan", "--epochs", "1", "--name", "tuned"]) == 0
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())["config"]
    assert config["linear_init"] == 25 and config["linear_init_lr"] == config["chosen"]["lr"]
    metrics = [json.loads(line) for line in (tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 26  # 25 head epochs on fixed features, then one of the whole network
    assert main([*args, "--method", "an", "--candidates", "wan", "--name", "bad"]) == 2
    assert main([*args, "--method", "auto", "--candidates", "nope", "--name", "bad"]) == 2


def test_candidates_train_at_the_head_defaults_when_the_run_fine_tunes() -> None:
    """--method auto with a fine-tune: the run's --lr and schedule are the whole network's, so the candidate heads
    train at the head defaults (the baseline stays an at the default head learning rate)."""
    from train.choose import head_config
    from train.config import FINE_TUNE_DEFAULTS, HEAD_EPOCHS, TrainConfig, build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(["--data", "folder:pets", "--method", "auto"]))
    head = head_config(cfg)
    assert cfg.lr == FINE_TUNE_DEFAULTS["lr"] and cfg.scheduler == FINE_TUNE_DEFAULTS["scheduler"]
    assert (head.trainable, head.epochs, head.lr, head.scheduler, head.method) == (
        "head", HEAD_EPOCHS, TrainConfig().lr, TrainConfig().scheduler, "an")
    own = head_config(config_from_args(build_parser().parse_args(["--data", "folder:pets", "--method", "auto",
                                                                  "--trainable", "head", "--lr", "1e-3"])))
    assert own.lr == 1e-3
