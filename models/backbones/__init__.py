"""Backbones: one registry of families (:data:`BACKBONE_FAMILIES`), each a :class:`BackboneFamily` in its own module;
the first family, in ``priority`` order, that accepts a name builds it."""

from __future__ import annotations

from models.backbones import timm_models  # noqa: F401  (registers the timm family)
from models.backbones.base import BACKBONE_FAMILIES, BackboneFamily, InputConfig, WeightsUnavailableError
from models.backbones.torchvision_resnet import RESNETS

__all__ = ["BACKBONE_FAMILIES", "RESNETS", "BackboneFamily", "InputConfig", "WeightsUnavailableError", "family_of",
           "list_archs"]

def family_of(arch: str) -> BackboneFamily:
    """The family that builds ``arch``; ``ValueError`` saying which names exist otherwise."""
    for family in BACKBONE_FAMILIES.values():
        if family.accepts(arch):
            return family
    raise ValueError(f"unknown architecture {arch!r}: use {', '.join(RESNETS)} (torchvision, the seeds') or a timm "
                     "model name (python -m train --list-archs PATTERN lists them, e.g. --list-archs 'convnext*')")


def list_archs(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Architecture names matching the shell-style ``pattern``: torchvision's ResNets, then timm's models (with
    ``pretrained``, timm's names with their pretrained tags, e.g. ``convnext_tiny.fb_in22k``)."""
    import fnmatch

    import timm

    own = [name for name in RESNETS if fnmatch.fnmatch(name, pattern)]
    return own + [name for name in timm.list_models(pattern, pretrained=pretrained) if name not in RESNETS]
