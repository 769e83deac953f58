"""The CLIP pseudo-label stage (train/pseudo_labels): equal to the references' pseudo-labelling on the same weights
and images (tests/data/vlp, made by tests/data/make_reference_fixtures.py from mvrl/VLPL and Fsoft-AIC/AEVLP), the
run's file (stored, reused, checked), the report, and the offline error before anything trains.

The CLIP is tests/tiny_clip.py's seeded one-layer model: no real weights are needed (or available offline)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_clip import save_tiny_clip

from train import pseudo_label_stage as stage
from train.config import TrainConfig
from train.methods import METHODS
from train.pseudo_labels import clip_scores
from train.pseudo_labels.clip_scores import (
    class_prompts,
    image_views,
    load_clip,
    parse_clip,
    prompt_name,
    score_images,
    text_features,
    view_cosines,
)
from train.pseudo_labels.crops import aggregate_views, grid_boxes
from train.pseudo_labels.spec import IMAGE_AND_GRID, WHOLE_IMAGE, PseudoLabelSpec
from train.pseudo_labels.store import FILE_NAME, read
from train.trainer import Trainer

DATA = Path(__file__).parent / "data" / "vlp"
CPU = torch.device("cpu")


def fixture_images(folder: Path) -> list[Path]:
    """The fabricated images of the fixtures as PNG files (lossless: the pixels the references read)."""
    paths = []
    with np.load(DATA / "images.npz") as data:
        for i in range(len(data.files)):
            paths.append(folder / f"image{i}.png")
            Image.fromarray(data[f"image{i}"]).save(paths[-1])
    return paths


def tiny(tmp_path: Path, image_size: int, patch: int, seed: int) -> clip_scores.ClipModel:
    """The seeded tiny CLIP, loaded as a run loads ``--clip MODEL:FILE``."""
    return load_clip(parse_clip(save_tiny_clip(tmp_path, image_size, patch, seed)), CPU)


def test_vlpl_scores_and_pseudo_labels_equal_the_reference(tmp_path: Path) -> None:
    ref = np.load(DATA / "vlpl.npz")
    paths = fixture_images(tmp_path)
    clip = tiny(tmp_path, 336, 48, int(ref["clip_seed"]))
    classes = [str(c) for c in ref["classes"]]
    prompts = class_prompts(classes, "{}")
    assert prompts == [str(p) for p in ref["prompts"]]
    text = text_features(clip, prompts, CPU)
    for s, (temperature, threshold) in enumerate(ref["settings"]):
        spec = PseudoLabelSpec(kind=WHOLE_IMAGE, clip="x", prompt="{}", temperature=float(temperature),
                               threshold=float(threshold), pre_resize=448)
        scores, readable = score_images(clip, text, spec, paths, range(len(paths)), CPU, 3, 0, False)
        assert readable.all()
        np.testing.assert_allclose(scores["global"], ref[f"s{s}_similarity"], rtol=1e-5, atol=1e-6)
        positives = stage.select_positives(spec, scores, readable, ref["observed"])
        np.testing.assert_array_equal(positives, ref[f"s{s}_logits_pl"] == 1)
    assert ref["s0_logits_pl"].sum() != ref["s1_logits_pl"].sum()  # the two settings select differently


@pytest.mark.parametrize("config", ["pascal", "varied"])
def test_aevlp_crops_scores_and_pseudo_labels_equal_the_reference(tmp_path: Path, config: str) -> None:
    ref = np.load(DATA / f"aevlp_{config}.npz")
    cfg = json.loads(str(ref["settings"]))
    paths = fixture_images(tmp_path)
    clip = tiny(tmp_path, 224, 32, int(ref["clip_seed"]))
    classes = [str(c) for c in ref["classes"]]
    text = text_features(clip, class_prompts(classes, "a photo of a {}."), CPU)
    spec = PseudoLabelSpec(kind=IMAGE_AND_GRID, clip="x", prompt="a photo of a {}.", temperature=cfg["temp"],
                           threshold=cfg["threshold"], grid_size=cfg["grid_size"], top_k=cfg["top_k"], eta=cfg["eta"],
                           negative_ratio=cfg["negative_ratio"])
    views = 1 + cfg["grid_size"] ** 2
    cosines = {}
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            cosines[i] = view_cosines(clip, image_views(spec, image.convert("RGB"), clip.size), text).numpy()
    scores, readable = score_images(clip, text, spec, paths, range(len(paths)), CPU, 2, 0, False)
    positives = stage.select_positives(spec, scores, readable, ref["observed"])
    for step, index in enumerate(ref["step_index"]):
        b = len(index)
        pl_logits = ref["step_pl_logits"][step]  # the batch's whole images, then crop 1 of each, crop 2, ...
        for j, i in enumerate(index):
            np.testing.assert_allclose(cosines[i], pl_logits[[j + v * b for v in range(views)]], rtol=1e-5,
                                       atol=1e-6)
            np.testing.assert_array_equal(ref["step_observed"][step][j], ref["observed"][i])
        np.testing.assert_array_equal(positives[index], ref["step_pseudo"][step] == 1)
    assert positives.any()
    if config == "varied":  # the "negative pseudo-labels" clear some pseudo-positives: they are 0, not -1
        unclear = stage.select_positives(dataclasses.replace(spec, negative_ratio=0.0), scores, readable,
                                         ref["observed"])
        assert unclear.sum() > positives.sum() and not (positives & ~unclear).any()


def test_aevlp_aggregates_and_grid_follow_the_reference_layout() -> None:
    assert grid_boxes(50, 37, 4) == [(x * 12, y * 9, x * 12 + 12, y * 9 + 9) for y in range(4) for x in range(4)]
    assert grid_boxes(3, 3, 4)[-1] == (2, 2, 3, 3)  # an image smaller than the grid: one-pixel tiles, not empty
    scores = torch.tensor([[[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]]])
    parts = aggregate_views(scores)
    torch.testing.assert_close(parts["crop_max"], torch.tensor([[0.9, 0.8]]))
    torch.testing.assert_close(parts["crop_min"], torch.tensor([[0.2, 0.1]]))


def test_prompt_names_follow_aevlps_class_name_files() -> None:
    """As in Fsoft-AIC/AEVLP data/classnames/cub_labels.txt (the CUB attribute names there, quirks included)."""
    assert prompt_name("has_bill_shape::curved_(up_or_down)") == "curved bill"
    assert prompt_name("has_wing_color::blue") == "blue wing"
    assert prompt_name("has_upper_tail_color::blue") == "blue upper"
    assert prompt_name("has_bill_length::about_the_same_as_head") == "about the same as head bill"
    assert prompt_name("has_size::very_large_(32_-_72_in)") == "very large size::very"
    assert prompt_name("potted_plant") == "potted plant" and prompt_name("tvmonitor") == "tvmonitor"
    assert class_prompts(["dog", "traffic light"], "a photo of a {}.") == ["a photo of a dog.",
                                                                          "a photo of a traffic light."]


def test_clip_names_parse_and_bad_ones_fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    assert str(parse_clip("ViT-B-16:openai")) == "ViT-B-16:openai"
    assert parse_clip("ViT-B-16").pretrained == "openai"  # a bare name takes OpenAI's weights where they exist
    assert parse_clip("hf-hub:org/repo").schema == "hf-hub"
    with pytest.raises(ValueError, match="neither a pretrained tag"):
        clip_scores.check_available(parse_clip("ViT-B-16:no-such-tag"), "aevlp")
    with pytest.raises(ValueError, match="no model"):
        clip_scores.check_available(parse_clip("No-Such-Model:openai"), "aevlp")


def _cfg(tmp_path: Path, data: Path, **kw: object) -> TrainConfig:
    base = {"data": f"csv:{data}", "arch": "resnet18", "weights": "none", "image_size": 32, "batch_size": 16,
            "epochs": 1, "workers": 0, "progress": False, "runs_dir": str(tmp_path), "lgconv": False,
            "method": "aevlp", "clip": save_tiny_clip(tmp_path / "clip", 32, 8, 0),
            "labels": "full", "observed": "single"}  # the squares are a benchmark: full labels, one observed
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_offline_without_cached_weights_stops_before_training(squares_csv: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Real weights, not in the cache, and the hub unreachable (or HF_HUB_OFFLINE): a clear error that says what
    to do, before the run folder, a model or anything else is made."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(clip_scores, "_cached", lambda choice, cfg: False)
    monkeypatch.setattr(clip_scores, "hub_reachable", lambda host, timeout=3.0: False)
    built: list[str] = []
    monkeypatch.setattr("train.prepared_run.build_run_model", lambda *a, **k: built.append("model"))
    for method in ("vlpl", "aevlp"):
        with pytest.raises(ValueError) as err:
            Trainer(_cfg(tmp_path, squares_csv, name=f"offline-{method}", method=method, clip=""))
        message = str(err.value)
        assert "cannot be reached" in message and "--pseudo-labels FILE" in message and "ViT-" in message
        assert not (tmp_path / f"offline-{method}").exists()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        Trainer(_cfg(tmp_path, squares_csv, name="offline-env", clip="ViT-B-16:openai"))
    assert built == []


def test_the_run_stores_reuses_and_checks_its_pseudo_labels(squares_csv: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A run writes RUN/pseudo_labels.npz and prints the pseudo-positives per image and (the csv data has full
    labels hidden behind single positives) their precision; another run reads it with --pseudo-labels (the
    file's CLIP is not needed then); a file for other images, settings or methods is refused, clearly."""
    first = Trainer(_cfg(tmp_path, squares_csv, name="first"))
    err = capsys.readouterr().err
    assert "pseudo-positives beyond the observed labels" in err and "per image" in err
    assert "precision" in err and "against the full training labels" in err
    stored = read(tmp_path / "first" / FILE_NAME)
    assert stored.settings["kind"] == IMAGE_AND_GRID and stored.settings["prompt"] == "a photo of a {}."
    assert stored.settings["grid_size"] == 4 and stored.settings["threshold"] == 0.5
    assert first.run.pseudo_labels is not None and first.run.pseudo_labels.file.extra["precision"] is not None
    assert len(stored.paths) == len(first.run.splits.train) == stored.positives.shape[0]
    np.testing.assert_array_equal(stored.positives, first.run.pseudo_labels.positives)
    np.testing.assert_array_equal(first.run.method.pseudo_positives.numpy(), first.run.pseudo_labels.positives)
    assert first.run.config_record()["resolved"]["pseudo_labels"]["kind"] == IMAGE_AND_GRID

    # another run reads the file: no CLIP at all (the default ViT-B-16 would fail the availability check offline)
    second = Trainer(_cfg(tmp_path, squares_csv, name="second", clip="",
                          pseudo_labels=str(tmp_path / "first" / FILE_NAME)))
    assert second.run.pseudo_labels is not None and "read from" in second.run.pseudo_labels.origin
    np.testing.assert_array_equal(second.run.pseudo_labels.positives, first.run.pseudo_labels.positives)
    assert (tmp_path / "second" / FILE_NAME).is_file()
    # the selection is applied again with the run's settings: a higher threshold keeps fewer
    third = Trainer(_cfg(tmp_path, squares_csv, name="third", clip="", hp={"threshold": "0.9"},
                         pseudo_labels=str(tmp_path / "first" / FILE_NAME)))
    assert third.run.pseudo_labels is not None
    assert third.run.pseudo_labels.positives.sum() < first.run.pseudo_labels.positives.sum()

    # another split of the training pool: the file does not cover the new training images
    with pytest.raises(ValueError, match="does not cover this run's training images"):
        Trainer(_cfg(tmp_path, squares_csv, name="other-split", protocol_seed=5,
                     pseudo_labels=str(tmp_path / "first" / FILE_NAME)))
    # other scoring settings, another method's kind of scores, another CLIP asked for explicitly: refused
    with pytest.raises(ValueError, match="other settings"):
        Trainer(_cfg(tmp_path, squares_csv, name="other-grid", hp={"grid_size": "2"},
                     pseudo_labels=str(tmp_path / "first" / FILE_NAME)))
    with pytest.raises(ValueError, match="needs whole-image scores"):
        Trainer(_cfg(tmp_path, squares_csv, name="other-kind", method="vlpl",
                     pseudo_labels=str(tmp_path / "first" / FILE_NAME)))
    with pytest.raises(ValueError, match="--clip ViT-B-16:openai here"):
        Trainer(_cfg(tmp_path, squares_csv, name="other-clip", clip="ViT-B-16:openai",
                     pseudo_labels=str(tmp_path / "first" / FILE_NAME)))


