"""BatchNorm folded into the convolution before it, for a frozen backbone that only runs forward (PyTorch's
``fuse_conv_bn_eval``; timm's ``BatchNormAct2d`` keeps its activation). Pairs are found by position, which is not a
guarantee, so :func:`folded_copy` checks the copy on a batch and keeps the network when they differ."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

__all__ = ["fold_batchnorms", "folded_copy"]


def _after_fold(bn: nn.BatchNorm2d) -> nn.Module:
    """What stays of ``bn`` once folded: timm's BatchNormAct2d keeps its dropout and activation."""
    rest = [m for m in (getattr(bn, "drop", None), getattr(bn, "act", None)) if m is not None]
    return nn.Sequential(*rest) if rest else nn.Identity()


def fold_batchnorms(module: nn.Module) -> int:
    """Fold, in place and in eval mode, every BatchNorm2d that directly follows a Conv2d of as many output channels
    among its parent's children; returns how many were folded."""
    module.eval()
    folded = 0
    for parent in list(module.modules()):
        names = list(parent._modules)
        for first, second in itertools.pairwise(names):
            conv, bn = parent._modules[first], parent._modules[second]
            if (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.running_mean is not None
                    and conv.out_channels == bn.num_features):
                setattr(parent, first, fuse_conv_bn_eval(conv, bn))  # keeps the class: timm's "same" padding too
                setattr(parent, second, _after_fold(bn))
                folded += 1
    return folded


def folded_copy(model: nn.Module, function: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                example: torch.Tensor, rtol: float = 1e-3) -> nn.Module:
    """An eval-mode copy of ``model`` with its BatchNorms folded (:func:`fold_batchnorms`) when ``function(copy,
    example)`` matches ``function(model, example)`` within ``rtol`` of its scale, else ``model`` itself."""
    copied = copy.deepcopy(model)
    if not fold_batchnorms(copied):
        return model
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        expected = function(model, example).float()
        got = function(copied, example).float()
    model.train(was_training)
    scale = float(expected.abs().max()) or 1.0
    return copied if float((got - expected).abs().max()) <= rtol * scale else model
