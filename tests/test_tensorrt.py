"""TensorRT engines: real strongly typed builds (FP32, FP16, INT8 Q/DQ) with TensorRT for RTX on CPU, the
sidecar, readable errors, and - on a CUDA GPU with a TensorRT runtime - engine vs PyTorch logits.

The builder tests need the TensorRT-RTX wheels (``pip install tensorrt-rtx-cu13-libs
tensorrt-rtx-cu13-bindings``), which build engines without a GPU; the parity test needs a CUDA GPU and a
TensorRT flavour that runs on it. Each skips with the reason when that is absent.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from export.errors import ExportError
from export.onnx_export import export_to_file
from export.onnx_files import read_onnx_meta, set_onnx_meta
from export.tensorrt_build import (
    EngineBuildResult,
    TensorRTBuildError,
    build_engine,
    onnx_precision,
    parse_targets,
    quantization_problems,
)
from models import ModelMeta, build_model
from models.files.digest import file_sha256
from models.runtimes import runtime_for
from models.runtimes.tensorrt_backend import (
    ENGINE_SIDECAR_FORMAT,
    FLAVOUR_RTX,
    FLAVOUR_TENSORRT,
    TensorRTBackend,
    TensorRTRuntimeError,
    batch_chunks,
    cuda_target,
    engine_sidecar_path,
    import_tensorrt,
    supported_targets,
    tensorrt_importable,
)

CLASSES = ["cat", "dog", "car", "tree", "boat"]
SIZE = 64
THRESHOLDS = [0.3, 0.4, 0.5, 0.6, 0.7]
RTX_TARGETS = ["sm86", "sm89"]
PROFILE = {"min_batch": 1, "opt_batch": 4, "max_batch": 8}
HAVE_RTX = tensorrt_importable(FLAVOUR_RTX)
needs_rtx = pytest.mark.skipif(
    not HAVE_RTX,
    reason="TensorRT for RTX is not installed (pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings)",
)


class _Calibration:
    """onnxruntime CalibrationDataReader over a few fixed random batches."""

    def __init__(self, batches: int = 4) -> None:
        rng = np.random.default_rng(0)
        data = [rng.standard_normal((2, 3, SIZE, SIZE)).astype(np.float32) for _ in range(batches)]
        self._it = iter([{"images": x} for x in data])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def make_fp16(src: Path, dst: Path) -> None:
    """FP16 weights and compute, float32 ``images`` / ``logits`` kept (metadata_props are kept by the converter)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))


def make_int8_qdq(src: Path, dst: Path, *, tensorrt_style: bool = True) -> None:
    """INT8 Q/DQ with onnxruntime ``quantize_static`` (random calibration data: this tests the build, not accuracy).

    ``tensorrt_style``: symmetric int8 activations and weights, float bias (what TensorRT accepts); otherwise the
    onnxruntime CPU style (uint8 asymmetric activations, int32 bias) that TensorRT refuses.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    options = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False} if tensorrt_style else {}
    with contextlib.redirect_stdout(io.StringIO()):
        logging.getLogger().setLevel(logging.ERROR)  # the quantizer suggests pre-processing through the root logger
        quantize_static(
            str(src),
            str(dst),
            _Calibration(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8 if tensorrt_style else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options=options,
        )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The tiny ONNX models (random-init resnet18, 5 classes, 64 px) in FP32, FP16 and TensorRT-style INT8."""
    root = tmp_path_factory.mktemp("trt-onnx")
    torch.manual_seed(0)
    model = build_model("resnet18", len(CLASSES)).eval()
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=SIZE, method="an", thresholds=THRESHOLDS, epoch=3)
    export_to_file(model, meta, root / "fp32.onnx")
    make_fp16(root / "fp32.onnx", root / "fp16.onnx")
    make_int8_qdq(root / "fp32.onnx", root / "int8.onnx")
    return {"root": root, "model": model, "meta": meta}


@pytest.fixture(scope="module")
def engines(sources: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineBuildResult]:
    """One real TensorRT-RTX engine per precision, built on this machine for sm86 + sm89."""
    if not HAVE_RTX:
        pytest.skip("TensorRT for RTX is not installed (pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings)")
    root = sources["root"]
    assert isinstance(root, Path)
    out = tmp_path_factory.mktemp("trt-engines")
    built: dict[str, EngineBuildResult] = {}
    for precision in ("fp32", "fp16", "int8"):
        t0 = time.perf_counter()
        built[precision] = build_engine(
            root / f"{precision}.onnx",
            out / f"{precision}.engine",
            targets=RTX_TARGETS,
            flavour=FLAVOUR_RTX,
            **PROFILE,
        )
        print(f"{precision}: {built[precision].summary()} (call {time.perf_counter() - t0:.2f} s)")
    return built


