"""The whole export of a trained run: calibrated thresholds per artifact, FP16/INT8 checks, engines, summary."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from reference import reference_logits

from export import openvino_check
from export import pipeline as export_pipeline
from export.errors import PrecisionError
from export.onnx_files import read_onnx_meta, read_sidecar
from export.pipeline import export_run
from export.precisions import PrecisionBounds, parse_precisions
from export.threshold_calibration import THRESHOLD_MAX, THRESHOLD_MIN
from models import load_checkpoint
from models.data.protocol import build_protocol, parse_observed
from models.data.registry import load_dataset
from models.evaluation.metrics import per_class_ap
from models.files.digest import file_sha256
from models.preprocess import EvalTransform
from models.runtimes.devices import cpu_name
from models.runtimes.openvino_backend import cpu_has_bf16
from models.runtimes.tensorrt_backend import tensorrt_importable
from serve.demo.model_store import model_markdown
from serve.predictor import Predictor
from train.__main__ import main as train_main

HAS_RTX = tensorrt_importable("tensorrt-rtx")


@pytest.fixture(scope="module")
def run(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained tiny run (LgConv on, so the export folds it): LL-R with BoostLU (Kim et al. 2023's
    combination), whose boosted head the export, its checks and the tagger must all keep; its second epoch
    rejects large losses."""
    runs = tmp_path_factory.mktemp("pipeline-runs")
    assert train_main(["--data", "builtin:tiny", "--method", "ll-r", "--hp", "delta_rel=5", "--boostlu",
                       "--epochs", "2", "--image-size", "32", "--batch-size", "16", "--weights", "none",
                       "--workers", "0", "--no-progress", "--runs-dir", str(runs), "--name", "tiny"]) == 0
    return runs / "tiny"


