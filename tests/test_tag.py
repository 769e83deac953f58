"""Folder tagging: JSONL content equals sigmoid(PyTorch logits), thresholds, failures and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from reference import reference_logits

from export import export_onnx
from models import ModelMeta, build_model, load_checkpoint, save_checkpoint
from serve.runtimes import OnnxRuntimeBackend, TorchBackend, runtime_for
from serve.tag import class_thresholds, find_images, tag_record

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "car", "tree", "boat"]
THRESHOLDS = [0.3, 0.45, 0.5, 0.55, 0.7]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_tag(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "serve", "tag", *map(str, args), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=120)


def make_images(folder: Path, n: int, seed: int) -> list[Path]:
    """``n`` random images with mixed extension case, some in nested folders; returns their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        sub = folder / ("a/b" if i % 3 == 2 else "a" if i % 3 == 1 else "")
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / (f"im{i}.png" if i % 2 else f"im{i}.JPEG")
        Image.fromarray(rng.integers(0, 256, (24 + 3 * i, 40, 3), dtype=np.uint8)).save(
            path, format="PNG" if i % 2 else "JPEG"
        )
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, ModelMeta]:
    """(checkpoint, exported onnx, meta) of a random resnet18 with per-class thresholds."""
    root = tmp_path_factory.mktemp("tagmodel")
    torch.manual_seed(1)
    net = build_model("resnet18", len(CLASSES))
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=48, thresholds=THRESHOLDS)
    save_checkpoint(root / "best.pt", net.state_dict(), meta)
    pics = root / "pics"
    make_images(pics, 3, seed=9)
    result = export_onnx(root / "best.pt", images=pics)
    return root / "best.pt", result.onnx_path, load_checkpoint(root / "best.pt").meta


def expected_scores(checkpoint: Path, folder: Path, paths: list[Path]) -> dict[str, np.ndarray]:
    """sigmoid(PyTorch logits) per relative path, computed without the serve package."""
    probs = 1.0 / (1.0 + np.exp(-reference_logits(checkpoint, paths).astype(np.float64)))
    return {p.relative_to(folder).as_posix(): row for p, row in zip(paths, probs, strict=True)}


def check_lines(lines: list[dict], expected: dict[str, np.ndarray], thresholds: list[float]) -> None:
    assert [r["path"] for r in lines] == sorted(expected)
    for rec in lines:
        assert list(rec["scores"]) == CLASSES
        got = np.array([rec["scores"][c] for c in CLASSES])
        assert np.abs(got - expected[rec["path"]]).max() <= 1e-4
        want = [c for c, t in zip(CLASSES, thresholds, strict=True) if rec["scores"][c] >= t]
        assert sorted(rec["tags"]) == sorted(want)
        assert [rec["scores"][c] for c in rec["tags"]] == sorted((rec["scores"][c] for c in rec["tags"]), reverse=True)


def test_tag_folder_with_a_corrupt_file(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    checkpoint, onnx_path, _ = model
    folder = tmp_path / "photos"
    good = make_images(folder, 7, seed=3)
    (folder / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (folder / "readme.txt").write_text("ignored\n")
    out = tmp_path / "out" / "tags.jsonl"
    done = run_tag(folder, "--model", onnx_path, "--output", out, "--batch-size", "3", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "a/broken.png" in done.stderr and "1 failed" in done.stderr
    assert "readme.txt" not in done.stderr.replace("non-image", "")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(good)
    check_lines(lines, expected_scores(checkpoint, folder, good), THRESHOLDS)  # the model's thresholds
    assert any(rec["tags"] for rec in lines) or all(max(rec["scores"].values()) < min(THRESHOLDS) for rec in lines)


def test_clean_folder_exit_0_default_output_and_global_threshold(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path
) -> None:
    checkpoint, onnx_path, _ = model
    folder = tmp_path / "clean"
    good = make_images(folder, 4, seed=5)
    elsewhere = tmp_path / "elsewhere"
    make_images(elsewhere, 2, seed=6)
    (folder / "link").symlink_to(elsewhere, target_is_directory=True)  # symlinked folders are not followed
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_tag(folder, "--model", onnx_path, "--threshold", "0.5", cwd=cwd)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (cwd / "tags.jsonl").read_text().splitlines()]
    check_lines(lines, expected_scores(checkpoint, folder, good), [0.5] * len(CLASSES))


def test_usage_errors_exit_2(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    _, onnx_path, _ = model
    done = run_tag(tmp_path / "missing", "--model", onnx_path, cwd=tmp_path)
    assert done.returncode == 2 and "folder not found" in done.stderr
    done = run_tag(tmp_path, "--model", tmp_path / "nope.onnx", cwd=tmp_path)
    assert done.returncode == 2 and "model not found" in done.stderr
    assert not (tmp_path / "tags.jsonl").exists()


def test_runtimes_agree_and_registry(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    checkpoint, onnx_path, meta = model
    assert runtime_for(onnx_path) is OnnxRuntimeBackend and runtime_for(checkpoint) is TorchBackend
    with pytest.raises(ValueError, match="unsupported model file"):
        runtime_for(tmp_path / "model.engine.txt")
    ort_rt = OnnxRuntimeBackend.load(onnx_path)
    torch_rt = TorchBackend.load(checkpoint, device="cpu")
    assert ort_rt.meta == meta == torch_rt.meta
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 48)).astype(np.float32)
    assert np.abs(ort_rt.predict_logits(x) - torch_rt.predict_logits(x)).max() <= 1e-4
    folder = tmp_path / "f"
    make_images(folder, 3, seed=1)
    assert [p.relative_to(folder).as_posix() for p in find_images(folder)] == ["a/b/im2.JPEG", "a/im1.png", "im0.JPEG"]


def test_thresholds_and_record() -> None:
    meta = ModelMeta(classes=["a", "b", "c"], arch="resnet18", image_size=32, thresholds=[0.2, 0.5, 0.9])
    assert class_thresholds(meta).tolist() == [0.2, 0.5, 0.9]
    assert class_thresholds(meta, 0.4).tolist() == [0.4] * 3
    meta.thresholds = None
    assert class_thresholds(meta).tolist() == [0.5] * 3
    rec = tag_record("x.jpg", np.array([0.3, 0.95, 0.5000004]), ["a", "b", "c"], np.array([0.2, 0.5, 0.5]))
    assert rec == {"path": "x.jpg", "scores": {"a": 0.3, "b": 0.95, "c": 0.5}, "tags": ["b", "c", "a"]}