# -------------------------------------------------------------------------------------------------------
# pure helpers (no TensorRT needed)


def test_parse_targets_normalises_and_rejects() -> None:
    assert parse_targets(None) == [] and parse_targets([]) == []
    assert parse_targets(["sm86", "SM_89", "12.0"]) == ["sm86", "sm89", "sm120"]
    assert parse_targets("sm75,sm80") == ["sm75", "sm80"]
    assert parse_targets(["Current"]) == ["current"]
    for bad, needle in [
        (["ampere"], "invalid TensorRT target 'ampere'"),
        (["sm8x"], "invalid TensorRT target 'sm8x'"),
        (["86.0.1"], "invalid TensorRT target"),
        (["sm86", "8.6"], "given twice"),
        (["current", "sm86"], "cannot be combined"),
    ]:
        with pytest.raises(TensorRTBuildError, match=needle) as info:
            parse_targets(bad)
        assert isinstance(info.value, ExportError) and "\n" not in str(info.value)


def test_batch_chunks_cover_every_row_within_the_profile() -> None:
    assert batch_chunks(10, 1, 4) == [(0, 4, 4), (4, 8, 4), (8, 10, 2)]
    assert batch_chunks(9, 3, 4) == [(0, 4, 4), (4, 8, 4), (8, 9, 3)]  # last chunk padded up to the minimum
    assert batch_chunks(4, 1, 4) == [(0, 4, 4)]
    assert batch_chunks(0, 1, 4) == []
    for n, lo, hi in [(1, 1, 1), (37, 2, 8), (64, 1, 64), (65, 1, 64)]:
        chunks = batch_chunks(n, lo, hi)
        assert [i for a, b, _ in chunks for i in range(a, b)] == list(range(n))
        assert all(lo <= run <= hi and run >= b - a for a, b, run in chunks)
    with pytest.raises(ValueError):
        batch_chunks(3, 5, 4)


def test_precision_detection_and_quantization_checks(sources: dict[str, object], tmp_path: Path) -> None:
    root = sources["root"]
    assert isinstance(root, Path)
    protos = {p: onnx.load(str(root / f"{p}.onnx")) for p in ("fp32", "fp16", "int8")}
    assert {p: onnx_precision(m) for p, m in protos.items()} == {"fp32": "fp32", "fp16": "fp16", "int8": "int8"}
    assert all(quantization_problems(m) == [] for m in protos.values())
    # onnxruntime's CPU-style INT8 (uint8 asymmetric activations, int32 bias): named problems, build refused
    make_int8_qdq(root / "fp32.onnx", tmp_path / "cpu_int8.onnx", tensorrt_style=False)
    problems = " | ".join(quantization_problems(onnx.load(str(tmp_path / "cpu_int8.onnx"))))
    assert "int32 bias" in problems and "QuantizeBias" in problems and "symmetric int8" in problems
    with pytest.raises(TensorRTBuildError, match="cannot build this quantized model") as info:
        build_engine(tmp_path / "cpu_int8.onnx", tmp_path / "cpu_int8.engine", targets=["sm89"])
    assert "symmetric int8" in str(info.value)
    assert not list(tmp_path.glob("*.engine*"))


# -------------------------------------------------------------------------------------------------------
# real engine builds with TensorRT for RTX (no GPU needed)