def _val(meta_image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The tiny dataset's validation split, rebuilt here from the protocol (not through the exporter)."""
    splits = build_protocol(load_dataset("builtin:tiny@seed0"), parse_observed("single"), 0.2, 1200)
    tf = EvalTransform(meta_image_size, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    return np.stack([tf(p).numpy() for p in splits.val.paths]), np.asarray(splits.val.labels)


def _best_f1(scores: np.ndarray, labels: np.ndarray) -> float:
    """Brute force: the best F1 over every cut 'score >= s' of one class."""
    best = 0.0
    for s in np.unique(scores):
        pred = scores >= s
        tp = float((pred & (labels == 1)).sum())
        if tp:
            best = max(best, 2 * tp / (pred.sum() + labels.sum()))
    return best


def _copy_distilled_exports(monkeypatch: pytest.MonkeyPatch, fp32: Path, real: int) -> list[Path]:
    """Let export_run export its first ``real`` distilled networks and make the later ones copies of ``fp32``
    (each export costs the suite an exporter run; the distillation itself still runs). Returns the distilled
    checkpoints asked for, in order."""
    real_export = export_pipeline.export_onnx
    asked: list[Path] = []

    def export(checkpoint: Path, onnx_path: Path, **kwargs: Any) -> Any:
        if ".int8-qat-" not in str(checkpoint):
            return real_export(checkpoint, onnx_path, **kwargs)
        asked.append(checkpoint)
        if len(asked) <= real:
            return real_export(checkpoint, onnx_path, **kwargs)
        shutil.copy(fp32, onnx_path)
        return SimpleNamespace(onnx_path=onnx_path)

    monkeypatch.setattr(export_pipeline, "export_onnx", export)
    return asked


def test_every_artifact_gets_its_own_calibrated_thresholds(run: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "export" / "model.onnx"
    # the TensorRT flavour's distilled network (symmetric activations) is distilled for real, exported as a copy
    distilled = _copy_distilled_exports(monkeypatch, out, real=1)
    # INT8 rounding depends on the CPU's kernels: its mAP/agreement bounds are exercised in the next test and in
    # test_quantize.py, here only the pipeline is checked
    relaxed = {"int8": PrecisionBounds(max_prob_diff=None, min_agreement=0.0, max_map_drop=None)}
    said: list[str] = []
    monkeypatch.setattr(openvino_check, "PICK_MARGIN", 0.0)  # timing aside: OpenVINO is picked where it passes
    result = export_run(run, out, precisions=["fp32", "fp16", "int8"], trt=HAS_RTX, trt_targets=["sm86"],
                        trt_batch=(1, 4, 8), bounds=relaxed, progress=False, int8_calibration="percentile",
                        int8_qat="on", int8_qat_epochs=1, log=said.append)
    names = [a.name for a in result.artifacts]
    expected = ["fp32", "fp32 on openvino", "fp32 on openvino-bf16", "fp16", "int8-cpu", "int8-cpu on openvino"]
    expected += ["int8-tensorrt", "engine-fp32", "engine-fp16", "engine-int8"] if HAS_RTX else []
    assert names == expected
    _check_openvino_rows(result.artifacts, out.parent)
    folder = out.parent
    for name in ("summary.md", "summary.json", "calibration-fp32.md", "calibration-fp32.json", "calibration-fp32.png",
                 "calibration-fp16.md", "calibration-int8-cpu.md"):
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name

    x, labels = _val(32)
    summary = json.loads((folder / "summary.json").read_text())
    for art in result.artifacts:
        if art.path.suffix != ".onnx" or " on " in art.name:
            continue
        meta = read_onnx_meta(art.path)
        assert meta.precision == art.precision and meta.thresholds == art.thresholds
        assert meta.calibration["mode"] == "f1" and len(meta.thresholds) == len(meta.classes)
        assert summary["thresholds"][art.name] == meta.thresholds
        side = read_sidecar(art.path.with_suffix(".json"))
        assert side["sha256"] == file_sha256(art.path) and side["meta"]["thresholds"] == meta.thresholds
        # the stored thresholds are F1-optimal on this artifact's own val scores (classes with >= 5 positives)
        session = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"])
        probs = 1 / (1 + np.exp(-session.run(None, {"images": x})[0].astype(np.float64)))
        for c, rule in enumerate(meta.calibration["rules"]):
            if rule != "f1" or not THRESHOLD_MIN < meta.thresholds[c] < THRESHOLD_MAX:
                continue  # a clamped threshold is documented to change decisions within 1e-6 of 0 or 1
            pred = probs[:, c] >= meta.thresholds[c]
            tp = float((pred & (labels[:, c] == 1)).sum())
            f1 = 2 * tp / (pred.sum() + labels[:, c].sum())
            assert f1 == pytest.approx(_best_f1(probs[:, c], labels[:, c]), abs=1e-12), (art.name, c)
    _check_model_card(folder, result.artifacts, x, labels)
    fp16 = next(a for a in result.artifacts if a.name == "fp16")
    assert fp16.max_prob_diff is not None and fp16.max_prob_diff <= 5e-3 and fp16.agreement >= 0.995
    _serves_the_boosted_model(run, folder)
    quantization = read_onnx_meta(folder / "model.int8-cpu.onnx").quantization
    assert quantization["calibration"]["method"] == "percentile"
    _check_distilled(quantization, out, run / "best.pt", said)
    int8_cpu = next(a for a in result.artifacts if a.name == "int8-cpu")
    assert "quantization-aware distillation (1 epochs)" in int8_cpu.note
    assert [c.parent.name for c in distilled] == ["asymmetric", "symmetric"][:1 + HAS_RTX]
    if HAS_RTX:
        assert read_onnx_meta(folder / "model.int8-tensorrt.onnx").quantization["qat"]["activations"] == "int8"
    if HAS_RTX:
        engine = next(a for a in result.artifacts if a.name == "engine-int8")
        doc = read_sidecar(engine.path.with_name(engine.path.name + ".json"))
        source = read_onnx_meta(folder / "model.int8-tensorrt.onnx")
        assert doc["meta"]["thresholds"] == source.thresholds and doc["profile"]["max"][0] == 8


def test_a_cpu_runtime_is_picked_only_when_it_passes_and_beats_onnxruntime_by_the_margin() -> None:
    from export.openvino_check import PICK_MARGIN, RuntimeCheck, pick

    ok, failed = SimpleNamespace(passed=True), SimpleNamespace(passed=False)
    checks = [RuntimeCheck("openvino", ok, 105.0), RuntimeCheck("openvino-bf16", failed)]  # type: ignore[arg-type]
    assert pick(100.0, checks) == {}  # 5% faster is within the timing noise
    checks[0].images_per_s = 100.0 * PICK_MARGIN
    assert pick(100.0, checks) == {"backend": "openvino", "cpu": cpu_name(),
                                   "images_per_s": {"onnxruntime": 100.0, "openvino": 110.0}}
    checks.append(RuntimeCheck("openvino-bf16", ok, 150.0))  # type: ignore[arg-type]
    assert pick(100.0, checks)["backend"] == "openvino-bf16" and pick(None, checks) == {}
    assert pick(100.0, [RuntimeCheck("openvino", failed, 500.0)]) == {}  # type: ignore[arg-type]


def _check_openvino_rows(artifacts: list[Any], folder: Path) -> None:
    """OpenVINO ran the FP32 file within the parity bound and the INT8 file through the INT8 gate; bfloat16 where
    the CPU has it; both files name OpenVINO as their CPU runtime (the pick's margin is off in this test), and the
    model card says so."""
    rows = {a.name: a for a in artifacts}
    fp32_ov, int8_ov, bf16 = rows["fp32 on openvino"], rows["int8-cpu on openvino"], rows["fp32 on openvino-bf16"]
    assert fp32_ov.max_prob_diff <= 1e-4 and fp32_ov.agreement == 1.0 and fp32_ov.images_per_s > 0
    assert int8_ov.agreement is not None and int8_ov.images_per_s > 0 and int8_ov.path == rows["int8-cpu"].path
    assert bf16.agreement is not None if cpu_has_bf16() else "no bfloat16 units" in bf16.note
    assert read_onnx_meta(folder / "model.fp16.onnx").runtime_pick == {}  # not inherited from the FP32 file
    card = (folder / "README.md").read_text()
    for name in ("model.onnx", "model.int8-cpu.onnx"):
        pick = read_onnx_meta(folder / name).runtime_pick
        assert pick["backend"] in ("openvino", "openvino-bf16") and pick["cpu"] == cpu_name()
        assert f"`{name}`: `python -m serve` runs it with {pick['backend']} by default" in card
        assert read_sidecar(folder / name.replace(".onnx", ".json"))["sha256"] == file_sha256(folder / name)


def _serves_the_boosted_model(run: Path, folder: Path) -> None:
    """Every artifact records BoostLU; INT8 keeps the head's 1x1 convolution (the class activation maps) in
    float; the tagger's two runtimes and the demo serve the boosted network."""
    assert load_checkpoint(run / "best.pt").meta.head == {"kind": "linear", "boostlu": 5.0}
    for path in folder.glob("*.onnx"):
        assert read_onnx_meta(path).head == {"kind": "linear", "boostlu": 5.0}, path.name
    int8 = onnx.load(str(folder / "model.int8-cpu.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in int8.graph.initializer}
    (head,) = [n for n in int8.graph.node if n.op_type == "Conv" and "head.bias" in n.input]
    assert weights[head.input[1]].dtype == np.float32
    assert head.name in read_onnx_meta(folder / "model.int8-cpu.onnx").quantization["nodes_kept_float"]
    paths = build_protocol(load_dataset("builtin:tiny@seed0"), parse_observed("single"), 0.2, 1200).val.paths[:8]
    expected = 1 / (1 + np.exp(-reference_logits(run / "best.pt", list(paths))))  # the boosted PyTorch network
    for model in (folder / "model.onnx", run / "best.pt"):
        predictor = Predictor.load(model)  # the ONNX file: with OpenVINO, the export's pick
        picked = "torch" if model.suffix == ".pt" else read_onnx_meta(model).runtime_pick["backend"]
        assert predictor.backend == picked
        np.testing.assert_allclose(predictor.scores(list(paths)), expected, atol=1e-5)
        assert predictor.describe()["boostlu"] == 5.0 and "BoostLU 5" in model_markdown("run", predictor)


def _check_model_card(folder: Path, artifacts: list[Any], x: np.ndarray, labels: np.ndarray) -> None:
    """README.md names every file, the tag command and the thresholds; tags.csv holds the FP32 thresholds and the
    per-class val AP measured here on the FP32 model's own scores."""
    meta = read_onnx_meta(folder / "model.onnx")
    card = (folder / "README.md").read_text()
    for art in artifacts:
        assert f"`{art.path.name}`" in card
    assert f"python -m serve tag path/to/images --model {folder / 'model.onnx'}" in card
    assert "by `f1` on" in card and "measured against the full val labels" in card
    rows = list(csv.DictReader((folder / "tags.csv").open()))
    assert [r["name"] for r in rows] == meta.classes
    assert [float(r["threshold"]) for r in rows] == pytest.approx(meta.thresholds, rel=1e-5)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    ap = per_class_ap(session.run(None, {"images": x})[0], labels)
    for row, value in zip(rows, ap, strict=True):
        assert row["val_ap"] == ("" if np.isnan(value) else f"{100 * value:.2f}")


def test_precision_lists_and_cli_usage_errors(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from export.__main__ import main

    assert parse_precisions("int8, fp16") == ["fp32", "fp16", "int8"]
    with pytest.raises(ValueError, match="fp64"):
        parse_precisions("fp64")
    for args, message in ((["--precision", "fp64"], "fp64"), (["--calibrate", "best"], "calibration mode"),
                          (["--trt-batch", "1,2"], "--trt-batch"), (["--calibration-images", "0"], ">= 1"),
                          (["--min-agreement", "1.5"], "--min-agreement is a fraction"),
                          (["--max-map-drop", "-1"], "--max-map-drop is mAP points"),
                          (["--int8-qat-epochs", "0"], "--int8-qat-epochs must be >= 1")):
        assert main([str(run), *args]) == 2
        assert message in capsys.readouterr().err


def _check_distilled(quantization: dict[str, Any], fp32: Path, checkpoint: Path, said: list[str]) -> None:
    """The INT8 model was quantized from the quantization-aware distillation of ``checkpoint`` (one epoch), whose
    temporary files (beside the FP32 export) are gone."""
    qat = quantization["qat"]
    train_images = len(build_protocol(load_dataset("builtin:tiny@seed0"), parse_observed("single"), 0.2,
                                      1200).train.paths)
    assert qat["epochs"] == 1 and qat["images"] == min(1024, train_images)
    assert qat["checkpoint_sha256"] == file_sha256(checkpoint) and qat["activations"] == "uint8"
    assert qat["weights_quantized"] > 10 and qat["activation_points"] > 10
    assert np.isfinite([qat["loss_first_epoch"], qat["loss_last_epoch"]]).all()
    assert any("distillation epoch 1/1" in line for line in said)
    assert not list(fp32.parent.glob(".int8-qat-*"))  # the distilled checkpoint and ONNX file are gone


def test_a_broken_int8_bound_distils_then_fails_and_leaves_no_model(run: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "auto" / "model.onnx"
    never = {"int8": PrecisionBounds(max_prob_diff=None, min_agreement=1.01)}  # no model can pass
    said: list[str] = []
    # the distilled network's export is a copy of the FP32 file (the full export test above makes a real one)
    distilled_exports = _copy_distilled_exports(monkeypatch, out, real=0)
    with pytest.raises(PrecisionError, match="int8"):
        export_run(run, out, precisions=["fp32", "int8"], bounds=never, int8_qat_epochs=1, progress=False,
                   calibrate_mode="none", log=said.append)
    first_miss = next(i for i, line in enumerate(said) if "post-training INT8 misses its bounds" in line)
    assert "identical decisions" in said[first_miss] and "--int8-qat auto" in said[first_miss]
    assert any("distillation epoch 1/1" in line for line in said[first_miss:])
    assert len(distilled_exports) == 1 and distilled_exports[0].parent.name == "asymmetric"
    assert out.is_file()  # the FP32 model was verified before the conversion
    assert not out.with_name("model.int8-cpu.onnx").exists() and not list(out.parent.glob(".int8-qat-*"))
