"""torchvision ResNets (optionally with LgConv in their 3x3 convs) with a linear multi-label head (logits out),
optionally applied per position with BoostLU (:class:`BoostedCamHead`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from torchvision import models as tvm

from models.label_embedding import LabelEmbeddingConfig, LabelEmbeddingHead
from models.lgconv import GlobalBranch, convert_to_lgconv

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta

ARCHITECTURES: dict[str, Callable[..., tvm.ResNet]] = {
    "resnet18": tvm.resnet18,
    "resnet34": tvm.resnet34,
    "resnet50": tvm.resnet50,
    "resnet101": tvm.resnet101,
}

# "imagenet" means the weights the papers used (torchvision's IMAGENET1K_V1); any other torchvision weight
# enum member name (e.g. IMAGENET1K_V2) is accepted as well.
_PAPER_WEIGHTS = "IMAGENET1K_V1"

# Which parameters train: everything, or only the last stage (LgConv global branches + layer4 + head; the stem
# and layers 1-3 frozen, their BatchNorms kept in eval mode so the frozen features really are fixed).
TRAINABLE_SCOPES = ("all", "layer4")

# Classifier heads: "linear" (global average pool + Linear, the papers' default) or "lem" (LAC's label-wise
# embedding transformer on the last feature map, models.label_embedding).
HEADS = ("linear", "lem")

BOOSTLU_ALPHA = 5.0  # Kim et al. 2023's published BoostLU factor


def boost_lu(cam: torch.Tensor, alpha: float) -> torch.Tensor:
    """BoostLU (Kim et al., CVPR 2023): positive values multiplied by ``alpha``, the others kept."""
    return torch.where(cam > 0, cam * alpha, cam)


class BoostedCamHead(nn.Linear):
    """The linear head applied at every position of the last feature map - class activation maps (CAM) -
    then BoostLU, then global average pooling: ``(N, D, H, W)`` -> logits ``(N, C)``.

    Kim et al. 2023 (``models.py`` of youngwk/BridgeGapExplanationPAMC: a 1x1 convolution with bias, BoostLU,
    ``adaptive_avg_pool2d``), in training and inference alike. It *is* an ``nn.Linear`` (the same
    ``weight``/``bias`` names and shapes), so plain linear-head weights load into it; with ``alpha = 1`` it
    computes the plain head's logits (pooling and the linear map commute)."""

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


class MultiLabelResNet(nn.Module):
    """A torchvision ResNet backbone (fc removed) + a multi-label head.

    Heads: ``linear`` (global average pool + ``Linear(features, C)``; with ``boostlu=ALPHA`` the linear map
    runs before the pooling, per position, with BoostLU in between: :class:`BoostedCamHead`) or ``lem`` (LAC's
    label-wise embedding transformer on the last feature map, :class:`~models.label_embedding.LabelEmbeddingHead`).
    ``forward(x)`` takes a normalised float batch ``(N, 3, H, W)`` and returns logits ``(N, C)``.
    """

    def __init__(self, backbone: tvm.ResNet, num_classes: int, head: str = "linear",
                 head_config: LabelEmbeddingConfig | None = None, boostlu: float | None = None) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; choose from {', '.join(HEADS)}")
        if boostlu is not None and head != "linear":
            raise ValueError(f"--boostlu boosts the class activation maps of the linear head; the {head!r} head "
                             "has none (it pools with per-class attention): use --head linear or drop --boostlu")
        in_features = backbone.fc.in_features
        backbone.fc = nn.Identity()
        self.backbone = backbone
        self._num_features = int(in_features)
        self.head_kind = head
        self.head: nn.Module
        if head == "lem":
            self.head = LabelEmbeddingHead(in_features, num_classes, head_config)
        elif boostlu is not None:
            self.head = BoostedCamHead(in_features, num_classes, boostlu)
        else:
            self.head = nn.Linear(in_features, num_classes)
        self._frozen: list[nn.Module] = []  # modules kept in eval mode by train() (see set_trainable_scope)

    @property
    def has_lgconv(self) -> bool:
        """Whether the backbone's 3x3 convolutions carry LgConv global branches."""
        return any(isinstance(m, GlobalBranch) for m in self.backbone.modules())

    def set_trainable_scope(self, scope: str) -> None:
        """``all``: every parameter trains. ``layer4``: only the LgConv global branches, layer4 and the head;
        the stem and layers 1-3 are frozen (``requires_grad=False``, BatchNorm statistics fixed)."""
        if scope not in TRAINABLE_SCOPES:
            raise ValueError(f"unknown trainable scope {scope!r}; choose from {', '.join(TRAINABLE_SCOPES)}")
        for p in self.parameters():
            p.requires_grad_(True)
        self._frozen = []
        if scope == "layer4":
            b = self.backbone
            in_branch = {id(m) for g in b.modules() if isinstance(g, GlobalBranch) for m in g.modules()}
            for stage in (b.conv1, b.bn1, b.layer1, b.layer2, b.layer3):
                for module in stage.modules():
                    if id(module) in in_branch:
                        continue
                    for p in module.parameters(recurse=False):
                        p.requires_grad_(False)
                    if isinstance(module, nn.BatchNorm2d):
                        self._frozen.append(module)
        self.train(self.training)

    def train(self, mode: bool = True) -> MultiLabelResNet:
        super().train(mode)
        for module in self._frozen:
            module.eval()
        return self

    @property
    def num_features(self) -> int:
        """Channel width of the backbone's last stage (the pooled feature vector of the linear head)."""
        return self._num_features

    @property
    def boostlu(self) -> float | None:
        """The head's BoostLU factor, None without BoostLU."""
        return self.head.alpha if isinstance(self.head, BoostedCamHead) else None

    def head_meta(self) -> dict[str, object]:
        """The head's description for checkpoint metadata: ``{"kind": ...}`` plus the LEM shape or, with
        BoostLU, ``"boostlu": alpha``."""
        if isinstance(self.head, LabelEmbeddingHead):
            return {"kind": "lem", **self.head.config.to_dict()}
        if isinstance(self.head, BoostedCamHead):
            return {"kind": "linear", "boostlu": self.head.alpha}
        return {"kind": "linear"}

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's feature map ``(N, D, H/32, W/32)``."""
        b = self.backbone
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        return b.layer4(b.layer3(b.layer2(b.layer1(x))))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the head takes: pooled features ``(N, D)`` (linear head) or the feature map (LEM head, BoostLU)."""
        if self.head_kind == "linear" and not isinstance(self.head, BoostedCamHead):
            return self.backbone(x)
        return self.feature_map(x)

    def forward_embeddings(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LEM head only: (logits ``(N, C)``, per-class embeddings ``(N, C, D)``)."""
        if not isinstance(self.head, LabelEmbeddingHead):
            raise ValueError("per-class embeddings need the label-wise embedding head (--head lem)")
        emb = self.head.embeddings(self.feature_map(x))
        return self.head.classify(emb), emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _torchvision_weights(arch: str, name: str) -> object:
    enum = tvm.get_model_weights(arch)
    key = _PAPER_WEIGHTS if name.lower() == "imagenet" else name
    try:
        return enum[key]
    except KeyError:
        valid = ", ".join(["imagenet", *enum.__members__])
        raise ValueError(f"unknown weights {name!r} for {arch}; use none, a file, or one of: {valid}") from None


