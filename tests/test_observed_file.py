"""The run's protocol file (observed.npz): written by every run, byte-identical for the same protocol, reused with
``--observed FILE``; and unreadable images skipped during training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from formatted_data import make_formatted

from models import load_checkpoint
from models.data.observed_file import protocol_file_bytes, read_protocol_file
from models.data.protocol import build_protocol, parse_observed, protocol_record, sample_observed, split_train_val
from models.data.registry import load_dataset
from train.__main__ import main

FAST = ["--data", "builtin:tiny", "--no-lgconv", "--arch", "resnet18", "--weights", "none", "--image-size", "16",
        "--epochs", "1",
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


def test_negatives_val_labels_and_bias_variants_round_trip_through_the_cli(builtin_cache: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--observed 'single?neg=3&val=observed'`` with iu: config.json, the version-2 protocol file (-1 entries,
    the val images' observed labels, the variant) and checkpoint record it, and ``--observed FILE`` restores all
    of it byte for byte; a method whose loss has no place for negatives trains with their added term; iu refuses
    labels without negatives; ``single:size`` on the built-in
    data is recorded as such."""
    a = _run(tmp_path, "a", "--method", "iu", "--observed", "single?neg=3&val=observed")
    assert json.loads((a / "config.json").read_text())["config"]["observed"] == "single?neg=3&val=observed"
    assert load_checkpoint(a / "best.pt").meta.data["observed"] == "single?neg=3&val=observed"
    with np.load(a / "observed.npz") as raw:
        assert str(raw["format"]) == "spml-observed/2" and raw["train_observed"].dtype == np.int8
    record = read_protocol_file(a / "observed.npz")
    assert record.observed == "single?neg=3&val=observed" and record.val_observed is not None
    assert ((record.train_observed == 1).sum(1) == 1).all() and ((record.train_observed == -1).sum(1) == 3).all()
    assert record.val_observed.shape == (40, 20) and ((record.val_observed == -1).sum(1) == 3).all()
    dataset = load_dataset("builtin:tiny")
    pool = sample_observed(dataset.train.labels, parse_observed("single?neg=3"))
    train_idx, val_idx = split_train_val(200)
    np.testing.assert_array_equal(record.train_observed, pool[train_idx])
    np.testing.assert_array_equal(record.val_observed, pool[val_idx])
    restored = build_protocol(dataset, parse_observed(str(a / "observed.npz")))
    np.testing.assert_array_equal(restored.val.labels, pool[val_idx] == 1)  # scored with the observed positives
    b = _run(tmp_path, "b", "--method", "iu", "--observed", str(a / "observed.npz"))
    assert (b / "observed.npz").read_bytes() == (a / "observed.npz").read_bytes()
    capsys.readouterr()
    assert main([*FAST, "--runs-dir", str(tmp_path), "--method", "iu", "--observed", "single"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "these labels have none" in err and len(err.splitlines()) == 1, err
    an = _run(tmp_path, "an-negatives", "--method", "an", "--observed", "single?neg=3")
    lines = [json.loads(line) for line in (an / "metrics.jsonl").read_text().splitlines()]
    assert all(line["known_negatives_loss"] > 0 for line in lines)
    labels = json.loads((an / "config.json").read_text())["resolved"]["labels"]
    assert labels["train"]["known_negatives"] == 3 * 160 and labels["val"]["known_negatives"] == 3 * 40
    size = build_protocol(dataset, parse_observed("single:size"))  # what a run with --observed single:size saves
    (tmp_path / "size.npz").write_bytes(protocol_file_bytes(protocol_record(size, dataset)))
    record = read_protocol_file(tmp_path / "size.npz")
    expected_size = sample_observed(dataset.train.labels, parse_observed("single:size"), 1200, dataset)
    assert record.observed == "single:size" and (record.train_observed != pool[train_idx]).any()
    np.testing.assert_array_equal(record.train_observed, expected_size[train_idx])


def test_version_1_protocol_files_are_still_read(builtin_cache: Path, tmp_path: Path) -> None:
    """A file of format spml-observed/1 (0/1 uint8 train_observed, no val_observed) gives the same protocol."""
    dataset = load_dataset("builtin:tiny")
    protocol = build_protocol(dataset, parse_observed("single"))
    arrays = protocol_record(protocol, dataset).arrays()
    del arrays["val_observed"]
    arrays["format"] = np.array("spml-observed/1")
    arrays["train_observed"] = arrays["train_observed"].astype(np.uint8)
    np.savez(tmp_path / "v1.npz", **arrays)
    restored = build_protocol(dataset, parse_observed(str(tmp_path / "v1.npz")))
    np.testing.assert_array_equal(restored.train_observed, protocol.train_observed)
    assert restored.val.paths == protocol.val.paths and restored.val_observed is None
    np.testing.assert_array_equal(restored.val.labels, protocol.val.labels)
    written = read_protocol_file(tmp_path / "v1.npz")
    assert written.val_observed is None and str(restored.observed) == "single"
    assert protocol_file_bytes(protocol_record(restored, dataset)) != (tmp_path / "v1.npz").read_bytes()