def test_resume_reuses_the_stored_pseudo_labels(squares_csv: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The run folder's file is what --resume reads: CLIP does not run again and the file stays as it is."""
    cfg = _cfg(tmp_path, squares_csv, name="resumable", method="vlpl")
    first = Trainer(cfg)
    path = tmp_path / "resumable" / FILE_NAME
    before = path.stat().st_mtime_ns
    monkeypatch.setattr(stage, "load_clip", lambda *a: pytest.fail("--resume ran CLIP again"))
    monkeypatch.setattr(stage, "check_available", lambda *a: pytest.fail("--resume checked CLIP's weights"))
    plan = stage.plan_pseudo_labels(METHODS["vlpl"], first.run.hparams, cfg, tmp_path / "resumable", True)
    assert plan.source == stage.CACHE
    again = stage.prepare_pseudo_labels(plan, first.run.splits, first.run.dataset, cfg, tmp_path / "resumable", CPU)
    assert again.origin == "reused from the run folder" and path.stat().st_mtime_ns == before
    assert first.run.pseudo_labels is not None
    np.testing.assert_array_equal(again.positives, first.run.pseudo_labels.positives)


def test_without_full_training_labels_no_precision_is_printed(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Single-positive training labels as given: the count and per-image figure, no precision."""
    root = tmp_path / "sp"
    root.mkdir()
    rng = np.random.default_rng(0)
    rows = ["image,labels,split"]
    for i in range(24):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / f"{i}.png")
        rows.append(f"{i}.png,{'abc'[i % 3]},{'train' if i < 18 else 'test'}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    trainer = Trainer(_cfg(tmp_path, root / "labels.csv", name="sp-run", method="vlpl"))
    err = capsys.readouterr().err
    assert trainer.run.pseudo_labels is not None and "precision" not in trainer.run.pseudo_labels.file.extra
    assert "per image" in err and "precision" not in err


def test_pseudo_label_methods_declare_their_clip() -> None:
    users = sorted(name for name, cls in METHODS.items() if cls.uses_pseudo_labels)
    assert users == ["aevlp", "vlpl"]
    from train.methods import make_hparams

    assert METHODS["vlpl"].pseudo_label_spec(make_hparams(METHODS["vlpl"], {})).clip == "ViT-L-14-336:openai"
    cub = METHODS["aevlp"].pseudo_label_spec(make_hparams(METHODS["aevlp"], {}, "cub"))
    assert (cub.clip, cub.grid_size, cub.top_k, cub.temperature, cub.threshold) == ("ViT-B-16:openai", 5, 32, 0.1,
                                                                                    0.005)
