"""Setting a run up from its :class:`~train.config.TrainConfig`: seeds, precision, the data and its protocol, the
model, the method, and what the method may see of the labels."""

from __future__ import annotations

import math
import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.data.audit_list import load_audit
from models.data.observed_file import protocol_file_bytes, sha256_of
from models.data.protocol import ProtocolSplits, build_protocol, parse_observed, protocol_record
from models.data.registry import load_dataset
from models.data.reviewed_labels import apply_review
from models.data.types import DatasetSplits
from models.evaluation.expected_positives import ExpectedPositives, resolve_expected_positives
from models.network import MultiLabelNet, build_model, input_config, prior_logit
from models.preprocess import EvalTransform
from train.config import TrainConfig
from train.distributed import current_world
from train.methods.base import Method, MethodContext, MethodHparams, preset_for


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Autocast:
    """Autocast settings for the device."""

    dtype: torch.dtype | None  # None = no autocast
    device_type: str

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context (or a no-op)."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(amp: str, device: torch.device) -> Autocast:
    """``auto``: bf16 on CUDA GPUs that support it, fp16 on older ones, none on CPU."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return Autocast(None, device.type)
    if amp == "auto":
        return Autocast(torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16, device.type)
    return Autocast(torch.bfloat16 if amp == "bf16" else torch.float16, device.type)


def use_channels_last(setting: str, device: torch.device, arch: str) -> bool:
    """``--channels-last``: ``on``/``off``, or ``auto``: on CUDA, and on the CPU for timm backbones but not the
    torchvision ResNets (where it measured faster; bench/README.md, training throughput)."""
    if setting != "auto":
        return setting == "on"
    from models.backbones import family_of

    return device.type == "cuda" or family_of(arch).name != "torchvision"


def resolve_head(head: str, method: type[Method]) -> str:
    """The classifier head to build: ``auto`` -> the method's required head, else ``linear``; an explicit head
    that the method cannot train with is a ``ValueError``."""
    if head == "auto":
        return method.required_head or "linear"
    if method.required_head and head != method.required_head:
        raise ValueError(f"method {method.name!r} needs --head {method.required_head} (got --head {head})")
    return head


# Query2Label / LAC run at 448 px (14 x 14 = 196 tokens); the 7 x 7 floor (224 px) is a heuristic, and what was
# measured below it is in docs/methods.md (LAC, image size).
LEM_MIN_TOKENS = 49


def lem_token_warning(head: str, image_size: int) -> str | None:
    """A warning when the label-wise embedding head sees fewer than :data:`LEM_MIN_TOKENS` feature-map tokens at
    ``image_size`` (ResNets downsample by 32, rounding up); None otherwise."""
    side = math.ceil(image_size / 32)
    if head != "lem" or side * side >= LEM_MIN_TOKENS:
        return None
    return (f"warning: at {image_size} px the label-wise embedding head sees {side}x{side} = {side * side} "
            "feature-map tokens (the papers: 448 px, 196 tokens); with few positions its class queries can "
            "attend to little that differs, and at 64 px (4 tokens) the per-class embeddings came out identical. "
            "Use --image-size 224 or more for a label-wise head; a method that trains on the per-class "
            "embeddings logs class_embedding_cos, the mean cosine between one image's class embeddings "
            "(1 = identical)")


def make_run_name(cfg: TrainConfig, dataset_name: str) -> str:
    """``DATA-METHOD-ARCH-YYYYmmdd-HHMMSS``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{dataset_name}-{cfg.method}-{cfg.arch}-{stamp}"


@dataclass
class RunData:
    """The dataset, the run's protocol over it (observed labels, split) and the protocol file's bytes (the same
    on every rank)."""

    dataset: DatasetSplits
    splits: ProtocolSplits
    protocol_bytes: bytes
    review: dict[str, Any] = field(default_factory=dict)  # what --review did (models/data/reviewed_labels.py)

    @property
    def protocol_sha256(self) -> str:
        """The protocol file's sha256 (in config.json and the checkpoints)."""
        return sha256_of(self.protocol_bytes)


