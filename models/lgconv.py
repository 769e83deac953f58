"""PU-MLC's local-global convolution (LgConv) for torchvision ResNets, and its exact inference-time fold (Yuan, Zhang,
Huang, ICME 2024; docs/methods.md, "PU-MLC and LgConv"): every 3x3 ``conv(x)`` becomes ``conv(x) + GB(x)``, ``GB`` a
global branch with 8 attention heads; :class:`LgConv2d` *is* an ``nn.Conv2d`` with the branch as its child, so ResNet
weights load unchanged. :func:`fold_resnet`: BatchNorms folded, the branch's linear path in the kernel's centre tap,
the global term computed on 8 attention-pooled vectors."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval

HEADS = 8
REDUCTION = 4
BN_GAMMA_STD = 1e-4  # the global branch starts (almost) switched off: output = plain ResNet's


class GlobalBranch(nn.Module):
    """The global branch ``GB(x)`` of an LgConv: ``(N, C_in, H, W)`` -> ``(N, C_out, H/s, W/s)``."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, heads: int = HEADS,
                 reduction: int = REDUCTION) -> None:
        super().__init__()
        if in_channels % heads or in_channels % reduction:
            raise ValueError(f"LgConv needs in_channels ({in_channels}) divisible by heads ({heads}) and by the "
                             f"reduction ({reduction})")
        mid = in_channels // reduction
        self.heads = heads
        self.reduce = nn.Conv2d(in_channels, mid, 1)
        self.attention = nn.Conv2d(2 * mid, heads, 1)
        self.gate = nn.Conv2d(2 * mid, heads, 1)
        self.value = nn.Conv2d(in_channels, in_channels, 1)
        self.proj = nn.Conv2d(in_channels, out_channels, 1, stride=stride)
        self.bn = nn.BatchNorm2d(out_channels)
        nn.init.normal_(self.bn.weight, 0.0, BN_GAMMA_STD)
        nn.init.zeros_(self.bn.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        local = F.relu(self.reduce(x))
        context = local.mean(dim=(2, 3), keepdim=True).expand_as(local)
        mixed = torch.cat([local, context], dim=1)
        attention = self.attention(mixed).flatten(2).softmax(dim=-1)  # (N, heads, HW)
        gate = torch.sigmoid(self.gate(mixed)).flatten(2)  # (N, heads, HW)
        value = self.value(x).reshape(n, self.heads, c // self.heads, h * w)
        pooled = torch.einsum("nhkp,nhp->nhk", value, attention)  # one C_in/heads vector per head
        broadcast = (pooled.unsqueeze(-1) * gate.unsqueeze(2)).reshape(n, c, h, w)
        return self.bn(self.proj(x + broadcast))


class LgConv2d(nn.Conv2d):
    """A 3x3 ``nn.Conv2d`` plus a :class:`GlobalBranch`: ``forward(x) = conv(x) + GB(x)``."""

    def __init__(self, conv: nn.Conv2d, heads: int = HEADS, reduction: int = REDUCTION) -> None:
        if conv.kernel_size != (3, 3) or conv.padding != (1, 1) or conv.dilation != (1, 1) or conv.groups != 1:
            raise ValueError(f"LgConv wraps dense 3x3 convolutions with padding 1, got {conv}")
        if conv.stride[0] != conv.stride[1]:
            raise ValueError(f"LgConv needs a square stride, got {conv.stride}")
        super().__init__(conv.in_channels, conv.out_channels, 3, stride=conv.stride, padding=1,
                         bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            self.weight.copy_(conv.weight)
            if conv.bias is not None and self.bias is not None:
                self.bias.copy_(conv.bias)
        self.global_branch = GlobalBranch(conv.in_channels, conv.out_channels, conv.stride[0], heads, reduction).to(
            device=conv.weight.device, dtype=conv.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.global_branch(x)


def convert_to_lgconv(module: nn.Module, heads: int = HEADS, reduction: int = REDUCTION) -> int:
    """Wrap every dense 3x3 ``nn.Conv2d`` in ``module`` (in place) as :class:`LgConv2d`; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if type(child) is nn.Conv2d and child.kernel_size == (3, 3) and child.groups == 1:
            setattr(module, name, LgConv2d(child, heads, reduction))
            count += 1
        elif not isinstance(child, LgConv2d):
            count += convert_to_lgconv(child, heads, reduction)
    return count


def global_branches(module: nn.Module) -> Iterator[GlobalBranch]:
    """All :class:`GlobalBranch` modules inside ``module``."""
    return (m for m in module.modules() if isinstance(m, GlobalBranch))


def _bn_affine(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode BatchNorm as ``y = scale * x + shift`` (per channel)."""
    assert bn.running_var is not None and bn.running_mean is not None
    scale = bn.running_var.add(bn.eps).rsqrt()
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias
    return scale, shift


class FoldedLgConv2d(nn.Module):
    """Inference form of ``BN(LgConv(x))`` (the following BatchNorm folded in), equivalent to the training form in eval
    mode; built by :meth:`from_lgconv`."""

    def __init__(self, conv: nn.Conv2d, reduce: nn.Conv2d, mix: nn.Conv2d, value_weight: torch.Tensor,
                 value_bias: torch.Tensor, proj_weight: torch.Tensor, stride: int) -> None:
        super().__init__()
        self.conv = conv  # the 3x3 kernel with the branch's linear path in its centre tap, BN folded
        self.reduce = reduce
        # one 1x1 conv for the three per-head maps the branch needs from the local features: attention logits,
        # the gates' local part, and the gates' context part (averaged over the positions: the context is the
        # positional mean of the local features and the map is linear, so the mean can come after it)
        self.mix = mix
        # per head, laid out for batched matrix products over the heads (plain MatMul nodes in ONNX):
        self.register_buffer("value_t", value_weight.transpose(1, 2).contiguous())  # (heads, C_in, C_in/heads)
        self.register_buffer("value_bias", value_bias.unsqueeze(1).contiguous())  # (heads, 1, C_in/heads)
        self.register_buffer("proj_t", proj_weight.transpose(1, 2).contiguous())  # (heads, C_in/heads, C_out)
        self.heads = value_weight.shape[0]
        self.stride = stride

    @classmethod
    @torch.no_grad()
    def from_lgconv(cls, lg: LgConv2d, bn: nn.BatchNorm2d | None) -> FoldedLgConv2d:
        """Fold ``bn(lg(x))`` (``bn=None``: just ``lg(x)``); both are read in eval mode, nothing is modified."""
        gb = lg.global_branch
        out_ch, in_ch = lg.out_channels, lg.in_channels
        dev, dt = lg.weight.device, lg.weight.dtype
        if bn is not None:
            out_scale, out_shift = _bn_affine(bn)
        else:
            out_scale, out_shift = torch.ones(out_ch, device=dev, dtype=dt), torch.zeros(out_ch, device=dev, dtype=dt)
        gb_scale, gb_shift = _bn_affine(gb.bn)
        p = gb.proj.weight[:, :, 0, 0] * (out_scale * gb_scale)[:, None]  # (C_out, C_in): s * a * P
        bias = out_scale * (gb_scale * _bias(gb.proj) + gb_shift) + out_shift
        if lg.bias is not None:
            bias = bias + out_scale * lg.bias
        conv = nn.Conv2d(in_ch, out_ch, 3, stride=lg.stride, padding=1, bias=True, device=dev, dtype=dt)
        conv.weight.copy_(lg.weight * out_scale[:, None, None, None])
        conv.weight[:, :, 1, 1] += p
        conv.bias.copy_(bias)

        mid = gb.reduce.out_channels
        heads = gb.heads
        reduce = copy.deepcopy(gb.reduce)
        # The attention and gate convs see [local, context]. The attention's context share and its bias are the
        # same at every position of an image, and a softmax over the positions ignores such a shift: both drop.
        att_w, gate_w = gb.attention.weight[:, :, 0, 0], gb.gate.weight[:, :, 0, 0]  # (heads, 2 mid) each
        mix = nn.Conv2d(mid, 3 * heads, 1, device=dev, dtype=dt)
        mix.weight.copy_(torch.cat([att_w[:, :mid], gate_w[:, :mid], gate_w[:, mid:]])[:, :, None, None])
        mix.bias.copy_(torch.cat([torch.zeros_like(_bias(gb.attention)), _bias(gb.gate),
                                  torch.zeros_like(_bias(gb.gate))]))
        k = in_ch // heads
        value_weight = gb.value.weight[:, :, 0, 0].reshape(heads, k, in_ch).clone()
        value_bias = _bias(gb.value).reshape(heads, k).clone()
        proj_weight = p.reshape(out_ch, heads, k).permute(1, 0, 2).contiguous()
        return cls(conv, reduce, mix, value_weight, value_bias, proj_weight, lg.stride[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        local = F.relu(self.reduce(x))
        att, gate_local, gate_context = self.mix(local).split(self.heads, dim=1)
        attention = att.flatten(2).softmax(dim=-1)  # (N, heads, HW)
        if self.stride > 1:
            gate_local = gate_local[:, :, :: self.stride, :: self.stride]  # the gates at the output positions
        gate = torch.sigmoid(gate_local + gate_context.mean(dim=(2, 3), keepdim=True)).flatten(2)
        # attention-weighted pools of x, one per head: (N, C_in, HW) @ (N, HW, heads); x itself is never transposed
        pooled = torch.matmul(x.flatten(2), attention.transpose(1, 2)).permute(2, 0, 1)  # (heads, N, C_in)
        g = torch.matmul(pooled, self.value_t) + self.value_bias  # (heads, N, C_in/heads)
        u = torch.matmul(g, self.proj_t).permute(1, 2, 0)  # (N, C_out, heads)
        if torch.onnx.is_in_onnx_export():
            # ONNX Runtime runs convolutions in a blocked channel layout (NCHWc) and keeps an Add in that layout
            # only when both inputs come from blocked-layout ops. Passing the global term through an identity
            # depthwise 1x1 conv makes it one, so ONNX Runtime fuses the Add (and the block's ReLU after it)
            # into the 3x3 convolution instead of converting the conv output to plain layout and the sum back.
            # A multiplication by exactly 1: the exported function is unchanged.
            term = torch.matmul(u, gate).view_as(out)
            channels = term.shape[1]
            identity = torch.ones(channels, 1, 1, 1, dtype=term.dtype, device=term.device)
            return out + F.conv2d(term, identity, groups=channels)
        # eager: add u @ gate into the conv output in place (one pass over the output instead of three); the
        # casts are no-ops in float32 and keep the in-place add valid under autocast
        flat = out.flatten(2)
        return flat.baddbmm_(u.to(flat.dtype), gate.to(flat.dtype)).view_as(out)


def _bias(conv: nn.Conv2d) -> torch.Tensor:
    if conv.bias is not None:
        return conv.bias
    return torch.zeros(conv.out_channels, device=conv.weight.device, dtype=conv.weight.dtype)


def _fold_pair(conv: nn.Module, bn: nn.Module) -> nn.Module:
    if isinstance(conv, LgConv2d):
        return FoldedLgConv2d.from_lgconv(conv, bn if isinstance(bn, nn.BatchNorm2d) else None)
    if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
        return fuse_conv_bn_eval(conv, bn)
    return conv


def _fold_children(module: nn.Module) -> None:
    """Fold conv/BN pairs named ``convN``/``bnN`` (torchvision blocks and stem) and ``Sequential(conv, bn)``."""
    for name, child in list(module.named_children()):
        _fold_children(child)
        if name.startswith("conv") and hasattr(module, "bn" + name[4:]):
            bn_name = "bn" + name[4:]
            bn = getattr(module, bn_name)
            if isinstance(bn, nn.BatchNorm2d):
                setattr(module, name, _fold_pair(child, bn))
                setattr(module, bn_name, nn.Identity())
    if isinstance(module, nn.Sequential):
        for i in range(len(module) - 1):
            if isinstance(module[i], nn.Conv2d) and isinstance(module[i + 1], nn.BatchNorm2d):
                module[i] = _fold_pair(module[i], module[i + 1])
                module[i + 1] = nn.Identity()


def fold_resnet(model: nn.Module) -> nn.Module:
    """An inference copy of a ResNet-based ``model``, BatchNorms and LgConv folded: the same function in eval mode."""
    folded = copy.deepcopy(model).eval()
    _fold_children(folded)
    leftover = [n for n, m in folded.named_modules() if isinstance(m, (nn.BatchNorm2d, LgConv2d, GlobalBranch))]
    if leftover:
        raise ValueError(f"fold_resnet: could not fold {leftover[:3]}; not a torchvision ResNet layout?")
    for p in folded.parameters():
        p.requires_grad_(False)
    return folded
