"""The method chooser (train/choose.py, train/cross_fitting.py): the rule that keeps the baseline unless a candidate
beats it beyond the noise, the folds, and ``python -m train --method auto`` end to end on one label per image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.evaluation.criteria import observed_map
from train.__main__ import main
from train.choose import (
    Candidate,
    CandidateResult,
    candidate_methods,
    choose_on_scores,
    left_out,
    paired_difference,
    pick,
)
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


def test_an_audit_replaces_or_vetoes_the_label_free_pick() -> None:
    """With an audit list, a candidate that passed the label-free test and that the audited images' full labels show
    better beyond the noise replaces the label-free pick; a label-free pick that they show worse than the baseline goes
    back to the baseline; a candidate the label-free scores did not pass is not taken however it scores on the audit;
    without a clear difference the label-free pick stands. The left-out methods are never candidates."""
    rng = np.random.default_rng(2)
    n, c = 300, 6
    full = (rng.random((n, c)) < 0.4).astype(np.uint8)
    full[np.arange(n), rng.integers(0, c, n)] = 1
    observed = np.zeros_like(full)
    for i in range(n):
        observed[i, rng.choice(np.flatnonzero(full[i]))] = 1
    baseline = Candidate("an", 2e-3)
    base = _ranked(full, 2.0, rng)
    good = _ranked(full, 5.0, rng) + 3.0 * observed  # better on the given labels beyond the noise, and on the hidden
    looks_good = _ranked(observed, 4.0, rng)  # fits the given labels, ranks the hidden ones as negatives

    def results() -> list[CandidateResult]:
        return [_result("an", 2e-3, base, observed), _result("wan", 2e-3, good, observed),
                _result("role", 1e-2, looks_good, observed)]

    label_free = pick(results(), baseline, observed_map, observed)
    rows = np.arange(200, 300)
    chosen, first = choose_on_scores(results(), baseline, observed, (rows, full[rows]), criterion="observed-map")
    assert first == label_free and chosen == Candidate("wan", 2e-3)
    # only the baseline and the label-free pick: the audit sends a pick worse than the baseline back to it
    two = [_result("an", 2e-3, base, observed), _result("role", 1e-2, looks_good, observed)]
    assert pick(two, baseline, observed_map, observed) == Candidate("role", 1e-2)
    chosen, first = choose_on_scores(two, baseline, observed, (rows, full[rows]), criterion="observed-map")
    assert first == Candidate("role", 1e-2) and chosen == baseline
    assert choose_on_scores(two, baseline, observed, None, criterion="observed-map")[0] == Candidate("role", 1e-2)
    # margins out of reach: the audit can move nothing
    assert choose_on_scores(two, baseline, observed, (rows, full[rows]), criterion="observed-map",
                            margins=(1e9, 1e9))[0] == Candidate("role", 1e-2)
    assert choose_on_scores(results(), baseline, observed, (rows, full[rows]), criterion="observed-map",
                            margins=(1e9, 1e9))[0] == label_free
    # best on the audited rows, below the baseline by the label-free scores elsewhere: not a contender
    only_audited = _ranked(full, 0.3, rng)
    only_audited[rows] = _ranked(full, 8.0, rng)[rows]
    three = [*two, _result("epr", 2e-3, only_audited, observed)]
    assert observed_map(only_audited, observed) < observed_map(base, observed)
    chosen, first = choose_on_scores(three, baseline, observed, (rows, full[rows]), criterion="observed-map")
    assert first == Candidate("role", 1e-2) and chosen == baseline and not three[2].qualified
    # no difference on the audit beyond its noise: the label-free pick stands
    same = [_result("an", 2e-3, base, observed), _result("wan", 2e-3, base + 1e-3, observed)]
    assert choose_on_scores(same, baseline, observed, (rows[:10], full[rows[:10]]))[0] == baseline
    assert set(left_out()) == {"role", "an-ls", "opml-sp", "gr-loss"}
    assert not set(left_out()) & set(candidate_methods(observed)) and "an" in candidate_methods(observed)


def test_folds_are_balanced_and_fixed() -> None:
    folds = fold_of(23, 5)
    assert sorted(np.bincount(folds).tolist()) == [4, 4, 5, 5, 5]
    assert np.array_equal(folds, fold_of(23, 5)) and not np.array_equal(folds, fold_of(23, 5, seed=1))
    with pytest.raises(ValueError, match="at least 3 folds"):
        fold_of(3, 5)
    with pytest.raises(ValueError, match="at least 3 folds"):
        fold_of(10, 2)  # a fold to train on, one to pick the epoch on, one to score


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


def test_method_auto_chooses_then_trains_the_choice(single_positive_csv: Path, squares_csv: Path, tmp_path: Path,
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
    # k is printed and kept whatever the choice (an uses none, the run still reports the chooser's estimate)
    assert f"{config['method']}: k = " in out.err and "(estimated: --method auto" in out.err
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["expected_positives"]["k"] > 0
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
    # with an audit of validation images (every class answered, as the demo's Audit tab writes them), the
    # candidates are compared on the audited images' full labels, and k comes from them
    from models.data.review_file import AnswerLog

    full = {Path(row.split(",")[0]).name: set(row.split(",")[1].split(";"))
            for row in squares_csv.read_text().splitlines()[1:]}
    classes = sorted(set().union(*full.values()))
    audited = [row.split(",")[0] for row in single_positive_csv.read_text().splitlines()[1:] if row.endswith(",val")]
    log = AnswerLog(tmp_path / "audit.answers.jsonl")
    log.record_many([(image, name, name in full[Path(image).name]) for image in audited for name in classes])
    capsys.readouterr()
    assert main([*args, "--method", "auto", "--candidates", "an,wan", "--trainable", "head", "--epochs", "3",
                 "--audit", str(log.path), "--name", "audited"]) == 0
    chosen = json.loads((tmp_path / "audited" / "config.json").read_text())["config"]["chosen"]
    assert chosen["criterion"] == f"observed-rank, then the class AUC of {len(audited)} audited images"
    assert chosen["label_free"] in {f"{m}@{lr:g}" for m in ("an", "wan") for lr in (1e-2, 2e-3, 5e-4)}
    summary = json.loads((tmp_path / "audited" / "summary.json").read_text())
    assert summary["expected_positives"]["source"] == "audit"
    assert "audited images" in capsys.readouterr().err
    assert main([*args, "--method", "an", "--candidates", "wan", "--name", "bad"]) == 2
    assert main([*args, "--method", "auto", "--candidates", "nope", "--name", "bad"]) == 2


def test_candidates_train_at_the_head_defaults_when_the_run_fine_tunes() -> None:
    """--method auto with a fine-tune: the run's --lr and schedule are the whole network's, so the candidate heads
    train at the head defaults (the baseline stays an at the default head learning rate)."""
    from train.choose import head_config
    from train.config import FINE_TUNE_DEFAULTS, HEAD_EPOCHS, TrainConfig
    from train.options import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(["--data", "folder:pets", "--method", "auto"]))
    head = head_config(cfg)
    assert cfg.lr == FINE_TUNE_DEFAULTS["lr"] and cfg.scheduler == FINE_TUNE_DEFAULTS["scheduler"]
    assert (head.trainable, head.epochs, head.lr, head.scheduler, head.method) == (
        "head", HEAD_EPOCHS, TrainConfig().lr, TrainConfig().scheduler, "an")
    own = head_config(config_from_args(build_parser().parse_args(["--data", "folder:pets", "--method", "auto",
                                                                  "--trainable", "head", "--lr", "1e-3"])))
    assert own.lr == 1e-3


def test_candidates_train_one_after_the_other_when_forked_workers_cannot(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """PyTorch refuses autograd in a child forked after this process started autograd threads: the chooser then
    trains the candidates in order in this process, each once, k estimated from the baseline's results before a
    candidate that reads it, and says so; other errors still surface."""
    import types
    from concurrent.futures import Future

    import torch

    from train import choose as choose_module

    class RefusingPool:
        error = "Unable to handle autograd's threading in combination with fork-based multiprocessing"

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> RefusingPool:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def submit(self, fn: object, *args: object) -> Future[object]:
            future: Future[object] = Future()
            future.set_exception(RuntimeError(self.error))
            return future

    scored: list[tuple[str, object]] = []
    monkeypatch.setattr(choose_module, "ProcessPoolExecutor", RefusingPool)
    monkeypatch.setattr(choose_module, "choice_processes", lambda device: 2)
    monkeypatch.setattr(choose_module, "score_candidate",
                        lambda c, shared: scored.append((c.name, shared.k)) or f"result {c.name}")
    shared = types.SimpleNamespace(forward=types.SimpleNamespace(device=torch.device("cpu")), k=None)
    first, rest = [Candidate("an", 0.01)], [Candidate("epr", 0.01), Candidate("wan", 0.01)]
    estimates: list[object] = []
    results = list(choose_module._score_all(first, rest, shared, lambda done: estimates.append(done) or "k"))
    assert results == ["result an@0.01", "result epr@0.01", "result wan@0.01"]
    assert scored == [("an@0.01", None), ("epr@0.01", "k"), ("wan@0.01", "k")] and estimates == [["result an@0.01"]]
    assert "one after the other" in capsys.readouterr().err

    monkeypatch.setattr(RefusingPool, "error", "something else")
    with pytest.raises(RuntimeError, match="something else"):
        list(choose_module._score_all(first, rest, shared, lambda done: "k"))