@needs_rtx
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_engine_and_sidecar(precision: str, engines: dict[str, EngineBuildResult], sources: dict[str, object]) -> None:
    result = engines[precision]
    root = sources["root"]
    assert isinstance(root, Path)
    onnx_path = root / f"{precision}.onnx"
    trt = import_tensorrt(FLAVOUR_RTX)

    engine = result.engine_path
    assert engine.is_file() and engine.stat().st_size == result.size_bytes > 1_000_000
    assert result.sidecar_path == engine_sidecar_path(engine) == engine.with_name(f"{precision}.engine.json")
    # the three engines and their sidecars, nothing else: no temp files left by the atomic writes
    names = {f"{p}.engine{s}" for p in ("fp32", "fp16", "int8") for s in ("", ".json")}
    assert {p.name for p in engine.parent.iterdir()} == names

    side = json.loads(result.sidecar_path.read_text())
    assert side["format"] == ENGINE_SIDECAR_FORMAT and side["engine_file"] == engine.name
    assert side["sha256"] == file_sha256(engine) == result.sha256 and side["size_bytes"] == result.size_bytes
    assert side["tensorrt"] == {"flavour": "tensorrt-rtx", "module": trt.__name__, "version": trt.__version__}
    assert side["targets"] == RTX_TARGETS == result.targets and side["gpu"] is None
    assert side["precision"] == precision == result.precision
    assert side["profile"] == {
        "input": "images",
        "min": [1, 3, SIZE, SIZE],
        "opt": [4, 3, SIZE, SIZE],
        "max": [8, 3, SIZE, SIZE],
    }
    assert side["input"] == {"name": "images", "dtype": "float32", "shape": ["batch", 3, SIZE, SIZE]}
    assert side["output"] == {"name": "logits", "dtype": "float32", "shape": ["batch", len(CLASSES)]}
    assert side["builder"]["strongly_typed"] is True
    assert side["source_onnx"]["file"] == onnx_path.name and side["source_onnx"]["sha256"] == file_sha256(onnx_path)
    meta = ModelMeta.from_json(json.dumps(side["meta"]))
    assert meta == read_onnx_meta(onnx_path) == result.meta
    assert meta.classes == CLASSES and meta.thresholds == THRESHOLDS and meta.image_size == SIZE
    assert "tensorrt-rtx" in result.summary() and "sm86, sm89" in result.summary()


@needs_rtx
def test_reduced_precision_engines_are_smaller(engines: dict[str, EngineBuildResult]) -> None:
    """FP16 and INT8 weights really are stored as such: the engines shrink roughly 2x and 3-4x vs FP32."""
    fp32, fp16, int8 = (engines[p].size_bytes for p in ("fp32", "fp16", "int8"))
    assert fp16 < 0.6 * fp32 and int8 < 0.4 * fp32 and int8 < fp16


@needs_rtx
def test_default_and_current_targets(sources: dict[str, object], tmp_path: Path) -> None:
    root = sources["root"]
    assert isinstance(root, Path)
    result = build_engine(root / "fp16.onnx", tmp_path / "m.plan", flavour="auto", **PROFILE)
    assert result.flavour == FLAVOUR_RTX or cuda_target() is not None
    if result.flavour == FLAVOUR_RTX:
        assert result.targets == ["default"]  # TensorRT-RTX's portable target set
        assert json.loads(engine_sidecar_path(tmp_path / "m.plan").read_text())["targets"] == ["default"]
    if cuda_target() is None:
        with pytest.raises(TensorRTBuildError, match="'current' needs a CUDA GPU"):
            build_engine(root / "fp16.onnx", tmp_path / "c.engine", targets=["current"], flavour=FLAVOUR_RTX)


@needs_rtx
def test_unsupported_targets_are_named(sources: dict[str, object], tmp_path: Path) -> None:
    root = sources["root"]
    assert isinstance(root, Path)
    available = supported_targets(import_tensorrt(FLAVOUR_RTX))
    assert {"sm86", "sm89"} <= set(available)
    with pytest.raises(TensorRTBuildError, match="cannot build for sm90") as info:
        build_engine(root / "fp32.onnx", tmp_path / "h100.engine", targets=["sm90"], flavour=FLAVOUR_RTX)
    assert "full TensorRT" in str(info.value) and "sm86" in str(info.value)
    with pytest.raises(TensorRTBuildError, match="invalid TensorRT target 'rtx4090'"):
        build_engine(root / "fp32.onnx", tmp_path / "x.engine", targets=["rtx4090"])
    assert not list(tmp_path.iterdir())


