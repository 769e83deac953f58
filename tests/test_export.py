"""ONNX export: single self-contained file, metadata round trip, sidecar, dynamic batch, parity, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from PIL import Image
from reference import reference_logits

import export.onnx_vs_pytorch as verify_mod
from export import (
    META_KEY,
    ParityError,
    VerificationDataError,
    export_onnx,
    read_onnx_meta,
    read_sidecar,
)
from models import ModelMeta, build_model, load_checkpoint, save_checkpoint
from models.data.types import LabelledImages
from models.files.digest import file_sha256
from models.preprocess import EvalTransform

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "car", "tree", "boat"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def make_images(folder: Path, n: int = 6, seed: int = 0) -> list[Path]:
    """``n`` random jpg/png images (some in a subfolder), one corrupt .jpg and a .txt; returns the good ones."""
    rng = np.random.default_rng(seed)
    good = []
    for i in range(n):
        sub = folder / "sub" if i % 2 else folder
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / (f"img{i}.png" if i % 3 == 0 else f"img{i}.JPG")
        Image.fromarray(rng.integers(0, 256, (30 + 5 * i, 44, 3), dtype=np.uint8)).save(path)
        good.append(path)
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8 this is not really a jpeg")
    (folder / "notes.txt").write_text("not an image\n")
    return good


def make_checkpoint(path: Path, data: dict | None = None, thresholds: list[float] | None = None) -> ModelMeta:
    """A random-init resnet18 checkpoint at image size 32; returns the meta as it loads back."""
    torch.manual_seed(0)
    model = build_model("resnet18", len(CLASSES))
    meta = ModelMeta(
        classes=CLASSES,
        arch="resnet18",
        image_size=32,
        method="an",
        method_hparams={"eps": 0.1},
        data=data if data is not None else {},
        metrics={"val": {"mAP": 12.5}},
        thresholds=thresholds,
        epoch=2,
    )
    save_checkpoint(path, model.state_dict(), meta)
    return load_checkpoint(path).meta


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path], ModelMeta]:
    root = tmp_path_factory.mktemp("export")
    images = root / "images"
    good = make_images(images)
    meta = make_checkpoint(root / "run" / "best.pt")
    return root, images, good, meta


def test_export_with_images_folder(setup: tuple[Path, Path, list[Path], ModelMeta]) -> None:
    root, images, good, meta = setup
    result = export_onnx(root / "run", images=images)
    out = root / "run" / "export" / "model.onnx"
    assert result.onnx_path == out
    # exactly one self-contained model file + its sidecar, no temp files, no external data
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.json", "model.onnx"]

    onnx.checker.check_model(str(out), full_check=True)
    proto = onnx.load(str(out))
    assert read_onnx_meta(out) == meta
    props = {p.key: p.value for p in proto.metadata_props}
    assert ModelMeta.from_json(props[META_KEY]) == meta
    assert json.loads(props["classes"]) == CLASSES
    assert props["image_size"] == "32" and props["output"] == "logits"
    assert json.loads(props["mean"]) == pytest.approx(list(meta.mean))
    assert json.loads(props["std"]) == pytest.approx(list(meta.std))
    assert [o.version for o in proto.opset_import if o.domain == ""] == [20]

    (inp,), (outp,) = proto.graph.input, proto.graph.output
    assert (inp.name, outp.name) == ("images", "logits")
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == ["batch", 3, 32, 32]
    assert [d.dim_param or d.dim_value for d in outp.type.tensor_type.shape.dim] == ["batch", len(CLASSES)]

    side = read_sidecar(out.with_suffix(".json"))
    assert side["sha256"] == file_sha256(out) == result.sha256
    assert side["meta"]["classes"] == CLASSES
    assert side["export"]["opset"] == 20 and "torch" in side["export"]["versions"]
    v = side["verification"]
    assert v["passed"] and v["images_used"] == len(good) and len(v["images_skipped"]) == 1
    assert v["max_abs_diff"] <= 1e-4 and set(v["batch_sizes_checked"]) >= {1, 3}

    # independent parity check: ORT on the real images vs the PyTorch checkpoint, batches 1, 3 and all
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    tf = EvalTransform.for_meta(meta)
    x = torch.stack([tf(p) for p in good]).numpy()
    ref = reference_logits(root / "run" / "best.pt", good)
    for n in (1, 3, len(good)):
        (got,) = session.run(None, {"images": x[:n]})
        assert got.shape == (n, len(CLASSES))
        assert np.abs(got - ref[:n]).max() <= 1e-4
    assert "model.onnx" in result.summary() and "max |diff|" in result.summary()


def test_export_on_rebuilt_val_split(setup: tuple[Path, Path, list[Path], ModelMeta], tmp_path: Path) -> None:
    """Without --images the val split is rebuilt with the real load_dataset(meta.data['source']) + protocol."""
    from models.data.csv_format import write_csv
    from models.data.protocol import build_protocol, parse_observed
    from models.data.registry import load_dataset

    _, _, good, _ = setup
    rng = np.random.default_rng(1)
    labels = np.eye(len(CLASSES), dtype=np.uint8)[rng.integers(0, len(CLASSES), len(good))]
    csv_path = write_csv(tmp_path / "data", {"train": LabelledImages(list(good), labels, CLASSES)})
    source = f"csv:{csv_path.resolve()}"
    data = {"name": "data", "source": source, "observed": "single", "protocol_seed": 1200, "val_fraction": 0.5}
    make_checkpoint(tmp_path / "best.pt", data=data)

    val = build_protocol(load_dataset(source), parse_observed("single"), 0.5, 1200).val.paths
    out = tmp_path / "deploy" / "tagger.onnx"
    result = export_onnx(tmp_path / "best.pt", out, verify_images=2)
    assert result.onnx_path == out and out.is_file() and (tmp_path / "deploy" / "tagger.json").is_file()
    assert result.verification.images_used == min(2, len(val))
    assert f"val split of {source}" in result.verification.source
    assert result.verification.max_abs_diff <= 1e-4


def test_no_verification_images_is_a_clear_error(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "best.pt", data={})
    with pytest.raises(VerificationDataError, match="--images"):
        export_onnx(tmp_path / "best.pt")
    assert not (tmp_path / "export" / "model.onnx").exists()


def test_broken_parity_fails_and_leaves_no_model(
    setup: tuple[Path, Path, list[Path], ModelMeta], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, images, _, _ = setup
    make_checkpoint(tmp_path / "run" / "best.pt")
    real = verify_mod._ort_logits

    def perturbed(session: ort.InferenceSession, inputs: np.ndarray, batch_size: int) -> np.ndarray:
        return real(session, inputs, batch_size) + 3e-3

    monkeypatch.setattr(verify_mod, "_ort_logits", perturbed)
    with pytest.raises(ParityError, match=r"parity check failed.*0\.003"):
        export_onnx(tmp_path / "run" / "best.pt", images=images)
    out_dir = tmp_path / "run" / "export"
    assert not (out_dir / "model.onnx").exists() and not (out_dir / "model.json").exists()
    assert list(out_dir.iterdir()) == []  # the temp file is gone too


def test_cli_help_and_usage_errors(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "export"]
    done = subprocess.run([*run, "--help"], capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert done.returncode == 0 and "--verify-images" in done.stdout and "exit status" in done.stdout

    done = subprocess.run(
        [*run, str(tmp_path / "no-such-run")], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert done.returncode == 2
    assert "no-such-run" in done.stderr and "Traceback" not in done.stderr

    done = subprocess.run(
        [*run, "--runs-dir", str(tmp_path / "empty")], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert done.returncode == 2 and "no trained run" in done.stderr


def test_cli_parity_failure_exits_1(
    setup: tuple[Path, Path, list[Path], ModelMeta],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In-process CLI run: --atol 0 with a perturbed ORT output -> exit 1, measured diff reported, no file."""
    from export.__main__ import main

    _, images, _, _ = setup
    make_checkpoint(tmp_path / "best.pt")
    real = verify_mod._ort_logits
    monkeypatch.setattr(verify_mod, "_ort_logits", lambda s, x, b: real(s, x, b) + 1e-6)
    out = tmp_path / "m.onnx"
    code = main([str(tmp_path / "best.pt"), "--images", str(images), "--atol", "0", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "parity check failed" in err and "> atol 0" in err and "Traceback" not in err
    assert not out.exists() and not out.with_suffix(".json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]
