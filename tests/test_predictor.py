"""Predictor: the same scores as the tagger and the evaluation path, batch independence, input kinds, errors."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageOps
from reference import reference_logits

from export import export_onnx
from models import ModelMeta, build_model, save_checkpoint
from models.checkpoint import IMAGENET_MEAN, IMAGENET_STD
from models.data.dataset import ImageLabelDataset
from models.data.types import LabelledImages
from models.preprocess import DECODE_MARGIN, EvalTransform, read_image, resize_uint8
from models.runtimes import (
    BackendUnavailableError,
    ModelLoadError,
    ModelSpecError,
    OnnxRuntimeBackend,
    TorchBackend,
    supported_suffixes,
)
from serve.images import ImageError, load_rgb
from serve.model_files import resolve_model_path
from serve.predictor import Prediction, Predictor
from serve.tagging import tag_folder

CLASSES = ["cat", "dog", "car", "tree", "boat"]
THRESHOLDS = [0.3, 0.45, 0.5, 0.55, 0.7]
SIZE = 64


def make_checkpoint(path: Path, thresholds: list[float] | None = THRESHOLDS, seed: int = 3) -> Path:
    """A random-init resnet18 checkpoint at 64 px with (optionally) calibrated per-class thresholds."""
    torch.manual_seed(seed)
    net = build_model("resnet18", len(CLASSES))
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=SIZE, thresholds=thresholds)
    save_checkpoint(path, net.state_dict(), meta)
    return path


def scene(width: int, height: int, seed: int) -> Image.Image:
    """An RGB picture with structure (gradient, shapes), so that rotating it changes a model's output."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(1, width - 1), yy * 255 // max(1, height - 1), (xx + yy) % 256], -1)
    img = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        box = (x0, y0, x0 + int(rng.integers(8, width // 2)), y0 + int(rng.integers(8, height // 2)))
        draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return img


def make_pictures(folder: Path) -> dict[str, Path]:
    """JPEG, EXIF-rotated JPEG, RGBA PNG, palette PNG with transparency, greyscale PNG; name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    out["photo"] = folder / "photo.jpg"
    scene(70, 50, 0).save(out["photo"], quality=92)
    out["rotated"] = folder / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    scene(90, 40, 1).save(out["rotated"], quality=92, exif=exif.tobytes())
    rgba = scene(60, 60, 2).convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, 60, dtype=np.uint8), (60, 1))
    alpha[:, :10] = 0
    rgba.putalpha(Image.fromarray(alpha))
    out["rgba"] = folder / "rgba.png"
    rgba.save(out["rgba"])
    pal = scene(48, 64, 3).quantize(colors=16)
    out["palette"] = folder / "palette.png"
    pal.save(out["palette"], transparency=0)
    out["grey"] = folder / "sub" / "grey.png"
    out["grey"].parent.mkdir()
    scene(33, 77, 4).convert("L").save(out["grey"])
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkpoint, its ONNX export and the test pictures (keys: ckpt, onnx, root, pics, and picture names)."""
    root = tmp_path_factory.mktemp("predictor")
    ckpt = make_checkpoint(root / "run" / "best.pt")
    pics = make_pictures(root / "pics")
    onnx_path = export_onnx(ckpt, images=root / "pics", verify_images=3).onnx_path
    return {"ckpt": ckpt, "onnx": onnx_path, "root": root, "pics": root / "pics", **pics}


@pytest.fixture(scope="module")
def torch_predictor(files: dict[str, Path]) -> Predictor:
    return Predictor.load(files["ckpt"], device="cpu")


@pytest.fixture(scope="module")
def onnx_predictor(files: dict[str, Path]) -> Predictor:
    return Predictor.load(files["onnx"])


PICTURES = ["grey", "palette", "photo", "rgba", "rotated"]


def read_jsonl(path: Path) -> dict[str, dict]:
    return {rec["path"]: rec for rec in map(json.loads, path.read_text().splitlines())}


def test_same_scores_as_tagger_and_evaluation(
    files: dict[str, Path], torch_predictor: Predictor, onnx_predictor: Predictor, tmp_path: Path
) -> None:
    paths = [files[name] for name in PICTURES]
    rels = [p.relative_to(files["pics"]).as_posix() for p in paths]
    evaluation = 1.0 / (1.0 + np.exp(-reference_logits(files["ckpt"], paths).astype(np.float64)))
    for predictor, runtime in (
        (torch_predictor, TorchBackend.load(files["ckpt"], device="cpu")),
        (onnx_predictor, OnnxRuntimeBackend.load(files["onnx"])),
    ):
        ours = predictor.scores(paths)
        assert ours.dtype == np.float32 and ours.shape == (len(paths), len(CLASSES))
        out = tmp_path / f"{predictor.backend}.jsonl"
        summary = tag_folder(files["pics"], runtime, out, progress=False, batch_size=2)
        assert summary.tagged == len(paths) and not summary.failed
        lines = read_jsonl(out)
        for rel, row, path in zip(rels, ours, paths, strict=True):
            tagged = np.array([lines[rel]["scores"][c] for c in CLASSES])
            assert np.abs(tagged - row).max() <= 1e-6  # the JSONL is rounded to 6 decimals
            assert predictor.predict(path).tags == lines[rel]["tags"]  # same thresholds, same rule
        tolerance = 1e-6 if predictor.backend == "torch" else 1e-4  # ONNX Runtime vs PyTorch kernels
        assert np.abs(ours - evaluation).max() <= tolerance
    assert torch_predictor.describe()["calibrated_thresholds"] is True


def test_scores_do_not_depend_on_the_batch(
    files: dict[str, Path], torch_predictor: Predictor, onnx_predictor: Predictor
) -> None:
    target = files["rgba"]
    others = [files["photo"], files["rotated"], files["grey"], files["palette"]]
    for predictor in (torch_predictor, onnx_predictor):
        alone = predictor.scores([target])[0]
        mixed = predictor.scores([others[0], target, *others[1:]])[1]
        chunked = predictor.scores([*others, target], batch_size=3)[-1]
        assert np.abs(alone - mixed).max() <= 1e-6
        assert np.abs(alone - chunked).max() <= 1e-6
        assert np.abs(predictor.scores(target)[0] - alone).max() == 0  # one image counts as a list of one


def test_pil_array_and_bytes_inputs_match_the_file(files: dict[str, Path], torch_predictor: Predictor) -> None:
    for name in PICTURES:
        path = files[name]
        with Image.open(path) as img:
            img.load()
            from_pil = torch_predictor.scores([img])[0]
            mode = img.mode
        from_path = torch_predictor.scores([path])[0]
        from_bytes = torch_predictor.scores([path.read_bytes()])[0]
        assert np.abs(from_pil - from_path).max() <= 1e-6, (name, mode)
        assert np.abs(from_bytes - from_path).max() <= 1e-6, name
    # EXIF rotation is applied: the file equals its transposed pixels, and differs from the raw pixels
    with Image.open(files["rotated"]) as img:
        raw = np.asarray(img.convert("RGB"))
        upright = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
    assert raw.shape[:2] == (40, 90) and upright.shape[:2] == (90, 40)
    rotated = torch_predictor.scores([files["rotated"]])[0]
    assert np.abs(torch_predictor.scores([upright])[0] - rotated).max() <= 1e-6
    assert np.abs(torch_predictor.scores([raw])[0] - rotated).max() > 1e-4
    # RGBA (file, PIL, uint8 array) is composited onto white: fully transparent pixels become white
    with Image.open(files["rgba"]) as img:
        rgba = np.asarray(img.convert("RGBA"))
    assert np.abs(torch_predictor.scores([rgba])[0] - torch_predictor.scores([files["rgba"]])[0]).max() <= 1e-6
    assert (load_rgb(rgba)[:, :, :10] == 255).all()
    with Image.open(files["palette"]) as img:
        assert img.mode == "P" and "transparency" in img.info
        as_rgba = np.asarray(img.convert("RGBA"))
    assert np.abs(torch_predictor.scores([as_rgba])[0] - torch_predictor.scores([files["palette"]])[0]).max() <= 1e-6
    # a uint8 (3, H, W) tensor as read_image returns it
    tensor = torch.from_numpy(upright.copy()).permute(2, 0, 1)
    assert np.abs(torch_predictor.scores([tensor])[0] - rotated).max() <= 1e-6


def test_thresholds_calibrated_global_and_per_class(files: dict[str, Path], torch_predictor: Predictor) -> None:
    p = torch_predictor
    assert p.thresholds().tolist() == THRESHOLDS
    assert p.thresholds(0.2).tolist() == [0.2] * len(CLASSES)
    assert p.thresholds(per_class={"dog": 0.9}).tolist() == [0.3, 0.9, 0.5, 0.55, 0.7]
    assert p.thresholds(0.2, {"boat": 0.1}).tolist() == [0.2, 0.2, 0.2, 0.2, 0.1]
    with pytest.raises(ValueError, match="unknown class"):
        p.thresholds(per_class={"zebra": 0.5})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        p.thresholds(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        p.thresholds(per_class={"cat": -0.1})
    for name in PICTURES:
        scores = p.scores([files[name]])[0]
        for kwargs in ({}, {"threshold": float(np.median(scores))}, {"per_class": {"cat": 0.0, "dog": 1.0}}):
            result = p.predict(files[name], **kwargs)
            assert isinstance(result, Prediction) and list(result.scores) == CLASSES
            assert [result.scores[c] for c in CLASSES] == [float(s) for s in scores]
            want = {c for c in CLASSES if round(result.scores[c], 6) >= result.thresholds[c]}
            assert set(result.tags) == want
            assert [result.scores[c] for c in result.tags] == sorted((result.scores[c] for c in want), reverse=True)
            if "per_class" in kwargs:
                assert "cat" in result.tags and "dog" not in result.tags
        # re-filtering a result needs no model
        probs = np.array([result.scores[c] for c in CLASSES])
        relaxed = Prediction.from_probabilities(CLASSES, probs, np.zeros(len(CLASSES)))
        assert relaxed.scores == result.scores and set(relaxed.tags) == set(CLASSES)
        assert result.to_dict() == {"scores": result.scores, "thresholds": result.thresholds, "tags": result.tags}
    plain = Predictor.load(make_checkpoint(files["root"] / "plain" / "best.pt", thresholds=None), device="cpu")
    assert plain.thresholds().tolist() == [0.5] * len(CLASSES)


def test_model_paths_run_folders_and_names(files: dict[str, Path], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = runs / "exp1"
    (run / "export").mkdir(parents=True)
    shutil.copy(files["ckpt"], run / "best.pt")
    shutil.copy(files["onnx"], run / "export" / "model.onnx")
    assert resolve_model_path(run) == run / "best.pt"
    assert resolve_model_path("exp1", runs_dir=runs) == run / "best.pt"
    assert resolve_model_path(None, runs_dir=runs) == run / "best.pt"
    assert resolve_model_path(run, backend="onnxruntime") == run / "export" / "model.onnx"
    predictor = Predictor.load("exp1", backend="onnxruntime", runs_dir=runs)
    assert predictor.path == run / "export" / "model.onnx" and predictor.backend == "onnxruntime"
    assert "CPUExecutionProvider" in predictor.device_description
    with pytest.raises(ModelSpecError, match="no trained run"):
        resolve_model_path(None, runs_dir=tmp_path / "empty")
    with pytest.raises(ModelSpecError, match="model not found: nope"):
        Predictor.load("nope", runs_dir=runs)


def test_load_errors_are_readable(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
        text = str(exc.value)
        assert "\n" not in text and "Traceback" not in text
        return text

    with pytest.raises(ModelSpecError) as exc:
        Predictor.load(tmp_path / "missing.onnx")
    assert "model not found" in one_line(exc)
    (tmp_path / "model.txt").write_text("not a model")
    with pytest.raises(ModelSpecError) as exc:
        Predictor.load(tmp_path / "model.txt")
    assert "unsupported model file" in one_line(exc) and ".onnx" in str(exc.value)
    (tmp_path / "model.engine").write_bytes(b"\0" * 64)
    if ".engine" in supported_suffixes():  # a TensorRT runtime is registered: it must fail on garbage, readably
        with pytest.raises(ModelLoadError) as exc:
            Predictor.load(tmp_path / "model.engine")
    else:
        with pytest.raises(ModelSpecError) as exc:
            Predictor.load(tmp_path / "model.engine")
        assert "TensorRT" in str(exc.value)
    one_line(exc)
    with pytest.raises(ModelSpecError, match="unknown backend 'tflite'"):
        Predictor.load(files["onnx"], backend="tflite")
    with pytest.raises(ModelSpecError, match=r"backend torch cannot load model\.onnx"):
        Predictor.load(files["onnx"], backend="torch")
    with pytest.raises(ModelSpecError, match="unknown device 'gpu0'"):
        Predictor.load(files["onnx"], device="gpu0")
    (tmp_path / "broken.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(ModelLoadError, match=r"cannot load .*broken\.pt"):
        Predictor.load(tmp_path / "broken.pt")
    if not torch.cuda.is_available():  # no GPU: asking for one is an error, not a silent CPU fallback
        with pytest.raises(BackendUnavailableError, match="CUDAExecutionProvider"):
            Predictor.load(files["onnx"], device="cuda")
        with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
            Predictor.load(files["ckpt"], device="cuda")
    # the runtime package itself is missing
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(BackendUnavailableError) as exc:
        Predictor.load(files["onnx"])
    assert "pip install onnxruntime" in one_line(exc) and exc.value.__cause__ is None


def test_image_errors_are_readable(files: dict[str, Path], tmp_path: Path) -> None:
    predictor = Predictor.load(files["ckpt"], device="cpu", max_pixels=300 * 300)
    fake = tmp_path / "fake.png"
    fake.write_text("this is text, not a picture\n")
    data = files["rgba"].read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    big = tmp_path / "big.png"
    Image.new("1", (400, 400)).save(big)  # tiny file, 160,000 pixels
    cases = {
        fake: "not an image",
        cut: "truncated",
        big: "too large: 400x400",
        tmp_path / "none.jpg": "file not found",
        tmp_path: "is a folder",
    }
    for source, reason in cases.items():
        with pytest.raises(ImageError, match=reason) as exc:
            predictor.scores([files["photo"], source])
        assert exc.value.source == str(source) and exc.value.__cause__ is None
    with pytest.raises(ImageError, match="too large"):
        predictor.scores([Image.new("RGB", (301, 300))])
    with pytest.raises(ImageError, match="not an image"):
        predictor.scores([b"GIF89a broken"])
    with pytest.raises(ImageError, match="truncated"):
        predictor.scores([io.BytesIO(data[:200]).getvalue()])
    with pytest.raises(TypeError, match="uint8"):
        predictor.scores([np.zeros((8, 8, 3), np.float32)])
    with pytest.raises(TypeError, match="unsupported image input"):
        predictor.scores([12345])  # type: ignore[list-item]


def test_large_jpegs_decode_at_reduced_scale_everywhere(
    files: dict[str, Path], torch_predictor: Predictor, tmp_path: Path
) -> None:
    """A JPEG much larger than the network input is decoded at reduced scale (1/4 here), the same way by
    evaluation, the dataset, the predictor and the tagger, and its resized pixels stay within a few grey levels
    of a full-size decode; PNGs and images too small to reduce decode at full size."""
    folder = tmp_path / "large"
    folder.mkdir()
    big, png = folder / "big.jpg", folder / "big.png"
    scene(600, 520, 7).save(big, quality=92)
    scene(600, 520, 7).save(png)
    side = EvalTransform(SIZE, IMAGENET_MEAN, IMAGENET_STD).decode_side
    assert side == DECODE_MARGIN * SIZE == 128
    assert read_image(big).shape == (3, 520, 600)
    assert read_image(big, side).shape == (3, 130, 150)  # 1/4 scale: the largest keeping both sides >= 128
    assert read_image(png, side).shape == (3, 520, 600)
    assert read_image(files["photo"], side).shape == (3, 50, 70)  # too small to reduce
    # the approximation: the network-size pixels of the reduced decode against a full decode
    reduced = resize_uint8(read_image(big, side), SIZE).int()
    full = resize_uint8(read_image(big), SIZE).int()
    assert (reduced - full).abs().max() <= 8 and (reduced - full).abs().float().mean() <= 1.0
    # ... and the same reduced decode in evaluation, the training dataset, the predictor and the tagger
    evaluation = 1.0 / (1.0 + np.exp(-reference_logits(files["ckpt"], [big]).astype(np.float64)))[0]
    dataset = ImageLabelDataset(
        LabelledImages(paths=[big], labels=np.zeros((1, len(CLASSES)), np.uint8), classes=CLASSES),
        EvalTransform(SIZE, IMAGENET_MEAN, IMAGENET_STD),
    )
    assert torch.equal(dataset[0]["images"], torch.from_numpy(torch_predictor.preprocess(big)))
    ours = torch_predictor.scores([big])[0]
    assert np.abs(ours - evaluation).max() <= 1e-6
    assert np.abs(torch_predictor.scores([big.read_bytes()])[0] - ours).max() <= 1e-6
    out = tmp_path / "tags.jsonl"
    tag_folder(folder, TorchBackend.load(files["ckpt"], device="cpu"), out, progress=False)
    tagged = read_jsonl(out)["big.jpg"]["scores"]
    assert np.abs(np.array([tagged[c] for c in CLASSES]) - ours).max() <= 1e-6


def test_openvino_runs_the_same_onnx_file_within_the_fp32_parity_bound(
    files: dict[str, Path], onnx_predictor: Predictor
) -> None:
    """``--backend openvino`` loads the exported .onnx file (compiled for the CPU in float32): logits within 1e-4 of
    ONNX Runtime's, the same tags, scores independent of the batch; a GPU device is refused with what to use."""
    pytest.importorskip("openvino")
    from models.runtimes import BackendUnavailableError, OpenVinoBackend

    paths = [files[name] for name in PICTURES]
    predictor = Predictor.load(files["onnx"], backend="openvino")
    assert predictor.backend == "openvino"
    ours, reference = predictor.scores(paths, batch_size=2), onnx_predictor.scores(paths)
    assert ours.shape == reference.shape and np.abs(ours - reference).max() <= 1e-4
    runtime = OpenVinoBackend.load(files["onnx"], threads=1)
    batch = np.stack([predictor.preprocess(path) for path in paths])
    logits = runtime.predict_logits(batch)
    assert np.abs(logits - OnnxRuntimeBackend.load(files["onnx"]).predict_logits(batch)).max() <= 1e-4
    assert np.abs(runtime.predict_logits(batch[1:2]) - logits[1:2]).max() <= 1e-5
    assert [predictor.predict(p).tags for p in paths] == [onnx_predictor.predict(p).tags for p in paths]
    with pytest.raises(BackendUnavailableError, match="CPU only"):
        OpenVinoBackend.open(files["onnx"], device="cuda")
    from models.runtimes import RUNTIMES
    from serve import BACKEND_NAMES

    assert sorted(BACKEND_NAMES.replace(" or ", ", ").split(", ")) == sorted(RUNTIMES)  # the --backend help
    from models.runtimes import OpenVinoBf16Backend
    from models.runtimes.openvino_backend import cpu_has_bf16

    if not cpu_has_bf16():
        with pytest.raises(BackendUnavailableError, match="no bfloat16 units"):
            OpenVinoBf16Backend.open(files["onnx"])


def test_the_exports_runtime_pick_is_the_default_on_the_same_cpu_model_only(files: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    """A file whose metadata names OpenVINO as faster on this CPU model is served with it by default (the
    description says why and how to override); on another CPU model, or with --backend, ONNX Runtime."""
    pytest.importorskip("openvino")
    from export.pipeline import write_meta
    from models.runtimes.devices import cpu_name

    model = tmp_path / "model.onnx"
    shutil.copy(files["onnx"], model)
    pick = {"backend": "openvino", "cpu": cpu_name(), "images_per_s": {"onnxruntime": 90.0, "openvino": 120.0}}
    write_meta(model, {"runtime_pick": pick})
    predictor = Predictor.load(model)
    assert predictor.backend == "openvino"
    assert "the export measured it faster on this CPU (120 against onnxruntime's 90" in predictor.device_description
    assert Predictor.load(model, backend="onnxruntime").backend == "onnxruntime"
    write_meta(model, {"runtime_pick": {**pick, "cpu": "another CPU"}})
    assert Predictor.load(model).backend == "onnxruntime"