def load_run_data(cfg: TrainConfig) -> RunData:
    """Load ``cfg.data`` and apply the protocol (``--observed``, val split, protocol seed); say on stdout (rank 0)
    when the observed labels are read, not sampled."""
    dataset = load_dataset(cfg.data)
    splits = build_protocol(dataset, parse_observed(cfg.observed), cfg.val_fraction, cfg.protocol_seed, cfg.labels)
    splits, review = apply_review(splits, cfg.review)
    if current_world().is_main:
        if review:
            print(f"review: {review['describe']}, from {', '.join(Path(f['path']).name for f in review['files'])}")
        if cfg.observed.strip().lower() in ("single", "auto") and splits.observed.kind == "given":
            print(f"observed labels: the dataset's own {splits.observed.path} (not sampled; add ?resample to the "
                  "--data spec to sample them with --protocol-seed)")
        elif parse_observed(cfg.observed).kind == "file":
            print(f"observed labels: {splits.observed} from {cfg.observed}, protocol seed {splits.seed} "
                  f"({len(splits.train)} train / {len(splits.val)} val images)")
    return RunData(dataset, splits, protocol_file_bytes(protocol_record(splits, dataset)), review)


def grant_full_labels(method: type[Method], splits: ProtocolSplits) -> bool:
    """Whether the batches of ``method`` carry the annotated training labels: only for a method that trains on
    them (the oracle capability), and for it a ``ValueError`` when the training split has no full labels."""
    if not method.trains_on_full_labels:
        return False
    if not splits.train_labels_full:
        kind = splits.regimes["train"].kind
        advice = ("train a single-positive method instead (--method auto chooses one on your data)"
                  if kind == "single-positive" else
                  "if every training image carries ALL of its labels, declare them with --labels full; otherwise "
                  "train a method for incomplete labels (--method auto chooses one)")
        raise ValueError(f"method {method.name!r} is a reference bound that trains on the training images' full "
                         f"labels, and this run's training labels are {kind}: {advice}")
    return True


def expected_positives_for_run(method: type[Method], cfg: TrainConfig, splits: ProtocolSplits,
                               family: str) -> ExpectedPositives:
    """k, the expected number of positives per image, of every run (the methods that use it train with it; for the
    others it is reported, and the export's thresholds tag about k labels per image), from the first source that
    exists (models/evaluation/expected_positives.py): ``--hp k``, the published value of the dataset's ``family``
    (``DatasetSplits.family``, for the methods that use k), the full training (else validation) labels, the
    ``--audit`` list, the estimate ``--method auto`` made from cross-fitted scores; with none of them
    ``estimated``: the observed positives per image for the first epoch, then the estimate from the model's own
    validation scores after every epoch (:meth:`train.trainer.Trainer` updates it)."""
    given = cfg.hp.get("k")
    published = preset_for(method, family).get("k")
    full = splits.train.labels if splits.train_labels_full else (
        splits.val.labels if splits.has_full_labels("val") else None)
    audit = load_audit(cfg.audit, list(splits.classes)).labels if cfg.audit else None
    chosen = cfg.chosen.get("expected_positives") if cfg.chosen else None
    if given is None and published is None and full is None and audit is None and chosen:
        return ExpectedPositives.from_dict(chosen)  # --method auto's estimate from cross-fitted scores
    if given is None and published is None and full is None and audit is None:
        start = float((splits.train_observed == 1).sum(1).mean())
        return ExpectedPositives(start, "estimated", "from the model's validation scores after each epoch; "
                                 f"{start:.2f} (the observed positives per image) in the first")
    return resolve_expected_positives(given=None if given is None else float(given), published=published,
                                      full_labels=full, audit_labels=audit)


