"""Training on timm backbones and the fixed-feature mode (``--trainable head``): every method on a tiny random-init
timm model, the feature cache (reused, invalidated by data, backbone and preprocessing), resume, refusals, and the
head bias at the label prior."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from interrupt import interrupt_after_saves
from PIL import Image
from tiny_clip import save_tiny_clip

from models import load_checkpoint
from models.network import MultiLabelNet
from train.__main__ import main
from train.config import TrainConfig
from train.feature_cache import features_folder
from train.fixed_features import FixedFeaturePhase
from train.methods import METHODS
from train.trainer import Trainer

TIMM = "test_efficientnet"  # timm's own tiny EfficientNet (random init): 256 features


def _cfg(tmp_path: Path, data: str, **kw: object) -> TrainConfig:
    base = {"data": data, "arch": TIMM, "weights": "none", "image_size": 32, "batch_size": 16, "epochs": 1,
            "workers": 0, "progress": False, "runs_dir": str(tmp_path), "labels": "full"}  # squares_csv: all known
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_every_method_trains_on_a_timm_backbone(squares_csv: Path, tmp_path: Path) -> None:
    """Every method, one epoch on a timm backbone: LAC's label-wise head and views, PU-MLC's mixup, ROLE's label
    matrix, the oracles; then BoostLU on the timm feature map."""
    for method in sorted(METHODS):
        observed = "single?neg=3" if METHODS[method].uses_observed_negatives else "single"
        clip = save_tiny_clip(tmp_path / "clip") if METHODS[method].uses_pseudo_labels else ""  # vlpl, aevlp
        summary = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name=method, method=method, observed=observed,
                               clip=clip)).fit()
        assert 0 < summary["test"]["mAP"] <= 100, method
        meta = load_checkpoint(tmp_path / method / "best.pt").meta
        assert meta.arch == TIMM and not meta.lgconv and meta.interpolation == "bicubic", method
    Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="boostlu", method="ll-r", boostlu=5.0)).fit()
    assert load_checkpoint(tmp_path / "boostlu" / "best.pt").meta.head == {"kind": "linear", "boostlu": 5.0}


def _feature_files() -> set[str]:
    folder = features_folder()
    return {p.name for p in folder.glob("*.pt")} if folder.is_dir() else set()


def test_head_mode_freezes_the_backbone_and_reuses_cached_features(squares_csv: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = _feature_files()
    first = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="h1", trainable="head", epochs=3, lr=1e-2))
    backbone = {k: v.clone() for k, v in first.run.model.backbone.state_dict().items()}
    summary = first.fit()
    for key, value in first.run.model.backbone.state_dict().items():  # weights and BN statistics untouched
        torch.testing.assert_close(value, backbone[key], rtol=0, atol=0, msg=key)
    created = _feature_files() - before
    assert len(created) == 3  # train, val, test
    lines = [json.loads(x) for x in (tmp_path / "h1" / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3] and lines[0]["lr"] != lines[1]["lr"]  # the run's schedule
    assert summary["test"]["num_images"] == 48

    # another method on the same data, backbone and preprocessing: every split from the cache, no backbone call
    calls = {"n": 0}
    original = MultiLabelNet.features

    def counting(self: MultiLabelNet, x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return original(self, x)

    monkeypatch.setattr(MultiLabelNet, "features", counting)
    second = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="h2", trainable="head", epochs=2, method="epr"))
    second.fit()
    assert calls["n"] == 0 and _feature_files() - before == created
    monkeypatch.setattr(MultiLabelNet, "features", original)

    # preprocessing, backbone weights or data changed: new features
    Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="h3", trainable="head", image_size=40)).fit()
    assert len(_feature_files() - before - created) == 3
    Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="h4", trainable="head", seed=1)).fit()  # another init
    assert len(_feature_files() - before - created) == 6


def test_changed_image_invalidates_only_its_split(squares_csv: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for path in squares_csv.parent.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    Trainer(_cfg(tmp_path, f"csv:{data / 'labels.csv'}", trainable="head", name="a")).fit()
    before = _feature_files()
    image = data / "test0.png"
    Image.new("RGB", (32, 32), (255, 255, 255)).save(image)
    os.utime(image, ns=(1, 1))
    Trainer(_cfg(tmp_path, f"csv:{data / 'labels.csv'}", trainable="head", name="b")).fit()
    assert len(_feature_files() - before) == 1  # the test split's; train and val came from the cache


def test_head_mode_resumes_exactly(builtin_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--data", "builtin:tiny", "--arch", TIMM, "--weights", "none", "--image-size", "32", "--batch-size", "16",
            "--no-progress", "--workers", "0", "--trainable", "head", "--epochs", "3", "--method", "role",
            "--runs-dir", str(tmp_path)]
    assert main([*args, "--name", "straight"]) == 0
    interrupt_after_saves(monkeypatch)
    assert main([*args, "--name", "resumed"]) == 130
    assert main(["--resume", str(tmp_path / "resumed")]) == 0
    a, b = load_checkpoint(tmp_path / "straight" / "last.pt"), load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=0, msg=key)
    torch.testing.assert_close(b.training["method"]["estimator"], a.training["method"]["estimator"], rtol=0, atol=0)
    config = json.loads((tmp_path / "resumed" / "config.json").read_text())["config"]
    assert config["trainable"] == "head" and config["epochs"] == 3


def test_head_mode_refuses_what_needs_images_or_feature_maps(squares_csv: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--data", f"csv:{squares_csv}", "--arch", TIMM, "--weights", "none", "--image-size", "32",
              "--trainable", "head", "--no-progress", "--runs-dir", str(tmp_path)]
    assert main([*common, "--method", "lac"]) == 2
    assert "lac trains on extra augmented views" in capsys.readouterr().err
    assert main([*common, "--method", "lac", "--head", "linear"]) == 2
    assert "--head lem" in capsys.readouterr().err
    assert main([*common, "--head", "lem"]) == 2
    assert "the lem head works on feature maps" in capsys.readouterr().err
    assert main([*common, "--boostlu"]) == 2
    assert "--boostlu cannot train on fixed features" in capsys.readouterr().err
    assert main([*common, "--linear-init", "2"]) == 2
    assert "already on fixed features" in capsys.readouterr().err
    assert main(["--data", f"csv:{squares_csv}", "--arch", TIMM, "--lgconv", "--runs-dir", str(tmp_path)]) == 2
    assert "LgConv" in capsys.readouterr().err


def test_head_bias_starts_at_the_label_prior(squares_csv: Path, tmp_path: Path) -> None:
    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    given = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="prior", head_bias="prior", method="epr",
                         hp={"k": "1.5"}))  # the run's own k
    torch.testing.assert_close(given.run.model.head.bias, torch.full((4,), logit(1.5 / 4)))
    full = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="prior-an", head_bias="prior"))  # an: no k of its own
    k = float(full.run.splits.train.labels.sum(1).mean())  # the training labels are full: their mean
    assert 1.2 < k < 1.8
    torch.testing.assert_close(full.run.model.head.bias, torch.full((4,), logit(k / 4)))
    partial = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="prior-partial", head_bias="prior", labels="partial",
                           observed="single"))
    torch.testing.assert_close(partial.run.model.head.bias, torch.full((4,), logit(1 / 4)))  # observed per image
    default = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="default", head_bias="default"))
    assert default.run.model.head.bias.std() > 0.01  # PyTorch's uniform initialisation


def _phases(method: str, rows: list[int], classes: int = 5, width: int = 12) -> list[FixedFeaturePhase]:
    """Phases on random features, one per count of training rows (batches of 8, 2 epochs of onecycle Adam)."""
    from types import SimpleNamespace

    import numpy as np

    from models.data.types import LabelledImages
    from train.fixed_features import HeadOptimisation
    from train.methods import MethodContext, make_hparams
    from train.selection import Rows

    out = []
    for i, n in enumerate(rows):
        gen = torch.Generator().manual_seed(i)
        labels = np.zeros((n + 6, classes), dtype=np.uint8)
        labels[np.arange(n + 6), torch.randint(0, classes, (n + 6,), generator=gen).numpy()] = 1
        images = LabelledImages([Path(f"{j}.png") for j in range(n + 6)], labels, [str(c) for c in range(classes)])
        train, val = images.subset(np.arange(n)), images.subset(np.arange(n, n + 6))
        features = {split: Rows(torch.rand(len(part), width, generator=gen), torch.ones(len(part), dtype=torch.bool))
                    for split, part in (("train", train), ("val", val))}
        observed = torch.from_numpy(train.labels.astype(np.float32))
        ctx = MethodContext(classes, n, observed, expected_positives=1.0, epochs=2)
        built = METHODS[method](ctx, make_hparams(METHODS[method], {}))
        torch.manual_seed(i)
        model = SimpleNamespace(head=torch.nn.Linear(width, classes))
        predictor = SimpleNamespace(device=torch.device("cpu"))
        out.append(FixedFeaturePhase(model, built, predictor, train, val, observed, torch.zeros_like(observed), None,
                                     HeadOptimisation("adam", 1e-2, 2, scheduler="onecycle"), 8, 0,
                                     features=features))
    return out


@pytest.mark.parametrize("method", ["an", "pu-mlc", "ll-cp", "role"])
def test_phases_trained_together_take_the_steps_of_one_after_the_other(method: str) -> None:
    """JointTraining (the cross-fitted heads of a candidate): the same heads and method state as training each phase
    alone from the same random state, also for a method that draws random numbers (pu-mlc's mixup) or keeps
    per-image state (ll-cp) or parameters of its own (role); phases of another pace train in a group of their own."""
    from train.fixed_features import JointTraining, joint_groups

    rows = [37, 39, 40, 41]  # 5, 5, 5 and 6 steps per epoch
    alone = _phases(method, rows)
    for phase in alone:
        torch.manual_seed(1)
        for epoch in (1, 2):
            phase.train_epoch(epoch)
    together = _phases(method, rows)
    torch.manual_seed(1)
    groups = joint_groups(together)
    assert groups == [[0, 1, 2], [3]]
    for joint in [JointTraining([together[i] for i in group]) for group in groups]:
        for epoch in (1, 2):
            joint.train_epoch(epoch)
    for one, other in zip(alone, together, strict=True):
        for key, value in {**one.head.state_dict(), **one.method.state_dict()}.items():
            assert torch.equal(value, {**other.head.state_dict(), **other.method.state_dict()}[key]), key
    broken = _phases("an", [37, 39])
    broken[1].train_features[:] = math.nan
    with pytest.raises(FloatingPointError, match="loss is nan at epoch 1, step 1; try a lower --lr"):
        JointTraining(broken).train_epoch(1)
