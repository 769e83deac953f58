"""The run's protocol file (observed.npz): written by every run, byte-identical for the same protocol, reused with
``--observed FILE``; and unreadable images skipped during training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from formatted_data import make_formatted

from models import load_checkpoint
from train.__main__ import main
from train.data.observed_file import protocol_file_bytes, read_protocol_file
from train.data.protocol import build_protocol, parse_observed, protocol_record, split_train_val
from train.data.registry import load_dataset

FAST = ["--data", "builtin:tiny", "--no-lgconv", "--arch", "resnet18", "--image-size", "16", "--epochs", "1",
        "--batch-size", "8", "--workers", "0", "--no-progress"]


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    assert main([*FAST, "--runs-dir", str(tmp_path), "--name", name, *extra]) == 0
    return tmp_path / name


def test_saved_protocol_round_trip_and_byte_identical_files(builtin_cache: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path, "a", "--method", "an")
    b = _run(tmp_path, "b", "--method", "role", "--observed", str(a / "observed.npz"))
    c = _run(tmp_path, "c", "--method", "epr")
    assert "observed labels: single from" in capsys.readouterr().out
    data = {run.name: (run / "observed.npz").read_bytes() for run in (a, b, c)}
    assert data["a"] == data["b"] == data["c"]
    dataset = load_dataset("builtin:tiny")  # another protocol seed: other labels and split, other bytes
    protocol = build_protocol(dataset, parse_observed("single"), 0.2, 7)
    other_seed = protocol_file_bytes(protocol_record(protocol, dataset))
    assert other_seed != data["a"]
    record = read_protocol_file(a / "observed.npz")
    assert len(record.train_paths) == 160 and len(record.val_paths) == 40 and record.protocol_seed == 1200
    assert record.train_observed.shape == (160, 20) and (record.train_observed.sum(1) == 1).all()
    assert record.train_paths[0].startswith("train/") and protocol_file_bytes(record) == data["a"]
    hashes = set()
    for run in (a, b, c):
        resolved = json.loads((run / "config.json").read_text())["resolved"]
        assert load_checkpoint(run / "best.pt").meta.data["observed_sha256"] == resolved["observed_sha256"]
        hashes.add(resolved["observed_sha256"])
    assert len(hashes) == 1 and len(hashes.pop()) == 64
    # B trained on exactly A's labels and split
    assert load_checkpoint(b / "best.pt").meta.data["num_val"] == 40
    assert json.loads((b / "config.json").read_text())["config"]["observed"] == str(a / "observed.npz")


def test_a_mismatched_protocol_file_is_one_clear_error(builtin_cache: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path, "a")
    record = read_protocol_file(a / "observed.npz")
    record.train_paths[5] = "train/not-in-this-dataset.jpg"
    (tmp_path / "moved.npz").write_bytes(protocol_file_bytes(record))
    record = read_protocol_file(a / "observed.npz")
    record.classes = [f"x{i}" for i in range(20)]
    (tmp_path / "classes.npz").write_bytes(protocol_file_bytes(record))
    np.save(tmp_path / "rows.npy", np.zeros((3, 20)))
    capsys.readouterr()
    for bad, expected in [("moved.npz", "1 of its 160 training images are not in it (first: "
                                        "train/not-in-this-dataset.jpg)"),
                          ("classes.npz", "its 20 classes (x0, x1, x2, ...) differ"),
                          ("rows.npy", "expected a (200, C) label matrix")]:
        assert main([*FAST, "--runs-dir", str(tmp_path), "--observed", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and expected in err and len(err.splitlines()) == 1, err
    assert main([*FAST, "--runs-dir", str(tmp_path), "--observed", str(tmp_path / "nothing.npz")]) == 2
    assert "or an existing protocol FILE" in capsys.readouterr().err


def test_an_unreadable_image_is_reported_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = make_formatted(tmp_path / "data", n_train=40, n_test=10)
    train_idx, val_idx = split_train_val(40)
    broken = [f.train_files[train_idx[3]], f.train_files[val_idx[1]]]  # one in train, one in val
    for path in broken:
        path.write_bytes(b"this is not a JPEG")
    assert main([*FAST, "--data", f"formatted:{f.root}", "--method", "role", "--epochs", "2",
                 "--runs-dir", str(tmp_path / "runs"), "--name", "r"]) == 0
    err = capsys.readouterr().err
    for path in broken:  # one warning per file over the whole run (two epochs, several evaluations)
        assert err.count(f"warning: skipping unreadable image {path}: ") == 1
    assert "val: 1 unreadable image(s) left out of the metrics" in err
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["val"]["num_images"] == 7 and summary["test"]["num_images"] == 10
    assert summary["train_recovery"]["num_images"] == 31 and 0 < summary["test"]["mAP"] <= 100
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2]
