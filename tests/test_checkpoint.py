"""Checkpoints: round trip of weights and metadata, and refusal to unpickle arbitrary objects."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from models import ModelMeta, build_model, load_checkpoint, model_from_meta, save_checkpoint


def _meta() -> ModelMeta:
    return ModelMeta(
        classes=["cat", "dog", "car"], arch="resnet18", image_size=32, method="an",
        method_hparams={"eps": 0.1}, data={"name": "toy", "source": "csv:/x.csv", "fingerprint": "abc"},
        metrics={"val": {"mAP": 50.0}}, thresholds=[0.4, 0.5, 0.6], epoch=3,
    )


def test_round_trip_restores_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", 3).eval()
    save_checkpoint(tmp_path / "best.pt", model.state_dict(), _meta(), training={"epoch": 3})
    ckpt = load_checkpoint(tmp_path / "best.pt")
    assert ckpt.meta == _meta()
    assert ckpt.training == {"epoch": 3}
    clone = model_from_meta(ckpt.meta).eval()
    clone.load_state_dict(ckpt.model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(clone(x), model(x), rtol=0, atol=0)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_loading_refuses_pickled_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": "spml-checkpoint", "meta": "{}", "model": {}, "x": _Evil()}, path, pickle_module=pickle)
    with pytest.raises(ValueError, match="not a loadable checkpoint"):
        load_checkpoint(path)
    assert "pwned" not in capsys.readouterr().out


def test_loading_rejects_foreign_and_missing_files(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an spml checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "trunc.pt").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ValueError, match="not a loadable"):
        load_checkpoint(tmp_path / "trunc.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_weights_file_initialises_backbone(tmp_path: Path) -> None:
    torch.manual_seed(1)
    donor = build_model("resnet18", 5)
    save_checkpoint(tmp_path / "donor.pt", donor.state_dict(), _meta())
    model = build_model("resnet18", 3, weights=str(tmp_path / "donor.pt"))  # other class count: head is new
    torch.testing.assert_close(model.backbone.conv1.weight, donor.backbone.conv1.weight)
    with pytest.raises(ValueError, match="missing or of another shape"):
        build_model("resnet50", 3, weights=str(tmp_path / "donor.pt"))
    with pytest.raises(FileNotFoundError):
        build_model("resnet18", 3, weights=str(tmp_path / "nope.pt"))


def test_weights_file_head_loaded_when_it_fits_unless_reset(tmp_path: Path) -> None:
    torch.manual_seed(1)
    donor = build_model("resnet18", 3)
    save_checkpoint(tmp_path / "donor.pt", donor.state_dict(), _meta())
    same = build_model("resnet18", 3, weights=str(tmp_path / "donor.pt"))
    torch.testing.assert_close(same.head.weight, donor.head.weight)
    torch.manual_seed(2)
    fresh = build_model("resnet18", 3)
    torch.manual_seed(2)
    reset = build_model("resnet18", 3, weights=str(tmp_path / "donor.pt"), load_head=False)
    torch.testing.assert_close(reset.head.weight, fresh.head.weight)  # the fresh initialisation, untouched
    torch.testing.assert_close(reset.head.bias, fresh.head.bias)
    assert not torch.equal(reset.head.weight, donor.head.weight)
    torch.testing.assert_close(reset.backbone.layer4[1].conv2.weight, donor.backbone.layer4[1].conv2.weight)


def test_unknown_architecture_and_weights_names() -> None:
    with pytest.raises(ValueError, match="unknown architecture"):
        build_model("not_a_network", 3)
    with pytest.raises(ValueError, match="unknown weights"):
        build_model("resnet18", 3, weights="IMAGENET9K")


def test_imagenet_weights_resolve_to_the_papers_torchvision_weights_without_downloading() -> None:
    from torchvision.models import ResNet50_Weights

    from models.backbones import family_of

    resnets = family_of("resnet50")
    assert resnets.weights_enum("resnet50", "imagenet") is ResNet50_Weights.IMAGENET1K_V1  # what the papers used
    assert resnets.weights_enum("resnet50", "IMAGENET1K_V2") is ResNet50_Weights.IMAGENET1K_V2
    assert resnets.weights_enum("resnet50", "IMAGENET9K") is None
