"""``--data formatted:DIR``: the seeds' formatted .npy layout, on fabricated folders of 16 px images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from formatted_data import make_formatted

from export.validation_data import rebuild_splits
from models import load_checkpoint
from models.data.known_classes import CUB_ATTRIBUTES, NUS_WIDE_CONCEPTS
from models.data.protocol import build_protocol, parse_observed, split_train_val
from models.data.registry import detect_kind, load_dataset, spec_dataset_name
from models.data.types import DataError
from train.__main__ import main

TRAIN = ["--no-lgconv", "--arch", "resnet18", "--weights", "none", "--image-size", "32", "--epochs", "1",
         "--batch-size", "8",
         "--workers", "0", "--no-progress"]


def test_relative_paths_labels_sidecar_and_shipped_observed_labels(tmp_path: Path) -> None:
    names = ["ant", "bee", "cat", "dog", "eel"]
    f = make_formatted(tmp_path / "mydata", classes=names, negatives=True)  # the seeds' -1 entries are kept
    splits = load_dataset(f"formatted:{f.root}")
    assert splits.name == "mydata" and splits.classes == names and splits.val is None
    assert splits.train.paths == f.train_files and splits.test is not None and splits.test.paths == f.test_files
    np.testing.assert_array_equal(splits.train.labels, f.train_labels.astype(np.uint8))
    np.testing.assert_array_equal(splits.test.labels, f.test_labels.astype(np.uint8))
    assert f.observed is not None and splits.observed_source == "formatted_train_labels_obs.npy"
    np.testing.assert_array_equal(splits.train_observed, f.observed)
    assert detect_kind(f.root) == "formatted" and load_dataset(str(f.root)).classes == names
    # the seeds' protocol: val carved out of the train files (their "val" files are the test set)
    protocol = build_protocol(splits, parse_observed("single"), 0.2, 1200)
    train_idx, val_idx = split_train_val(30, 0.2, 1200)
    assert str(protocol.observed) == "given:formatted_train_labels_obs.npy"
    np.testing.assert_array_equal(protocol.train_observed, f.observed[train_idx])
    assert protocol.val.paths == [f.train_files[i] for i in val_idx] and len(protocol.test or []) == 10
    resampled = load_dataset(f"formatted:{f.root}?resample")
    assert resampled.train_observed is None


def test_absolute_paths_of_another_machine_need_the_image_root(tmp_path: Path) -> None:
    images = tmp_path / "mnt" / "store" / "imgs"
    f = make_formatted(tmp_path / "data", image_dir=images, recorded_prefix="/home/someone/datasets/imgs/",
                       observed=False)
    with pytest.raises(DataError) as err:
        load_dataset(f"formatted:{f.root}")
    message = str(err.value)
    assert "30 of 30 images missing" in message and "/home/someone/datasets/imgs/c0/train_000.jpg" in message
    assert "image-root" in message and "\n" not in message
    spec = f"formatted:{f.root}?image-root={tmp_path / 'mnt' / 'store'}"  # an ancestor of the images' tails
    splits = load_dataset(spec)
    assert splits.train.paths == f.train_files and splits.test is not None and splits.test.paths == f.test_files
    assert splits.source == spec and splits.train_observed is None


def test_missing_image_and_missing_file_errors_name_them(tmp_path: Path) -> None:
    f = make_formatted(tmp_path / "d")
    f.train_files[3].unlink()
    f.train_files[7].unlink()
    with pytest.raises(DataError, match=r"2 of 30 images missing; first: .*c0/train_003\.jpg \(from 'c0/train_003"):
        load_dataset(f"formatted:{f.root}")
    (f.root / "formatted_val_labels.npy").unlink()
    with pytest.raises(DataError, match=r"missing formatted_val_labels\.npy"):
        load_dataset(f"formatted:{f.root}")
    with pytest.raises(DataError, match="unknown option 'colour'"):
        load_dataset(f"formatted:{f.root}?colour=red")


def test_known_datasets_get_their_real_class_names(tmp_path: Path) -> None:
    # the seeds' NUS-WIDE folder: 81 concepts, images under Flickr/
    root = tmp_path / "nuswide"
    f = make_formatted(root, num_classes=81, n_train=12, n_test=4, image_dir=root / "Flickr", observed=False)
    splits = load_dataset(f"formatted:{f.root}")
    assert splits.name == "nus" and splits.classes == list(NUS_WIDE_CONCEPTS)
    assert spec_dataset_name(f"formatted:{root}") == "nus"
    assert splits.classes[19:21] == ["earthquake", "elk"] and splits.train.paths == f.train_files
    with pytest.raises(DataError, match="cub has 312 classes but the label files have 81"):
        load_dataset(f"formatted:{f.root}?dataset=cub")
    assert len(CUB_ATTRIBUTES) == 312 and CUB_ATTRIBUTES[0] == "has_bill_shape::curved_(up_or_down)"
    assert CUB_ATTRIBUTES[311] == "has_wing_pattern::multi-colored"
    # an unknown folder with a known class count: generic names unless ?dataset= says which it is
    other = make_formatted(tmp_path / "mine", num_classes=81, n_train=12, n_test=4, observed=False)
    assert load_dataset(f"formatted:{other.root}").classes[:2] == ["class_000", "class_001"]
    named = load_dataset(f"formatted:{other.root}?dataset=nus")
    assert named.name == "nus" and named.classes == list(NUS_WIDE_CONCEPTS)


def test_one_epoch_through_the_cli_uses_the_shipped_observed_labels(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    f = make_formatted(tmp_path / "pascal", num_classes=20, n_train=40)
    assert main([*TRAIN, "--data", f"formatted:{f.root}", "--runs-dir", str(tmp_path / "runs"), "--name", "r"]) == 0
    out = capsys.readouterr().out
    assert "observed labels: the dataset's own formatted_train_labels_obs.npy" in out
    run = tmp_path / "runs" / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dataset"] == "voc" and summary["test"]["num_images"] == 10 and 0 < summary["test"]["mAP"] <= 100
    saved = np.load(run / "observed.npz")
    train_idx, _ = split_train_val(40)
    assert f.observed is not None
    np.testing.assert_array_equal(saved["train_observed"], f.observed[train_idx])
    assert str(saved["observed"]) == "given:formatted_train_labels_obs.npy" and str(saved["dataset"]) == "voc"
    assert list(saved["classes"][:2]) == ["aeroplane", "bicycle"]
    # export rebuilds the same split from the checkpoint (to calibrate on the validation images)
    rebuilt = rebuild_splits(load_checkpoint(run / "best.pt").meta)
    assert [p.relative_to(f.root).as_posix() for p in rebuilt.val.paths] == list(saved["val_paths"])
    np.testing.assert_array_equal(rebuilt.train_observed, saved["train_observed"])


def test_a_wrong_folder_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main([*TRAIN, "--data", f"formatted:{tmp_path / 'empty'}", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "missing formatted_train_images.npy" in err and len(err.splitlines()) == 1
