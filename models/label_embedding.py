"""LAC's label-wise embedding head, a Query2Label-style transformer decoder (Xie, Xiao, Huang, NeurIPS 2022;
docs/methods.md, "LAC"): ``C`` class queries attend to the last feature map's positions; ``logit_c = <W_c, f_c> +
b_c``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class LabelEmbeddingConfig:
    """Shape of the head; ``ffn = 0`` means four times the model width (8192 for ResNet-50, the paper's)."""

    heads: int = 4
    encoder_layers: int = 1
    decoder_layers: int = 2
    ffn: int = 0
    dropout: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stored in checkpoint metadata)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LabelEmbeddingConfig:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


def sine_position_encoding(height: int, width: int, channels: int, device: torch.device,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normalised 2-D sine encoding ``(H*W, channels)``: ``channels/2`` features for y, then for x; each axis is
    scaled to ``(0, 2pi]`` and encoded with temperature 10000 as interleaved sin/cos pairs."""
    if channels % 4:
        raise ValueError(f"position encoding needs a width divisible by 4, got {channels}")
    per_axis = channels // 2
    y = torch.arange(1, height + 1, device=device, dtype=torch.float32) / height * (2 * math.pi)
    x = torch.arange(1, width + 1, device=device, dtype=torch.float32) / width * (2 * math.pi)
    dim = torch.arange(per_axis, device=device, dtype=torch.float32)
    freq = 10000.0 ** (2 * torch.div(dim, 2, rounding_mode="floor") / per_axis)

    def encode(pos: torch.Tensor) -> torch.Tensor:  # (L,) -> (L, per_axis): sin at even, cos at odd features
        angles = pos[:, None] / freq
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), dim=2).flatten(1)

    ey = encode(y)[:, None, :].expand(height, width, per_axis)
    ex = encode(x)[None, :, :].expand(height, width, per_axis)
    return torch.cat((ey, ex), dim=2).reshape(height * width, channels).to(dtype)


class _EncoderLayer(nn.Module):
    """Post-norm self-attention + FFN; the position encoding is added to queries and keys."""

    def __init__(self, width: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(width, ffn), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn, width))
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = tokens + pos
        tokens = self.norm1(tokens + self.drop1(self.attn(q, q, tokens, need_weights=False)[0]))
        return self.norm2(tokens + self.drop2(self.ffn(tokens)))


class _DecoderLayer(nn.Module):
    """Post-norm cross-attention (class queries -> image tokens) + FFN; no self-attention among classes."""

    def __init__(self, width: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.cross = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(width, ffn), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn, width))
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor,
                pos: torch.Tensor) -> torch.Tensor:
        attended = self.cross(tgt + query_pos, memory + pos, memory, need_weights=False)[0]
        tgt = self.norm1(tgt + self.drop1(attended))
        return self.norm2(tgt + self.drop2(self.ffn(tgt)))


class LabelEmbeddingHead(nn.Module):
    """Feature map ``(N, D, H, W)`` -> per-class embeddings ``(N, C, D)`` -> logits ``(N, C)``."""

    def __init__(self, width: int, num_classes: int, config: LabelEmbeddingConfig | None = None) -> None:
        super().__init__()
        cfg = config or LabelEmbeddingConfig()
        if width % cfg.heads:
            raise ValueError(f"label-embedding head: width {width} is not divisible by {cfg.heads} heads")
        ffn = cfg.ffn or 4 * width
        self.config = cfg
        self.width = width
        self.encoder = nn.ModuleList(_EncoderLayer(width, cfg.heads, ffn, cfg.dropout)
                                     for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(_DecoderLayer(width, cfg.heads, ffn, cfg.dropout)
                                     for _ in range(cfg.decoder_layers))
        self.decoder_norm = nn.LayerNorm(width)
        self.queries = nn.Embedding(num_classes, width)
        # GroupWiseLinear: one weight vector and bias per class
        self.class_weight = nn.Parameter(torch.empty(num_classes, width))
        self.class_bias = nn.Parameter(torch.empty(num_classes))
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.startswith(("queries", "class_")):
                nn.init.xavier_uniform_(p)
        bound = 1.0 / math.sqrt(self.width)
        nn.init.uniform_(self.class_weight, -bound, bound)
        nn.init.uniform_(self.class_bias, -bound, bound)

    @property
    def num_classes(self) -> int:
        """Number of classes (queries)."""
        return self.queries.num_embeddings

    def embeddings(self, fmap: torch.Tensor) -> torch.Tensor:
        """Per-class embeddings ``(N, C, D)`` of a feature map ``(N, D, H, W)``."""
        n, d, h, w = fmap.shape
        tokens = fmap.flatten(2).transpose(1, 2)  # (N, H*W, D)
        pos = sine_position_encoding(h, w, d, fmap.device, tokens.dtype).unsqueeze(0)
        for layer in self.encoder:
            tokens = layer(tokens, pos)
        query_pos = self.queries.weight.unsqueeze(0).expand(n, -1, -1).to(tokens.dtype)
        tgt = torch.zeros_like(query_pos)
        for layer in self.decoder:
            tgt = layer(tgt, query_pos, tokens, pos)
        return self.decoder_norm(tgt)

    def classify(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Group-wise linear classifier: ``(N, C, D)`` -> logits ``(N, C)``."""
        return (embeddings * self.class_weight).sum(-1) + self.class_bias

    def forward(self, fmap: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embeddings(fmap))
