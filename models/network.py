"""The multi-label network: a backbone and a ``linear`` (BoostLU: :class:`BoostedCamHead`) or ``lem`` head; state-dict
keys are ``backbone.<the library's key>`` and ``head.<...>``, so library weight files load as they are."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from models.backbones import BackboneFamily, InputConfig, family_of
from models.backbones.efficientnet_lite_wheels import is_lukemelas_state, lukemelas_to_timm
from models.label_embedding import LabelEmbeddingConfig, LabelEmbeddingHead
from models.lgconv import GlobalBranch, convert_to_lgconv
from models.registry import Row, Table
from models.weight_files import BACKBONE, HEAD, describe_mismatch, in_network_keys, read_state

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta


@dataclass(frozen=True)
class TrainableScope:
    """What a ``--trainable`` value trains: ``frozen(family, backbone)`` lists the frozen backbone modules;
    ``fixed_features``: the whole backbone is frozen and its features cached."""

    frozen: Callable[[BackboneFamily, nn.Module], list[nn.Module]]
    fixed_features: bool = False
    branches_train: bool = False
    cached_below: bool = False  # the frozen stages' output is cached; the last stage and the head train on it


#: Which parameters train (``--trainable``).
TRAINABLE_SCOPES: Table[TrainableScope] = Table("trainable scope", [
    Row("all", "every weight", TrainableScope(lambda family, backbone: [])),
    Row("layer4", "the last stage (the ResNets' LgConv branches + layer4) + head; the stages below frozen, their "
        "BatchNorms in eval mode so the frozen features really are fixed",
        TrainableScope(lambda family, backbone: family.last_stage_frozen_below(backbone), branches_train=True)),
    Row("top", "the backbone's last stage and the head, trained on the cached output of the frozen stages below "
        "(after LinearInit's head): seconds per epoch on a CPU",
        TrainableScope(lambda family, backbone: family.last_stage_frozen_below(backbone), cached_below=True)),
    Row("head", "the head only, the backbone fixed: Cole et al.'s linear_fixed_features mode (features cached)",
        TrainableScope(lambda family, backbone: [backbone], fixed_features=True)),
])


def on_cached_stages(trainable: str) -> bool:
    """Whether ``--trainable`` ``trainable`` trains the last stage on cached outputs of the stages below (``top``)."""
    return TRAINABLE_SCOPES[trainable].cached_below


def on_fixed_features(trainable: str) -> bool:
    """Whether ``--trainable`` ``trainable`` trains on fixed (cached) backbone features: the head alone."""
    return TRAINABLE_SCOPES[trainable].fixed_features


@dataclass(frozen=True)
class HeadKind:
    """A classifier head: ``build(in_features, num_classes, head_config)``; ``on_feature_map``: reads the map."""

    build: Callable[[int, int, LabelEmbeddingConfig | None], nn.Module]
    on_feature_map: bool = False


#: Classifier heads (``--head``).
HEADS: Table[HeadKind] = Table("head", [
    Row("linear", "global average pool + a linear layer (the papers' default)",
        HeadKind(lambda features, classes, config: nn.Linear(features, classes))),
    Row("lem", "LAC's label-wise embedding transformer on the last feature map (models.label_embedding)",
        HeadKind(LabelEmbeddingHead, on_feature_map=True)),
])


def head_on_feature_map(head: str) -> bool:
    """Whether ``--head`` ``head`` works on the last feature map (``auto`` and unknown names: False)."""
    return head in HEADS and HEADS[head].on_feature_map

BOOSTLU_ALPHA = 5.0  # Kim et al. 2023's published BoostLU factor


def boost_lu(cam: torch.Tensor, alpha: float) -> torch.Tensor:
    """BoostLU (Kim et al., CVPR 2023): positive values multiplied by ``alpha``, the others kept."""
    return torch.where(cam > 0, cam * alpha, cam)


class BoostedCamHead(nn.Linear):
    """The linear head at every position of the last feature map, then BoostLU, then average pooling (Kim et al. 2023);
    an ``nn.Linear``, equal to the plain head at ``alpha = 1``."""

    def __init__(self, in_features: int, out_features: int, alpha: float = BOOSTLU_ALPHA) -> None:
        if not alpha > 0:
            raise ValueError(f"--boostlu must be > 0 (the published factor is {BOOSTLU_ALPHA:g}), got {alpha}")
        super().__init__(in_features, out_features)
        self.alpha = float(alpha)

    def class_activation_maps(self, feature_map: torch.Tensor) -> torch.Tensor:
        """The classifier at every position: ``(N, D, H, W)`` -> ``(N, C, H, W)`` (before BoostLU)."""
        return F.conv2d(feature_map, self.weight[:, :, None, None], self.bias)

    def forward(self, feature_map: torch.Tensor) -> torch.Tensor:
        cam = boost_lu(self.class_activation_maps(feature_map), self.alpha)
        return F.adaptive_avg_pool2d(cam, 1).flatten(1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, boostlu_alpha={self.alpha:g}"


class MultiLabelNet(nn.Module):
    """A backbone + a multi-label head: normalised ``(N, 3, H, W)`` -> logits ``(N, C)``."""

    def __init__(self, backbone: nn.Module, family: BackboneFamily, arch: str, num_classes: int,
                 head: str = "linear", head_config: LabelEmbeddingConfig | None = None,
                 boostlu: float | None = None) -> None:
        super().__init__()
        kind = HEADS[head]  # an unknown head: the one message listing them
        if boostlu is not None and head != "linear":
            raise ValueError(f"--boostlu boosts the class activation maps of the linear head; the {head!r} head "
                             "has none (it pools with per-class attention): use --head linear or drop --boostlu")
        self.backbone = backbone
        self.arch = arch
        self._family = (family,)  # a tuple: not a submodule, not in the state dict
        in_features = family.num_features(backbone)
        if (kind.on_feature_map or boostlu is not None) and family.feature_map_width(backbone) != in_features:
            what = f"--head {head}" if kind.on_feature_map else "--boostlu"
            raise ValueError(f"{arch} widens its features after pooling ({family.feature_map_width(backbone)} "
                             f"channels in the last feature map, {in_features} pooled), so {what}, which works on "
                             "the feature map, cannot stand in for its linear head: use --head linear without "
                             "--boostlu, or another backbone")
        self._num_features = int(in_features)
        self.head_kind = head
        self.head: nn.Module
        if boostlu is not None:
            self.head = BoostedCamHead(in_features, num_classes, boostlu)
        else:
            self.head = kind.build(in_features, num_classes, head_config)
        self._frozen: list[nn.Module] = []  # modules kept in eval mode by train() (see set_trainable_scope)

    @property
    def family(self) -> BackboneFamily:
        """The backbone's family (torchvision ResNets, timm)."""
        return self._family[0]

    def set_trainable_scope(self, scope: str) -> None:
        """``all``: every parameter trains; ``layer4`` and ``top``: the last stage (ResNets: with LgConv's branches)
        and the head; ``head``: the head only. Frozen parts keep their BatchNorm statistics."""
        rule = TRAINABLE_SCOPES[scope]  # an unknown scope: the one message listing them
        for p in self.parameters():
            p.requires_grad_(True)
        self._frozen = []
        in_branch = self._global_branch_modules()
        for stage in rule.frozen(self.family, self.backbone):
            for module in stage.modules():
                if rule.branches_train and id(module) in in_branch:
                    continue
                for p in module.parameters(recurse=False):
                    p.requires_grad_(False)
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    self._frozen.append(module)
        self.train(self.training)

    def freeze_batchnorm_statistics(self) -> None:
        """Keep the backbone's BatchNorm statistics fixed (``--bn-stats frozen``); after :meth:`set_trainable_scope`."""
        kept = {id(m) for m in self._frozen}
        in_branch = self._global_branch_modules()
        self._frozen += [m for m in self.backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                         and id(m) not in kept and id(m) not in in_branch]
        self.train(self.training)

    def _global_branch_modules(self) -> set[int]:
        """The ids of every module inside LgConv's global branches (new to any pretrained weights)."""
        return {id(m) for g in self.backbone.modules() if isinstance(g, GlobalBranch) for m in g.modules()}

    def train(self, mode: bool = True) -> MultiLabelNet:
        super().train(mode)
        for module in self._frozen:
            module.eval()
        return self

    @property
    def num_features(self) -> int:
        """Width of the pooled feature vector (the last feature map's channels with BoostLU and LEM)."""
        return self._num_features

    @property
    def boostlu(self) -> float | None:
        """The head's BoostLU factor, None without BoostLU."""
        return self.head.alpha if isinstance(self.head, BoostedCamHead) else None

    @property
    def head_takes_pooled_features(self) -> bool:
        """Whether the head works on pooled feature vectors (a plain linear head), not on the feature map."""
        return self.head_kind == "linear" and not isinstance(self.head, BoostedCamHead)

    def head_meta(self) -> dict[str, object]:
        """The head's description for checkpoint metadata (kind, LEM shape, BoostLU alpha)."""
        if isinstance(self.head, LabelEmbeddingHead):
            return {"kind": "lem", **self.head.config.to_dict()}
        if isinstance(self.head, BoostedCamHead):
            return {"kind": "linear", "boostlu": self.head.alpha}
        return {"kind": "linear"}

    def below_last_stage(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's input for a normalised batch (``--trainable top`` caches it)."""
        return self.family.below_last_stage(self.backbone, x)

    def from_last_stage(self, x: torch.Tensor) -> torch.Tensor:
        """The logits from the last stage's input: ``from_last_stage(below_last_stage(x)) == forward(x)`` (linear
        head)."""
        return self.head(self.family.from_last_stage(self.backbone, x))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's feature map ``(N, D, h, w)``."""
        return self.family.feature_map(self.backbone, x)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the head takes: pooled features ``(N, D)`` (linear head) or the feature map (LEM head, BoostLU)."""
        if self.head_takes_pooled_features:
            return self.family.pooled(self.backbone, x)
        return self.feature_map(x)

    def forward_embeddings(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LEM head only: (logits ``(N, C)``, per-class embeddings ``(N, C, D)``)."""
        if not isinstance(self.head, LabelEmbeddingHead):
            raise ValueError("per-class embeddings need the label-wise embedding head (--head lem)")
        emb = self.head.embeddings(self.feature_map(x))
        return self.head.classify(emb), emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def set_head_bias(self, value: float | torch.Tensor) -> None:
        """Set the head's per-class bias (a float for every class, or a ``(C,)`` tensor), e.g. at the label prior."""
        bias = self.head.class_bias if isinstance(self.head, LabelEmbeddingHead) else self.head.bias
        with torch.no_grad():
            bias.copy_(torch.as_tensor(value, dtype=bias.dtype).expand_as(bias))

    def fold_for_inference(self) -> nn.Module:
        """A copy in the exported form (BatchNorm and LgConv folded for ResNets; timm models as they are)."""
        return self.family.fold_for_inference(self)


def prior_logit(positives_per_image: float, num_classes: int) -> float:
    """``logit(k / C)``: the head bias starting every class at the label prior (clipped away from 0 and 1)."""
    p = min(max(positives_per_image / num_classes, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def input_config(arch: str) -> InputConfig:
    """The preprocessing the pretrained weights of ``arch`` expect (size, mean/std, interpolation, crop)."""
    return family_of(arch).input_config(arch)


def _resolve_weights(family: BackboneFamily, arch: str, weights: str,
                     image_size: int | None) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(state dict in network keys or None, what the weights are)."""
    name = weights.strip()
    if name.lower() == "none":
        return None, "none"
    candidate = Path(name).expanduser()
    if candidate.suffix in {".pt", ".pth", ".bin", ".safetensors", ".ckpt"} or candidate.exists():
        if not candidate.is_file():
            raise FileNotFoundError(f"weights file not found: {candidate}")
        return _file_state(family, arch, candidate), str(candidate)
    if name.lower() == "imagenet":
        state, source = family.imagenet_state(arch, image_size)
        return {BACKBONE + k: v for k, v in state.items()}, f"imagenet: {source}"
    named = family.named_weights(arch, name)
    if named is None:
        raise ValueError(f"unknown weights {name!r} for {arch}; use none, imagenet, or a weights FILE")
    return {BACKBONE + k: v for k, v in named[0].items()}, f"{name}: {named[1]}"


def _file_state(family: BackboneFamily, arch: str, path: Path) -> dict[str, torch.Tensor]:
    state = read_state(path)
    if is_lukemelas_state(state):
        if not hasattr(family, "stage_depths"):
            raise ValueError(f"{path}: an EfficientNet (lukemelas layout) state dict; it loads into timm's "
                             f"tf_efficientnet_* backbones, not into {arch}")
        try:
            state = lukemelas_to_timm(state, family.stage_depths(arch))  # type: ignore[attr-defined]
        except ValueError as exc:
            raise ValueError(f"{path}: does not fit {arch}: {exc}") from exc
    return in_network_keys(state, _classifier_prefixes(family, arch))


def _classifier_prefixes(family: BackboneFamily, arch: str) -> tuple[str, ...]:
    """Key prefixes of the library's own ImageNet classifier for ``arch`` (``fc.`` for torchvision ResNets)."""
    if family.name == "torchvision":
        return ("fc.",)
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(arch, allow_unregistered=True)
    names = cfg.classifier if cfg is not None and cfg.classifier else "classifier"
    return tuple(f"{n}." for n in ([names] if isinstance(names, str) else names))


def load_weights(model: MultiLabelNet, state: dict[str, torch.Tensor], source: str, load_head: bool = True) -> str:
    """Load ``state`` (network keys) into ``model``: every backbone tensor must fit (new LgConv branches excepted), the
    head when ``load_head`` and it fits; otherwise a ``ValueError`` listing the keys. Returns a one-line report."""
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape
              and (load_head or not k.startswith(HEAD))}
    missing = [k for k in own if k.startswith(BACKBONE) and k not in usable and ".global_branch." not in k]
    unexpected = [k for k in state if k.startswith(BACKBONE) and k not in usable]
    if missing or unexpected:
        raise ValueError(f"{source}: does not fit {model.arch} ({describe_mismatch(missing, unexpected)}); is it a "
                         "state dict of this architecture?")
    model.load_state_dict(usable, strict=False)
    head_keys = [k for k in own if k.startswith(HEAD)]
    head = "loaded" if head_keys and all(k in usable for k in head_keys) else ("new (reset)" if not load_head
                                                                                else "new")
    return f"loaded {len(usable)} tensors from {source} (head {head})"


def build_model(arch: str, num_classes: int, weights: str = "none", lgconv: bool = False,
                head: str = "linear", head_config: LabelEmbeddingConfig | None = None,
                load_head: bool = True, boostlu: float | None = None, image_size: int | None = None,
                report: list[str] | None = None) -> MultiLabelNet:
    """Build ``arch`` with a ``num_classes`` ``head`` and ``weights`` (``none``, ``imagenet``, a weight name or file);
    ``lgconv`` adds LgConv to a ResNet; ``report`` receives what was loaded."""
    if num_classes < 1:
        raise ValueError("num_classes must be >= 1")
    family = family_of(arch)
    if lgconv and not family.supports_lgconv:
        raise ValueError(f"LgConv (PU-MLC's local-global convolution) is an option of the torchvision ResNets; "
                         f"{arch} is a {family.name} backbone: drop --lgconv (use --no-lgconv)")
    state, source = _resolve_weights(family, arch, weights, image_size)
    model = MultiLabelNet(family.create(arch, image_size), family, arch, num_classes, head, head_config, boostlu)
    if lgconv:
        convert_to_lgconv(model.backbone)
    if state is not None:
        line = load_weights(model, state, source, load_head=load_head)
        if report is not None:
            report.append(line)
    return model


def model_from_meta(meta: ModelMeta) -> MultiLabelNet:
    """Rebuild the (randomly initialised) network a checkpoint's metadata describes; load weights after."""
    kind = str(meta.head.get("kind", "linear"))
    config = LabelEmbeddingConfig.from_dict(meta.head) if kind == "lem" else None
    boostlu = meta.head.get("boostlu")
    return build_model(meta.arch, len(meta.classes), weights="none", lgconv=meta.lgconv, head=kind,
                       head_config=config, boostlu=float(boostlu) if boostlu is not None else None,
                       image_size=meta.image_size)
