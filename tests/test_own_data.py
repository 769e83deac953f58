"""Own single-positive data end to end: a class-per-folder tree with one label per image -> train -> export with
positive-only thresholds (k estimated, or from an audit list) and every figure naming its labels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from export.__main__ import main as export_main
from export.onnx_files import read_sidecar
from export.pipeline import export_run
from models.data.protocol import ObservedSpec, sample_observed
from models.data.registry import load_dataset
from train.__main__ import main as train_main


@pytest.fixture(scope="module")
def own_run(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """builtin:tiny's 200 training images filed (hard links) under the folder of ONE of their classes, a 2-epoch
    EPR run on that tree (k estimated: no published k, no full labels), and an audit list: 20 test images with all
    their labels (labels.csv)."""
    tiny = load_dataset("builtin:tiny")
    assert tiny.test is not None
    base = tmp_path_factory.mktemp("own")
    root = base / "shapes"
    observed = sample_observed(tiny.train.labels, ObservedSpec("single"))
    for path, row in zip(tiny.train.paths, observed, strict=True):
        folder = root / tiny.classes[int(np.flatnonzero(row)[0])]
        folder.mkdir(parents=True, exist_ok=True)
        os.link(path, folder / path.name)
    classes = sorted(p.name for p in root.iterdir())
    lines = ["image,labels"]
    for path, row in list(zip(tiny.test.paths, tiny.test.labels, strict=True))[:20]:
        names = [tiny.classes[c] for c in np.flatnonzero(row) if tiny.classes[c] in classes]
        if names:
            lines.append(f"{path},{';'.join(names)}")
    audit = base / "audit" / "labels.csv"
    audit.parent.mkdir()
    audit.write_text("\n".join(lines) + "\n")
    runs = base / "runs"
    assert train_main(["--data", f"folder:{root}", "--method", "epr", "--epochs", "2", "--image-size", "32",
                       "--batch-size", "16", "--linear-init", "0",  # end to end from the first epoch: two epochs
                       "--workers", "0", "--no-progress", "--no-lgconv", "--runs-dir", str(runs), "--name", "own"]) == 0
    return runs / "own", audit, classes


def test_the_run_knows_it_has_no_full_labels(own_run: tuple[Path, Path, list[str]]) -> None:
    """Regimes detected and saved, label-free selection, k estimated after every epoch, no figure that needs full
    labels, no full-label diagnostics."""
    run, _, _ = own_run
    resolved = json.loads((run / "config.json").read_text())["resolved"]
    assert {s: r["kind"] for s, r in resolved["labels"].items()} == {"train": "single-positive",
                                                                    "val": "single-positive"}
    assert resolved["selection"]["criterion"] == "observed-map" and "no full labels" in resolved["selection"]["reason"]
    assert resolved["expected_positives"]["source"] == "estimated"
    assert resolved["expected_positives"]["k"] == pytest.approx(1.0)  # the first epoch: the observed positives
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2]
    for e in epochs:
        assert e["val_mAP"] is None and e["val_OF1"] is None and e["val_mAP_observed"] > 0
        assert e["k_estimate"] >= 1.0 and 0 < e["val_observed-map"] <= 100
        assert not any(key.endswith(("_recovery_mAP", "_precision")) for key in e)  # no full-label diagnostics
    summary = json.loads((run / "summary.json").read_text())
    assert summary["selection"] == "observed-map" and "train_recovery" not in summary
    assert summary["expected_positives"]["k"] == pytest.approx(epochs[-1]["k_estimate"], abs=1e-4)
    assert summary["val"]["mAP"] is None and summary["val"]["mAP_observed"] is not None


def test_an_oracle_is_refused_without_full_labels(own_run: tuple[Path, Path, list[str]], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run, _, _ = own_run
    source = json.loads((run / "config.json").read_text())["config"]["data"]
    code = train_main(["--data", source, "--method", "bce", "--epochs", "1", "--workers", "0", "--no-progress",
                       "--runs-dir", str(tmp_path), "--name", "oracle"])
    assert code == 2 and "training labels are single-positive" in capsys.readouterr().err
    assert not (tmp_path / "oracle").exists()


def test_export_calibrates_positive_only_with_estimated_k(own_run: tuple[Path, Path, list[str]], tmp_path: Path
                                                          ) -> None:
    run, _, classes = own_run
    lines: list[str] = []
    result = export_run(run, tmp_path / "model.onnx", progress=False, log=lines.append, verify_images=8)
    text = "\n".join(lines)
    assert "validation labels: val single-positive (" in text
    assert "expected tags per image for rate: k = " in text and "(estimated: from the scores of the" in text
    assert "(single-positive val labels); F1 n/a (no full labels)" in text
    assert "| val mAP (single-positive val labels) |" in result.table()
    calibration = read_sidecar(tmp_path / "model.json")["meta"]["calibration"]
    assert calibration["mode"].startswith("rate:") and calibration["labels"] == "single-positive val labels"
    k = calibration["expected_positives"]
    assert k["source"] == "estimated" and 1.0 <= k["k"] <= len(classes) and k["low"] <= k["k"] <= k["high"]
    assert float(calibration["mode"].split(":")[1]) == pytest.approx(k["k"], rel=1e-4)
    report = (tmp_path / "calibration-fp32.md").read_text()
    assert "metrics against the single-positive val labels" in report and "lower bounds" in report
    card = (tmp_path / "README.md").read_text()  # the model card says what its figures were measured against
    assert "measured against the single-positive val labels" in card and "val: mAP n/a (no full labels)" in card


def test_export_with_an_audit_list_takes_k_and_f1_from_it(own_run: tuple[Path, Path, list[str]],
                                                         tmp_path: Path) -> None:
    run, audit, _ = own_run
    rows = audit.read_text().splitlines()[1:]
    k_audit = np.mean([len(r.split(",", 1)[1].split(";")) for r in rows])
    lines: list[str] = []
    export_run(run, tmp_path / "model.onnx", progress=False, log=lines.append, audit=str(audit), verify_images=8)
    text = "\n".join(lines)
    assert f"expected tags per image for rate: k = {k_audit:.2f} (audit: {len(rows)} audited images)" in text
    assert f"calibrated, against the audit list ({len(rows)} images)" in text
    calibration = read_sidecar(tmp_path / "model.json")["meta"]["calibration"]
    assert calibration["expected_positives"]["source"] == "audit"
    assert calibration["expected_positives"]["k"] == pytest.approx(k_audit, abs=1e-4)
    assert calibration["audit_report"] == "calibration-fp32-audit.md"
    audit_report = json.loads((tmp_path / "calibration-fp32-audit.json").read_text())
    assert audit_report["labels"] == f"the audit list ({len(rows)} images)" and audit_report["num_images"] == len(rows)


def test_export_cli_rejects_an_audit_list_with_unknown_classes(own_run: tuple[Path, Path, list[str]],
                                                                tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run, audit, _ = own_run
    bad = tmp_path / "bad.csv"
    first = audit.read_text().splitlines()[1].split(",")[0]
    bad.write_text(f"image,labels\n{first},no_such_class\n")
    code = export_main([str(run), "--output", str(tmp_path / "m.onnx"), "--audit", str(bad), "--no-progress"])
    assert code == 2
    assert "classes the model does not know: no_such_class" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()  # checked before anything is exported