def build_run_model(cfg: TrainConfig, num_classes: int, head: str, device: torch.device,
                    channels_last: bool, report: list[str] | None = None) -> MultiLabelNet:
    """The network of ``cfg`` on ``device``: backbone, LgConv, head (and BoostLU), weights, SyncBatchNorm, trainable
    scope and BatchNorm statistics. ``report`` receives a line on the weights loaded (or that there were none)."""
    lines: list[str] = []
    model = build_model(cfg.arch, num_classes, cfg.weights, lgconv=bool(cfg.lgconv), head=head,
                        load_head=not cfg.reset_head, boostlu=cfg.boostlu, image_size=cfg.image_size, report=lines)
    if report is not None:
        report.extend(lines or [f"weights: {cfg.arch} from random initialisation (--weights none)"])
    if cfg.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    model.set_trainable_scope(cfg.trainable)
    if cfg.bn_stats == "frozen":
        model.freeze_batchnorm_statistics()
        if report is not None and cfg.trainable != "head":
            report.append("BatchNorm statistics: kept as the weights have them (--bn-stats frozen)")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def build_method(method: type[Method], hparams: MethodHparams, cfg: TrainConfig, splits: ProtocolSplits,
                 dataset_name: str, total_epochs: int, feature_width: int, device: torch.device,
                 expected_positives: ExpectedPositives | None,
                 pseudo_positives: np.ndarray | None = None) -> Method:
    """``method`` built for this run's training set, on ``device``: it knows the observed training labels, never
    the annotated ones, ``expected_positives`` (k, :func:`expected_positives_for_run`) when it uses it, and the
    CLIP ``pseudo_positives`` (``train.pseudo_labels``) when it trains on them."""
    ctx = MethodContext(
        num_classes=len(splits.classes),
        num_train=len(splits.train),
        train_observed=torch.from_numpy(splits.train_observed.astype(np.float32)),
        expected_positives=expected_positives.k if expected_positives is not None else float("nan"),
        epochs=total_epochs,  # epoch numbers given to on_epoch_end count every phase and stage
        dataset=dataset_name,
        batch_size=cfg.batch_size,
        feature_width=feature_width,
        linear_init_epochs=cfg.linear_init,
        pseudo_positives=None if pseudo_positives is None else torch.from_numpy(np.asarray(pseudo_positives, bool)),
    )
    return method(ctx, hparams).to(device)


def run_preprocessing(cfg: TrainConfig) -> EvalTransform:
    """The run's evaluation transform: ``cfg.image_size`` and ``cfg.crop``, with the mean, std and interpolation
    of the backbone's pretrained configuration (also for a backbone trained from scratch: one rule)."""
    config = input_config(cfg.arch)
    return EvalTransform(cfg.image_size, config.mean, config.std, config.interpolation, cfg.crop)


def prior_positives(cfg: TrainConfig, splits: ProtocolSplits, family: str,
                    expected_positives: ExpectedPositives | None) -> tuple[float, str]:
    """k for the head's prior bias, and where it came from: the run's own k when it is known (not estimated),
    else the full training (validation) labels' mean, an audit list, the published k of the dataset family, and
    finally the observed positives per training image (what single-positive data shows)."""
    if expected_positives is not None and expected_positives.source != "estimated":
        return expected_positives.k, expected_positives.source
    from train.methods import METHODS

    published = next((preset_for(m, family)["k"] for m in METHODS.values()
                      if m.uses_expected_positives and "k" in preset_for(m, family)), None)
    full = splits.train.labels if splits.train_labels_full else (
        splits.val.labels if splits.has_full_labels("val") else None)
    audit = load_audit(cfg.audit, list(splits.classes)).labels if cfg.audit else None
    if published is None and full is None and audit is None:
        return float((splits.train_observed == 1).sum(1).mean()), "observed positives per image"
    k = resolve_expected_positives(published=published, full_labels=full, audit_labels=audit)
    return k.k, k.source


def initialise_head_bias(model: MultiLabelNet, cfg: TrainConfig, report: list[str], k: float, source: str) -> str:
    """Set the new head's bias as ``cfg.head_bias`` says (``prior``: logit(k / C) for every class, ``k`` from
    :func:`prior_positives`); a head loaded from ``--weights`` keeps its own. Returns what was done."""
    if cfg.head_bias != "prior" or any("head loaded" in line for line in report):
        return "default"
    classes = model.head.class_bias.numel() if hasattr(model.head, "class_bias") else model.head.bias.numel()
    value = prior_logit(k, classes)
    model.set_head_bias(value)
    report.append(f"head bias: {value:.3f} = logit({k:.2f} / {classes}), the label prior ({source})")
    return "prior"