@needs_rtx
def test_bad_inputs_give_readable_errors(sources: dict[str, object], tmp_path: Path) -> None:
    root = sources["root"]
    meta = sources["meta"]
    assert isinstance(root, Path) and isinstance(meta, ModelMeta)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"definitely not a protobuf \x00\xff" * 10)
    no_meta = tmp_path / "no_meta.onnx"
    proto = onnx.load(str(root / "fp32.onnx"))
    del proto.metadata_props[:]
    onnx.save(proto, str(no_meta))
    wrong_size = tmp_path / "wrong_size.onnx"  # metadata says 32 px, the graph is 64 px
    proto = onnx.load(str(root / "fp32.onnx"))
    set_onnx_meta(proto, replace(meta, image_size=32))
    onnx.save(proto, str(wrong_size))

    cases = [
        (tmp_path / "missing.onnx", {}, "ONNX model not found"),
        (garbage, {}, "not a readable ONNX model"),
        (no_meta, {}, "no 'spml_meta' metadata"),
        (wrong_size, {}, "unexpected graph interface"),
        (root / "fp32.onnx", {"min_batch": 4, "opt_batch": 2}, "invalid batch profile"),
        (root / "fp32.onnx", {"max_batch": 0}, "invalid batch profile"),
        (root / "fp32.onnx", {"flavour": "tensorrt-lean"}, "unknown TensorRT flavour"),
    ]
    for src, kwargs, needle in cases:
        with pytest.raises(TensorRTBuildError, match=needle) as info:
            build_engine(src, tmp_path / "out.engine", targets=["sm89"], **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)
    with pytest.raises(TensorRTBuildError, match=r"must end in \.engine or \.plan"):
        build_engine(root / "fp32.onnx", tmp_path / "out.onnx")
    if cuda_target() is None:
        with pytest.raises(TensorRTBuildError, match="no CUDA GPU"):
            build_engine(root / "fp32.onnx", tmp_path / "out.engine", flavour=FLAVOUR_TENSORRT)
    assert not list(tmp_path.glob("out.*")) and not list(tmp_path.glob(".out*"))


