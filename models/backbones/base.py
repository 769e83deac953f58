"""What every backbone family provides (running it, its ImageNet weights, its preprocessing), and their registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from models.registry import Registry


class WeightsUnavailableError(ValueError):
    """The requested pretrained weights cannot be had here (offline, or a package missing); the message says what
    to do instead."""


@dataclass(frozen=True)
class InputConfig:
    """The preprocessing a backbone's pretrained weights expect: input side, mean and std (for pixels in 0..1),
    resize interpolation and the share of the image its centre crop keeps (1 = no crop)."""

    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bilinear"
    crop: float = 1.0


class BackboneFamily:
    """One family of backbones, registered with ``@BACKBONE_FAMILIES.register``. Subclasses implement every method."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    priority: ClassVar[int] = 0  # families are asked in this order whether they build a name (lowest first)
    #: the family's backbones run with PU-MLC's LgConv (only the seeds' ResNets)
    supports_lgconv: ClassVar[bool] = False

    def accepts(self, arch: str) -> bool:
        """Whether ``arch`` names a backbone of this family."""
        raise NotImplementedError

    def create(self, arch: str, image_size: int | None = None) -> nn.Module:
        """The randomly initialised backbone ``arch`` without its classifier (``image_size``: for models built for
        one input size, such as ViTs)."""
        raise NotImplementedError

    def imagenet_state(self, arch: str, image_size: int | None = None) -> tuple[dict[str, torch.Tensor], str]:
        """The ImageNet weights of ``arch`` as a state dict of the backbone (classifier left out) and a line saying
        where they came from; :class:`WeightsUnavailableError` when they cannot be had here."""
        raise NotImplementedError

    def named_weights(self, arch: str, name: str) -> tuple[dict[str, torch.Tensor], str] | None:
        """Weights named ``name`` other than ``imagenet`` (e.g. torchvision's ``IMAGENET1K_V2``), or None when the
        family knows no such name."""
        return None

    def num_features(self, backbone: nn.Module) -> int:
        """Width of the pooled feature vector."""
        raise NotImplementedError

    def feature_map_width(self, backbone: nn.Module) -> int:
        """Channels of the last feature map: the pooled width, except for models whose head widens the pooled
        vector after pooling (MobileNetV3's 1x1 ``conv_head``)."""
        return self.num_features(backbone)

    def pooled(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Pooled features ``(N, D)`` of a normalised batch ``(N, 3, H, W)``: what a linear head takes."""
        raise NotImplementedError

    def feature_map(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The last feature map ``(N, D, h, w)`` (BoostLU's class activation maps, the label-wise embedding head)."""
        raise NotImplementedError

    def input_config(self, arch: str) -> InputConfig:
        """The preprocessing of the family's pretrained weights for ``arch``."""
        raise NotImplementedError

    def last_stage_frozen_below(self, backbone: nn.Module) -> list[nn.Module]:
        """The modules before the last stage (``--trainable layer4`` and ``top``), or ``ValueError`` when the family
        has no such scope."""
        raise ValueError(f"--trainable layer4 and top need a backbone with stages; {self.name} backbones train all, "
                         "or only the head (--trainable head)")

    def below_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The input of the last stage for a normalised batch ``x`` (what ``--trainable top`` caches)."""
        self.last_stage_frozen_below(backbone)  # the family's refusal
        raise NotImplementedError

    def from_last_stage(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """:meth:`pooled` from the last stage's input (``below_last_stage``'s output)."""
        raise NotImplementedError

    def fold_for_inference(self, model: nn.Module) -> nn.Module:
        """A copy of the whole network ``model`` in its exported form (exact folds such as BatchNorm into convolutions);
        the default returns ``model`` itself, as ONNX Runtime fuses such patterns on load."""
        return model


#: The backbone families, in the order they are asked whether they build a name (the first that accepts it does);
#: ``@BACKBONE_FAMILIES.register`` on a :class:`BackboneFamily` subclass registers one instance of it.
BACKBONE_FAMILIES: Registry[BackboneFamily] = Registry("backbone family", instances=True,
                                                      order=lambda row: (row.value.priority, row.name))
