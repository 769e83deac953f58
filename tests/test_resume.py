"""Resuming a killed run: weights, method state, metrics and the summary equal an uninterrupted run's, inside
LinearInit's first phase too, after the last epoch and after patience stopped it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from interrupt import interrupt_after_saves
from tiny_runs import FAST, tiny_config

from models import load_checkpoint
from train.__main__ import main
from train.trainer import Trainer


@pytest.mark.parametrize(("workers", "method", "lgconv"),  # a loader worker process and LgConv's state: one run
                         [(1, "an", True), (0, "role", False), (0, "em-apl", False), (0, "opml-sp", False)])
def test_resume_continues_exactly(builtin_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  workers: int, method: str, lgconv: bool) -> None:
    """Interrupt after epoch 1, resume: weights, method state and metrics equal an uninterrupted run."""
    straight = Trainer(tiny_config(tmp_path, name="straight", workers=workers, ema=0.5, method=method, lgconv=lgconv))
    straight.fit()

    interrupt_after_saves(monkeypatch)
    assert main([*FAST, "--lgconv" if lgconv else "--no-lgconv", "--epochs", "2", "--workers", str(workers),
                 "--ema", "0.5", "--method", method, "--runs-dir", str(tmp_path), "--name", "resumed"]) == 130
    assert load_checkpoint(tmp_path / "resumed" / "last.pt").training["epoch"] == 1
    assert main(["--resume", str(tmp_path / "resumed")]) == 0

    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=0, msg=key)
    assert a.training is not None and b.training is not None
    assert a.training["method"].keys() == b.training["method"].keys()
    for key, value in a.training["method"].items():  # ROLE's label matrix, EM-APL's pseudo-labels
        torch.testing.assert_close(b.training["method"][key], value, rtol=0, atol=0, msg=key)
    if method == "em-apl":
        assert int((b.training["method"]["pseudo"] >= 0).sum()) > 0
    if method == "opml-sp":
        assert float(b.training["method"]["class_ap"].sum()) > 0
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]
    # the trainer scores the methods' label estimates against the hidden full labels (they exist here)
    scored = {"role": "estimator_recovery_mAP", "em-apl": "apl_negative_precision"}.get(method)
    assert scored is None or all(0 <= json.loads(x)[scored] <= 100 for x in lines)
    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert sa["test"]["mAP"] == sb["test"]["mAP"]
    assert main(["--resume", str(tmp_path / "resumed")]) == 0  # already finished: says so, exits 0


def test_resume_after_the_last_epoch_runs_only_the_missing_final_evaluation(
        builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped between its last epoch and its summary (killed during the test evaluation) is completed by
    --resume without training again."""
    run = tmp_path / "r"
    assert main([*FAST, "--epochs", "1", "--runs-dir", str(tmp_path), "--name", "r"]) == 0
    expected = json.loads((run / "summary.json").read_text())
    metrics_before = (run / "metrics.jsonl").read_text()
    (run / "summary.json").unlink()
    capsys.readouterr()
    assert main(["--resume", str(run)]) == 0
    assert "evaluating its best checkpoint" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_epoch"] == expected["best_epoch"] == 1
    for split in ("val", "test", "train_recovery"):
        assert summary[split]["mAP"] == pytest.approx(expected[split]["mAP"], abs=1e-9)
    assert (run / "metrics.jsonl").read_text() == metrics_before  # no epoch trained again
    assert main(["--resume", str(run)]) == 0
    assert "has finished training already" in capsys.readouterr().out


def test_patience_stops_when_selection_stalls_and_resume_knows(builtin_cache: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """--patience 2: a head that does not move (lr 1e-12) never beats its first epoch, so the run stops after epoch
    3 of 8; the summary says so, and --resume only reports that training is over."""
    run = tmp_path / "p"
    assert main([*FAST, "--trainable", "head", "--epochs", "8", "--lr", "1e-12", "--patience", "2",
                 "--runs-dir", str(tmp_path), "--name", "p"]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_epoch"] == 1 and summary["epochs_run"] == 3 and summary["stopped_early"] is True
    capsys.readouterr()
    assert main(["--resume", str(run)]) == 0
    assert "has finished training already" in capsys.readouterr().out
    assert main([*FAST, "--patience", "-1"]) == 2


def test_linear_init_resume_inside_phase_one(builtin_cache: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    args = [*FAST, "--method", "role", "--linear-init", "2", "--epochs", "1", "--workers", "0",
            "--runs-dir", str(tmp_path)]
    assert main([*args, "--name", "straight"]) == 0
    interrupt_after_saves(monkeypatch)
    assert main([*args, "--name", "resumed"]) == 130
    assert "linear" in load_checkpoint(tmp_path / "resumed" / "last.pt").training
    assert main(["--resume", str(tmp_path / "resumed")]) == 0
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=0, msg=key)
    torch.testing.assert_close(b.training["method"]["estimator"], a.training["method"]["estimator"], rtol=0, atol=0)
