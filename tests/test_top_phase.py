"""``--trainable top``: the last stage and the head on cached inputs of the frozen stages below - the split reproduces
the network, only the last stage and the head change, the cached inputs are reused, flips are drawn, a killed run
resumes exactly, and what cannot work is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from interrupt import interrupt_after_saves

from models import load_checkpoint
from models.network import build_model
from train.__main__ import main
from train.config import TrainConfig
from train.feature_cache import features_folder
from train.top_phase import TopPhase
from train.trainer import Trainer

TIMM = "test_efficientnet"  # timm's own tiny EfficientNet (random init)


@pytest.mark.parametrize("arch", ["resnet18", TIMM])
def test_the_split_at_the_last_stage_reproduces_the_network(arch: str) -> None:
    model = build_model(arch, 5, lgconv=arch == "resnet18").eval()
    x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.from_last_stage(model.below_last_stage(x)), model(x))


def _cfg(tmp_path: Path, data: str, **kw: object) -> TrainConfig:
    # 48 px: features of their own, so the head-mode tests that count cache files (32 px) see none of these
    base = {"data": data, "arch": TIMM, "weights": "none", "image_size": 48, "batch_size": 16, "workers": 0,
            "progress": False, "runs_dir": str(tmp_path), "labels": "full", "trainable": "top", "linear_init": 2,
            "epochs": 3, "lr": 3e-3}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_top_trains_only_the_last_stage_and_the_head_on_cached_inputs(squares_csv: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = features_folder()
    before = set(folder.glob("*.pt")) if folder.is_dir() else set()
    trainer = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="t1"))
    model = trainer.run.model
    start = {k: v.clone() for k, v in model.state_dict().items()}
    flips: list[float] = []
    original = TopPhase.batches

    def counting(self: TopPhase, epoch: int):  # type: ignore[no-untyped-def]
        for number, size, batch in original(self, epoch):
            same = (batch["images"] == self.train_features.index_select(0, batch["index"])).flatten(1).all(1)
            flips.append(float((~same).float().mean()))
            yield number, size, batch

    monkeypatch.setattr(TopPhase, "batches", counting)
    summary = trainer.fit()
    after = model.state_dict()
    last = f"backbone.blocks.{len(model.backbone.blocks) - 1}."
    for key, value in after.items():
        # below the last stage: weights and BatchNorm statistics never run in training, never changed
        if key.startswith(("backbone.conv_stem", "backbone.bn1", "backbone.blocks")) and not key.startswith(last):
            torch.testing.assert_close(value, start[key], rtol=0, atol=0, msg=key)
    changed = [k for k, v in after.items() if v.dtype.is_floating_point and not torch.equal(v, start[k])]
    assert any(k.startswith(last) for k in changed) and any(k.startswith("head.") for k in changed)
    assert 0.2 < sum(flips) / len(flips) < 0.8  # about half the rows of a batch come flipped
    lines = [json.loads(x) for x in (tmp_path / "t1" / "metrics.jsonl").read_text().splitlines()]
    assert [x["phase"] for x in lines] == [1.0, 1.0, 2.0, 2.0, 2.0]
    # best.pt, run on the images, scores val as the phase did on its cached (float16) inputs
    best = next(x for x in lines if x["epoch"] == summary["best_epoch"])
    assert summary["val"]["mAP"] == pytest.approx(best["val_mAP"], abs=0.5)
    assert trainer.top is not None and trainer.top.cache_hits == [False] * 3  # train, val, flipped train: stored
    assert len(set(folder.glob("*.pt")) - before) >= 3

    # a second run on the same data and backbone: the last-stage inputs come from the cache
    again = Trainer(_cfg(tmp_path, f"csv:{squares_csv}", name="t2", method="epr"))
    again.fit()
    assert again.top is not None and all(again.top.cache_hits)


def test_top_resumes_exactly(builtin_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--data", "builtin:tiny", "--arch", TIMM, "--weights", "none", "--image-size", "32", "--batch-size", "16",
            "--no-progress", "--workers", "0", "--trainable", "top", "--linear-init", "1", "--epochs", "3",
            "--runs-dir", str(tmp_path)]
    assert main([*args, "--name", "straight"]) == 0
    interrupt_after_saves(monkeypatch, 3)  # killed inside the top phase
    assert main([*args, "--name", "resumed"]) == 130
    assert main(["--resume", str(tmp_path / "resumed")]) == 0
    a, b = load_checkpoint(tmp_path / "straight" / "last.pt"), load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=0, msg=key)


def test_top_refuses_what_it_cannot_train(squares_csv: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--data", f"csv:{squares_csv}", "--weights", "none", "--image-size", "32", "--trainable", "top",
              "--no-progress", "--runs-dir", str(tmp_path)]
    assert main([*common, "--arch", TIMM, "--boostlu"]) == 2
    assert "--trainable top trains the linear head" in capsys.readouterr().err
    assert main([*common, "--arch", TIMM, "--head", "lem"]) == 2
    assert "--trainable top trains the linear head" in capsys.readouterr().err
    assert main([*common, "--arch", "test_vit", "--image-size", "160"]) == 2
    assert "split the timm EfficientNets" in capsys.readouterr().err