def test_missing_tensorrt_names_the_install_command(
    sources: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = sources["root"]
    assert isinstance(root, Path)
    for module in ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail as if it were not installed
    assert not tensorrt_importable(FLAVOUR_RTX) and not tensorrt_importable(FLAVOUR_TENSORRT)
    with pytest.raises(TensorRTBuildError, match="pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings"):
        build_engine(root / "fp32.onnx", tmp_path / "m.engine", targets=["sm89"])
    with pytest.raises(ModuleNotFoundError, match="pip install tensorrt-rtx-cu13-libs"):
        import_tensorrt(FLAVOUR_RTX)
    assert not list(tmp_path.iterdir())


# -------------------------------------------------------------------------------------------------------
# the runner


def test_registry_routes_engines_to_tensorrt() -> None:
    assert runtime_for("runs/x/export/model.engine") is TensorRTBackend
    assert runtime_for("model.PLAN") is TensorRTBackend
    assert TensorRTBackend.name == "tensorrt"


def test_runner_sidecar_errors(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    with pytest.raises(FileNotFoundError, match="engine not found"):
        TensorRTBackend.load(engine)
    engine.write_bytes(b"\x00" * 64)
    with pytest.raises(FileNotFoundError, match=r"m\.engine\.json not found"):
        TensorRTBackend.load(engine)
    engine_sidecar_path(engine).write_text('{"format": "spml-onnx-export"}')
    with pytest.raises(ValueError, match="not an spml TensorRT engine sidecar"):
        TensorRTBackend.load(engine)
    engine_sidecar_path(engine).write_text("{ not json")
    with pytest.raises(ValueError, match="not a readable JSON sidecar"):
        TensorRTBackend.load(engine)
    with pytest.raises(ValueError, match="not 'cpu'"):
        TensorRTBackend.load(engine, device="cpu")


@needs_rtx
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; this machine has a CUDA GPU")
def test_runner_without_gpu_says_so(engines: dict[str, EngineBuildResult]) -> None:
    with pytest.raises(TensorRTRuntimeError, match="run only on an NVIDIA CUDA GPU") as info:
        TensorRTBackend.load(engines["fp16"].engine_path)
    assert isinstance(info.value, OSError)  # the CLI reports OSErrors as one line
    assert "tensorrt-rtx" in str(info.value) and "sm86, sm89" in str(info.value) and "\n" not in str(info.value)


# -------------------------------------------------------------------------------------------------------
# GPU: engine vs PyTorch


def _gpu_flavour() -> tuple[str, list[str] | None]:
    """(flavour, targets) that can build and run an engine on this machine's GPU, or pytest.skip with why."""
    here = cuda_target()
    if here is None:
        pytest.skip("no CUDA GPU: TensorRT engines only run on one")
    if tensorrt_importable(FLAVOUR_TENSORRT):
        return FLAVOUR_TENSORRT, None
    if HAVE_RTX:
        if here in supported_targets(import_tensorrt(FLAVOUR_RTX)):
            return FLAVOUR_RTX, ["current"]
        pytest.skip(f"this GPU is {here}: TensorRT-RTX has no {here} target and full TensorRT is not installed")
    pytest.skip("no TensorRT runtime installed (tensorrt or the TensorRT-RTX wheels)")


@pytest.fixture(scope="module")
def gpu_engines(sources: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    flavour, targets = _gpu_flavour()
    root = sources["root"]
    assert isinstance(root, Path)
    out = tmp_path_factory.mktemp("trt-gpu")
    paths = {}
    for precision in ("fp32", "fp16", "int8"):
        paths[precision] = build_engine(
            root / f"{precision}.onnx",
            out / f"{precision}.engine",
            flavour=flavour,
            targets=targets,
            tf32=False,  # compare true FP32 with PyTorch
            min_batch=1,
            opt_batch=4,
            max_batch=4,
        ).engine_path
    yield paths


@pytest.mark.parametrize(("precision", "rel_tol"), [("fp32", 1e-3), ("fp16", 3e-2)])
def test_engine_matches_pytorch_on_gpu(
    precision: str, rel_tol: float, gpu_engines: dict[str, Path], sources: dict[str, object]
) -> None:
    model = sources["model"]
    assert isinstance(model, torch.nn.Module)
    runtime = runtime_for(gpu_engines[precision]).load(gpu_engines[precision])
    assert isinstance(runtime, TensorRTBackend) and (runtime.min_batch, runtime.max_batch) == (1, 4)
    assert runtime.meta.classes == CLASSES and runtime.meta.thresholds == THRESHOLDS
    x = np.random.default_rng(1).standard_normal((10, 3, SIZE, SIZE)).astype(np.float32)
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    scale = max(1.0, float(np.abs(ref).max()))
    for n in (1, 3, 4, 10):  # 10 > the profile's max of 4: split into 4 + 4 + 2
        got = runtime.predict_logits(x[:n])
        assert got.dtype == np.float32 and got.shape == (n, len(CLASSES))
        assert float(np.abs(got - ref[:n]).max()) <= rel_tol * scale, (precision, n)
    assert runtime.predict_logits(x[:0]).shape == (0, len(CLASSES))
    with pytest.raises(ValueError, match="expected a batch of shape"):
        runtime.predict_logits(x[:, :, :32, :32])


def test_int8_engine_runs_on_gpu(gpu_engines: dict[str, Path], sources: dict[str, object]) -> None:
    """INT8 (random calibration) is not expected to match closely; it must run, batch, and track the FP32 logits."""
    model = sources["model"]
    assert isinstance(model, torch.nn.Module)
    runtime = TensorRTBackend.load(gpu_engines["int8"])
    x = np.random.default_rng(2).standard_normal((10, 3, SIZE, SIZE)).astype(np.float32)
    got = runtime.predict_logits(x)
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    assert got.shape == ref.shape and np.isfinite(got).all()
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.9


@needs_rtx
def test_timm_backbone_builds_an_engine(tmp_path: Path) -> None:
    """A timm backbone's export (EfficientNet with TensorFlow "same" padding: explicit Pad nodes, ReLU6 as Clip)
    parses and builds into a strongly typed TensorRT-RTX engine, its metadata (bicubic preprocessing) carried."""
    torch.manual_seed(0)
    model = build_model("test_efficientnet", len(CLASSES)).eval()
    meta = ModelMeta(classes=CLASSES, arch="test_efficientnet", image_size=SIZE, interpolation="bicubic",
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), thresholds=THRESHOLDS)
    export_to_file(model.fold_for_inference(), meta, tmp_path / "timm.onnx")
    result = build_engine(tmp_path / "timm.onnx", tmp_path / "timm.engine", targets=RTX_TARGETS,
                          flavour=FLAVOUR_RTX, **PROFILE)
    assert result.engine_path.is_file() and result.precision == "fp32"
    side = json.loads(result.sidecar_path.read_text())
    built = ModelMeta.from_json(json.dumps(side["meta"]))
    assert (built.arch, built.interpolation, built.mean) == ("test_efficientnet", "bicubic", (0.5, 0.5, 0.5))