def _load_weights_file(model: MultiLabelResNet, path: Path, load_head: bool = True) -> str:
    """Load backbone (and head, when ``load_head`` and its shapes match) weights from ``path``; returns a
    one-line report."""
    # weights_only=True: never unpickle arbitrary objects from a user-supplied file.
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]  # one of our own checkpoints
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(obj).__name__}")
    state = {}
    for key, value in obj.items():
        k = key.removeprefix("module.")
        if not k.startswith(("backbone.", "head.")):
            k = "head." + k[3:] if k.startswith("fc.") else "backbone." + k
        if load_head or not k.startswith("head."):
            state[k] = value
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    # LgConv global branches are new on top of a plain ResNet file: they keep their initialisation.
    missing = [k for k in own if k not in usable and ".global_branch." not in k]
    model.load_state_dict(usable, strict=False)
    skipped = len(state) - len(usable)
    head_missing = sum(k.startswith("head.") for k in missing)
    back_missing = len(missing) - head_missing
    if back_missing:
        examples = [k for k in missing if not k.startswith("head.")][:3]
        raise ValueError(
            f"{path}: {back_missing} backbone tensors missing or of the wrong shape (e.g. {examples}); "
            "is it a checkpoint of the same architecture?"
        )
    head = "loaded" if not head_missing else ("new" if load_head else "new (reset)")
    return f"loaded {len(usable)} tensors from {path} ({skipped} skipped, head {head})"


def build_model(arch: str, num_classes: int, weights: str = "none", lgconv: bool = False,
                head: str = "linear", head_config: LabelEmbeddingConfig | None = None,
                load_head: bool = True, boostlu: float | None = None) -> MultiLabelResNet:
    """Build ``arch`` (resnet18/34/50/101) with a ``num_classes`` head (``head``: linear or lem, see
    :class:`MultiLabelResNet`; ``head_config`` shapes the LEM head; ``boostlu``: the linear head's BoostLU
    factor, None = off, ``ValueError`` with the LEM head).

    ``weights``: ``none`` (random init), ``imagenet`` (torchvision IMAGENET1K_V1, downloaded by torchvision
    on first use), another torchvision weight name, or a path to a state dict / checkpoint file, whose head is
    loaded when its shapes match unless ``load_head`` is False (then the head keeps its fresh initialisation).
    ``lgconv``: wrap every 3x3 convolution with an LgConv global branch (:mod:`models.lgconv`); the original
    convolutions keep their (pretrained) weights and the branches start near zero output.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHITECTURES)}")
    if num_classes < 1:
        raise ValueError("num_classes must be >= 1")
    tv_weights = None
    path: Path | None = None
    if weights.lower() != "none":
        candidate = Path(weights).expanduser()
        if candidate.suffix in {".pt", ".pth", ".bin"} or candidate.exists():
            if not candidate.is_file():
                raise FileNotFoundError(f"weights file not found: {candidate}")
            path = candidate
        else:
            tv_weights = _torchvision_weights(arch, weights)
    model = MultiLabelResNet(ARCHITECTURES[arch](weights=tv_weights), num_classes, head, head_config, boostlu)
    if lgconv:
        convert_to_lgconv(model.backbone)
    if path is not None:
        print(_load_weights_file(model, path, load_head=load_head))
    return model


def model_from_meta(meta: ModelMeta) -> MultiLabelResNet:
    """Rebuild the (randomly initialised) network a checkpoint's metadata describes; load weights after."""
    kind = str(meta.head.get("kind", "linear"))
    config = LabelEmbeddingConfig.from_dict(meta.head) if kind == "lem" else None
    boostlu = meta.head.get("boostlu")
    return build_model(meta.arch, len(meta.classes), weights="none", lgconv=meta.lgconv, head=kind,
                       head_config=config, boostlu=float(boostlu) if boostlu is not None else None)
