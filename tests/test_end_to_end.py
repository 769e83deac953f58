"""The product path a user takes: tiny training run -> ONNX export -> tagging a folder, with real values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from export import read_onnx_meta
from models.data.registry import load_dataset
from models.network import input_config
from models.preprocess import EvalTransform
from models.runtimes import TorchBackend
from train.__main__ import main as train_main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("arch", ["resnet18", "test_efficientnet"])
def test_train_export_tag(builtin_cache: Path, tmp_path: Path, arch: str) -> None:
    """The built-in data's default ResNet-18 (with LgConv), and a timm backbone (TF "same" padding, bicubic resize)
    through INT8 too: the preprocessing travels with the model from training to tagging."""
    runs = tmp_path / "runs"
    assert train_main(["--data", "builtin:tiny", "--epochs", "1", "--image-size", "32", "--batch-size", "16",
                       "--workers", "0", "--no-progress", "--runs-dir", str(runs), "--name", "e2e",
                       "--arch", arch, "--weights", "none"]) == 0
    run = runs / "e2e"

    # export the run (by folder) - verification on the run's real validation images happens inside
    # (a one-epoch random model's scores sit at its thresholds: INT8 flips 1-2% of its decisions, so the bound is
    # lowered here as a user would with --min-agreement, and its mAP on 40 images moves by a point or two, so
    # --max-map-drop too; the summary reports the agreement measured)
    out = _run("-m", "export", str(run), *(["--precision", "int8", "--min-agreement", "0.9", "--max-map-drop", "3"]
                                            if arch != "resnet18" else []))
    assert out.returncode == 0, out.stderr + out.stdout
    if arch != "resnet18":
        assert (run / "export" / "model.int8-cpu.onnx").is_file()
        rows = {row["name"]: row for row in json.loads((run / "export" / "summary.json").read_text())["artifacts"]}
        assert 0.9 <= rows["int8-cpu"]["agreement"] <= 1.0
        config = input_config(arch)  # the backbone's pretrained configuration, carried by the exported model
        exported = read_onnx_meta(run / "export" / "model.onnx")
        assert (exported.interpolation, exported.mean, exported.std) == (config.interpolation, config.mean, config.std)
        assert exported.interpolation == "bicubic"
    onnx_path, sidecar = run / "export" / "model.onnx", run / "export" / "model.json"
    assert onnx_path.is_file() and sidecar.is_file()
    doc = json.loads(sidecar.read_text())
    verification = doc["verification"]
    assert verification["passed"] and verification["max_abs_diff"] <= 1e-4
    assert verification["images_used"] == 32 and "val split of builtin:tiny@seed0" in verification["source"]
    # per-class thresholds were calibrated on the (fully labelled) val split and travel inside the model
    thresholds = read_onnx_meta(onnx_path).thresholds
    assert thresholds is not None and len(thresholds) == len(doc["meta"]["classes"])
    assert doc["meta"]["thresholds"] == thresholds and doc["meta"]["calibration"]["mode"] == "f1"
    assert (run / "export" / "calibration-fp32.md").is_file() and (run / "export" / "summary.md").is_file()

    # a folder of real test images, nested, plus one broken file
    test_split = load_dataset("builtin:tiny").test
    assert test_split is not None
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    chosen = test_split.paths[:9]
    for i, src in enumerate(chosen):
        shutil.copy(src, folder / ("nested" if i % 3 == 0 else "") / f"img{i}.JPG")
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    jsonl = tmp_path / "tags.jsonl"
    out = _run("-m", "serve", "tag", str(folder), "--model", str(onnx_path), "--output", str(jsonl), "--no-progress")
    assert out.returncode == 1, out.stderr  # one file failed
    assert "broken.jpg" in out.stderr
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 9

    # the scores are the trained model's: recompute them independently with the PyTorch checkpoint
    torch_model = TorchBackend.load(run / "best.pt", device="cpu")
    meta = torch_model.meta
    transform = EvalTransform.for_meta(meta)
    by_path = {r["path"]: r for r in records}
    for i, _src in enumerate(chosen):
        rel = ("nested/" if i % 3 == 0 else "") + f"img{i}.JPG"
        logits = torch_model.predict_logits(transform(folder / rel).numpy()[None])[0]
        expected = 1 / (1 + np.exp(-logits.astype(np.float64)))
        got = np.array([by_path[rel]["scores"][c] for c in meta.classes])
        np.testing.assert_allclose(got, expected, atol=2e-6)
        assert by_path[rel]["tags"] == sorted(
            [c for c, p, t in zip(meta.classes, got, thresholds, strict=True) if p >= t],
            key=lambda c: -by_path[rel]["scores"][c],
        )

    # the PyTorch checkpoint is a servable model too, with the same scores
    jsonl_pt = tmp_path / "tags_pt.jsonl"
    out = _run("-m", "serve", "tag", str(folder / "nested"), "--model", str(run / "best.pt"),
               "--output", str(jsonl_pt), "--no-progress")
    assert out.returncode == 0, out.stderr
    for line in jsonl_pt.read_text().splitlines():
        rec = json.loads(line)
        ref = by_path["nested/" + rec["path"]]["scores"]
        assert rec["scores"] == pytest.approx(ref, abs=2e-5)
