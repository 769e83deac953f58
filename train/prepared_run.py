"""A training run prepared top-down: :func:`prepare_run` turns a :class:`~train.config.TrainConfig` into the
:class:`PreparedRun` the trainer fits, with its building blocks and the records a run makes of itself."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.checkpoint import ModelMeta
from models.data.audit_list import load_audit
from models.data.dataset import ImageLabelDataset, SkipReporter
from models.data.observed_file import OBSERVED_FILE, protocol_file_bytes, sha256_of
from models.data.protocol import ProtocolSplits, build_protocol, parse_observed, protocol_record
from models.data.registry import load_dataset
from models.data.reviewed_labels import apply_review
from models.data.types import DatasetSplits
from models.evaluation.expected_positives import ExpectedPositives, resolve_expected_positives
from models.network import MultiLabelNet, build_model, head_on_feature_map, input_config, prior_logit
from models.preprocess import EvalTransform, TrainTransform
from models.registry import Row, Table
from train.config import BN_STATS, HEAD_BIASES, TrainConfig, resolve_model_defaults
from train.console import log
from train.distributed import World, barrier, broadcast_object, current_world, init_world, per_rank_batch
from train.epoch import TrainData, build_train_data
from train.feature_cache import FeatureCache, split_feature_key
from train.fixed_features import FixedFeaturePhase, HeadOptimisation
from train.methods import Method, get_method, make_hparams
from train.methods.base import MethodContext, MethodHparams, preset_for
from train.pseudo_label_stage import PseudoLabels, plan_pseudo_labels, prepare_pseudo_labels
from train.pseudo_label_stage import describe as describe_pseudo_labels
from train.run_records import RunFolderWriter
from train.selection import DatasetForward, SelectionRule, resolve_criterion
from train.top_phase import TopPhase


@dataclass(kw_only=True)
class PreparedRun:
    """Everything a run trains with, as :func:`prepare_run` made it."""

    cfg: TrainConfig
    world: World
    device: torch.device
    progress: bool
    precision: Autocast
    channels_last: bool
    data: RunData
    dataset: DatasetSplits
    classes: list[str]
    run_dir: Path
    files: RunFolderWriter
    resumed: bool
    hparams: Any
    weights_report: list[str]
    model: MultiLabelNet
    feature_epochs: int  # epochs on fixed features: LinearInit's first phase, or all of them with --trainable head
    stage_plan: list[int]  # the end-to-end epochs of each training stage (one stage for most methods)
    total_epochs: int
    expected_positives: ExpectedPositives | None
    pseudo_labels: PseudoLabels | None
    method: Method
    transform: EvalTransform
    predictor: DatasetForward
    train: TrainData
    batch_per_process: int
    val_loader: Any
    steps_per_epoch: int
    selection: SelectionRule

    @property
    def splits(self) -> Any:
        """The run's protocol splits (observed labels, train / val / test)."""
        return self.data.splits

    @property
    def criterion(self) -> Any:
        """The selection criterion's function."""
        return self.selection.criterion

    def stage_of(self, epoch: int) -> int:
        """The training stage (1-based) of ``epoch``; epochs on fixed features count as stage 1."""
        end = self.feature_epochs
        for stage, epochs in enumerate(self.stage_plan, start=1):
            end += epochs
            if epoch <= end:
                return stage
        return len(self.stage_plan)

    def last_epoch_of_stage(self, stage: int) -> int:
        """The last epoch of ``stage`` (1-based)."""
        return self.feature_epochs + sum(self.stage_plan[:stage])

    def feature_phase(self) -> FixedFeaturePhase:
        """The phase on fixed features, with the features from the feature cache."""
        cfg = self.cfg
        train = self.train.dataset
        annotated = train.labels if train.annotated_in_items else None
        if cfg.fixed_features:  # the head alone, at its rate (as the end-to-end optimiser would give it)
            optimisation = HeadOptimisation(cfg.optimizer, cfg.lr * cfg.head_lr_mult, cfg.epochs, cfg.weight_decay,
                                            cfg.momentum, cfg.scheduler)
        else:  # LinearInit: the reference's fixed Adam phase
            optimisation = HeadOptimisation("adam", cfg.linear_init_lr, cfg.linear_init)
        key = split_feature_key(cfg.arch, self.model, self.transform, str(self.precision.dtype or "float32"))
        splits = self.splits
        phase = FixedFeaturePhase(self.model, self.method, self.predictor, splits.train, splits.val, train.observed,
                                  train.negatives, annotated, optimisation, cfg.batch_size, cfg.seed,
                                  self.selection.criterion, splits.has_full_labels("val"), FeatureCache(), key)
        reused = sum(phase.cache_hits)
        log(f"features of {len(phase.cache_hits)} splits: {reused} from the cache, {len(phase.cache_hits) - reused} "
            f"computed and stored ({FeatureCache().folder})")
        return phase

    def top_phase(self) -> TopPhase:
        """``--trainable top``'s phase: the last stage and the head on cached last-stage inputs."""
        cfg, splits, train = self.cfg, self.splits, self.train.dataset
        optimisation = HeadOptimisation(cfg.optimizer, cfg.lr, sum(self.stage_plan), cfg.weight_decay, cfg.momentum,
                                        cfg.scheduler)
        key = split_feature_key(cfg.arch, self.model, self.transform, str(self.precision.dtype or "float32"))
        phase = TopPhase(self.model, self.method, self.predictor, splits.train, splits.val, train.observed,
                         train.negatives, train.labels if train.annotated_in_items else None, optimisation,
                         cfg.batch_size, cfg.seed, self.selection.criterion, splits.has_full_labels("val"),
                         FeatureCache(), key, cfg.head_lr_mult)
        reused = sum(phase.cache_hits)
        log(f"last-stage inputs of {len(phase.cache_hits)} splits (training ones also flipped): {reused} from the "
            f"cache, {len(phase.cache_hits) - reused} computed and stored ({FeatureCache().folder})")
        return phase

    def config_record(self) -> dict[str, Any]:
        """config.json: the config as given and what it resolved to."""
        cfg, splits = self.cfg, self.splits
        return {"config": cfg.to_dict(), "resolved": {
            "world_size": self.world.size, "global_batch_size": cfg.batch_size,
            "batch_size_per_process": self.batch_per_process,
            "device": str(self.device), "amp": str(self.precision.dtype), "channels_last": self.channels_last,
            "method_hparams": self.method.hparams_dict(), "torch": torch.__version__,
            "dataset": self.dataset.name, "source": self.dataset.source, "fingerprint": splits.fingerprint,
            "splits": splits.summary(), "notes": self.dataset.notes,
            "observed_file": OBSERVED_FILE, "observed_sha256": self.data.protocol_sha256,
            "protocol_seed": splits.seed, "review": self.data.review or None,
            "labels": {split: regime.to_dict() for split, regime in splits.regimes.items()},
            "selection": {"criterion": self.selection.name, "reason": self.selection.reason},
            "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None,
            "pseudo_labels": self.pseudo_labels.record() if self.pseudo_labels is not None else None,
        }}

    def checkpoint_meta(self, epoch: int, metrics: dict[str, Any]) -> ModelMeta:
        """The metadata of a checkpoint at ``epoch``: the model, data, protocol, regimes, criterion and k."""
        cfg, splits, dataset = self.cfg, self.splits, self.dataset
        transform = run_preprocessing(cfg)
        k = self.expected_positives
        return ModelMeta(
            classes=list(splits.classes), arch=cfg.arch, image_size=cfg.image_size, lgconv=bool(cfg.lgconv),
            mean=transform.mean, std=transform.std, interpolation=transform.interpolation,  # type: ignore[arg-type]
            crop=transform.crop, weights=cfg.weights,
            head=self.model.head_meta(), method=cfg.method, method_hparams=self.method.hparams_dict(),
            data={
                "name": dataset.name, "source": dataset.source, "fingerprint": splits.fingerprint,
                # the --observed value (export rebuilds the split from it), and the labels it gave
                "observed": cfg.observed, "observed_labels": str(splits.observed),
                "protocol_seed": cfg.protocol_seed,
                "val_fraction": cfg.val_fraction, "num_train": len(splits.train), "num_val": len(splits.val),
                "observed_file": OBSERVED_FILE, "observed_sha256": self.data.protocol_sha256,
                "labels": cfg.labels, "review": list(cfg.review),  # export applies the answers to val again
                "label_regimes": {split: regime.kind for split, regime in splits.regimes.items()},
                "selection": self.selection.name, "expected_positives": k.to_dict() if k else None,
                "k_estimate": cfg.chosen.get("expected_positives") if cfg.chosen else None},
            metrics=metrics, epoch=epoch)


def prepare_run(cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False) -> PreparedRun:
    """Prepare the run of ``cfg`` in ``run_dir`` (default ``RUNS_DIR/NAME``); ``resume``: the folder exists and the
    trainer restores its state afterwards."""
    cfg = resolve_model_defaults(cfg)  # "auto" settings of a config made in code (the CLI resolves them)
    world, device = init_world(cfg.device, cfg.sync_bn)
    precision = resolve_precision(cfg.amp, device)
    channels_last = use_channels_last(cfg.channels_last, device, cfg.arch)
    seed_everything(cfg.seed)

    # the data, its protocol and the labels the method may see
    data = load_run_data(cfg)
    splits, dataset = data.splits, data.dataset
    method_cls = get_method(cfg.method)
    full_labels_in_batches = grant_full_labels(method_cls, splits)  # an oracle on data without: refused
    hparams = make_hparams(method_cls, cfg.hp, dataset.family)

    # the run folder (one timestamp for all ranks); CLIP that cannot be had stops the run before it is made
    name = broadcast_object(cfg.name or make_run_name(cfg, dataset.name))
    folder = Path(run_dir) if run_dir else Path(cfg.runs_dir) / name
    if not resume and folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"run folder {folder} already exists and is not empty; pick another --name")
    saved = folder / OBSERVED_FILE
    if resume and cfg.review and saved.is_file() and sha256_of(saved.read_bytes()) != data.protocol_sha256:
        raise ValueError(f"the answers of --review {', '.join(cfg.review)} changed since {folder} started, so its "
                         "labels would change mid-run; start a new run (python -m train --from-run "
                         f"{folder} --name NEW) instead of resuming this one")
    pseudo_plan = None
    if method_cls.uses_pseudo_labels:
        pseudo_plan = plan_pseudo_labels(method_cls, hparams, cfg, folder, resume)
    elif cfg.clip or cfg.clip_prompt or cfg.pseudo_labels:
        log(f"note: --clip, --clip-prompt and --pseudo-labels are ignored: {cfg.method} trains on no pseudo-labels")
    barrier()  # every rank has checked the folder before rank 0 writes into it
    if world.is_main:
        folder.mkdir(parents=True, exist_ok=True)

    # the model, the epochs of each phase and stage, k, the pseudo-labels and the method
    head = resolve_head(cfg.head, method_cls)
    warning = lem_token_warning(head, cfg.image_size)
    if warning:
        log(warning)
    weights_report: list[str] = []
    model = build_run_model(cfg, len(splits.classes), head, device, channels_last, weights_report)
    feature_epochs = cfg.epochs if cfg.fixed_features else cfg.linear_init
    end_to_end = cfg.epochs if not cfg.fixed_features else 0  # 0: --trainable head, or a LinearInit probe
    stage_plan = method_cls.stage_epochs(hparams, end_to_end) if end_to_end else [0]
    total_epochs = feature_epochs + sum(stage_plan)
    expected = expected_positives_for_run(method_cls, cfg, splits, dataset.family)
    pseudo_labels = None
    if pseudo_plan is not None:  # read, reused or computed with CLIP (train.pseudo_labels)
        pseudo_labels = prepare_pseudo_labels(pseudo_plan, splits, dataset, cfg, folder, device)
        for line in describe_pseudo_labels(pseudo_labels):
            log(line)
    method = build_method(method_cls, hparams, cfg, splits, dataset.name, total_epochs, model.num_features, device,
                          expected, pseudo_labels.positives if pseudo_labels is not None else None)
    if not resume:
        k, source = prior_positives(cfg, splits, dataset.family, expected)
        initialise_head_bias(model, cfg, weights_report, k, source)

    # preprocessing, loaders and the selection criterion
    transform = run_preprocessing(cfg)
    progress = cfg.progress and world.is_main
    predictor = DatasetForward(transform, device, precision.autocast, channels_last, SkipReporter(),
                               cfg.eval_batch_size, cfg.workers, progress)
    if cfg.cached_top and world.distributed:
        raise ValueError("--trainable top trains in one process (its epochs on cached inputs take seconds); run it "
                         "without torchrun")
    views = method.extra_views(transform)
    if views and (feature_epochs or cfg.cached_top):
        option = "--trainable head" if cfg.fixed_features else "--trainable top" if cfg.cached_top else "--linear-init"
        raise ValueError(f"{option} trains on cached features of one fixed view; {cfg.method} trains on extra "
                         f"augmented views ({', '.join(views)}), so it cannot use {option}")
    train_transform = TrainTransform.like(transform)
    train_transform.min_area = cfg.train_crop
    train_set = ImageLabelDataset(splits.train, train_transform, splits.train_observed, views=views,
                                  annotated_in_items=full_labels_in_batches)
    batch_per_process = per_rank_batch(cfg.batch_size, world)
    train = build_train_data(train_set, batch_per_process, cfg.batch_size, cfg.seed, cfg.workers,
                             device.type == "cuda", predictor.reporter)
    selection = resolve_criterion(cfg.select, splits.has_full_labels("val"))
    return PreparedRun(
        cfg=cfg, world=world, device=device, progress=progress, precision=precision, channels_last=channels_last,
        data=data, dataset=dataset, classes=list(splits.classes), run_dir=folder,
        files=RunFolderWriter(folder, writer=world.is_main), resumed=resume, hparams=hparams,
        weights_report=weights_report, model=model, feature_epochs=feature_epochs, stage_plan=stage_plan,
        total_epochs=total_epochs, expected_positives=expected, pseudo_labels=pseudo_labels, method=method,
        transform=transform, predictor=predictor, train=train, batch_per_process=batch_per_process,
        val_loader=predictor.eval_loader(splits.val), steps_per_epoch=len(train.loader), selection=selection)


# ----------------------------------------------------------------- the building blocks

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


def _auto_precision(device: torch.device) -> torch.dtype | None:
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


#: ``--amp``: name, help, the autocast dtype it gives on a device (None: no autocast).
AMP_MODES: Table[Callable[[torch.device], torch.dtype | None]] = Table("--amp mode", [
    Row("auto", "bf16 on CUDA GPUs that support it, else fp16, and none on the CPU", _auto_precision),
    Row("off", "float32 throughout", lambda device: None),
    Row("bf16", "bfloat16 autocast", lambda device: torch.bfloat16),
    Row("fp16", "float16 autocast with a gradient scaler", lambda device: torch.float16),
])


def resolve_precision(amp: str, device: torch.device) -> Autocast:
    """The autocast of ``--amp`` ``amp`` (a row of :data:`AMP_MODES`) on ``device``."""
    return Autocast(AMP_MODES[amp](device), device.type)


def _auto_channels_last(device: torch.device, arch: str) -> bool:
    from models.backbones import family_of

    return device.type == "cuda" or family_of(arch).name != "torchvision"


#: ``--channels-last``: name, help, whether it is on for a device and an architecture.
CHANNELS_LAST_MODES: Table[Callable[[torch.device, str], bool]] = Table("--channels-last mode", [
    Row("auto", "on for CUDA, and on the CPU for timm backbones but not the torchvision ResNets (where it measured "
        "faster: bench/README.md, training throughput)", _auto_channels_last),
    Row("on", "always", lambda device, arch: True),
    Row("off", "never", lambda device, arch: False),
])


def use_channels_last(setting: str, device: torch.device, arch: str) -> bool:
    """Whether the run uses the channels-last layout (``setting``: :data:`CHANNELS_LAST_MODES`)."""
    return CHANNELS_LAST_MODES[setting](device, arch)


def resolve_head(head: str, method: type[Method]) -> str:
    """The head to build: ``auto`` -> the method's, else ``linear``; ``ValueError`` when the method cannot."""
    if head == "auto":
        return method.required_head or "linear"
    if method.required_head and head != method.required_head:
        raise ValueError(f"method {method.name!r} needs --head {method.required_head} (got --head {head})")
    return head


# Query2Label / LAC run at 448 px (14 x 14 = 196 tokens); the 7 x 7 floor (224 px) is a heuristic, and what was
# measured below it is in docs/methods.md (LAC, image size).
LEM_MIN_TOKENS = 49


def lem_token_warning(head: str, image_size: int) -> str | None:
    """A warning when the lem head sees under :data:`LEM_MIN_TOKENS` tokens at ``image_size``; else None."""
    side = math.ceil(image_size / 32)
    if not head_on_feature_map(head) or side * side >= LEM_MIN_TOKENS:
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
    """The dataset, the run's protocol over it and the protocol file's bytes."""

    dataset: DatasetSplits
    splits: ProtocolSplits
    protocol_bytes: bytes
    review: dict[str, Any] = field(default_factory=dict)  # what --review did (models/data/reviewed_labels.py)

    @property
    def protocol_sha256(self) -> str:
        """The protocol file's sha256 (in config.json and the checkpoints)."""
        return sha256_of(self.protocol_bytes)


def load_run_data(cfg: TrainConfig) -> RunData:
    """Load ``cfg.data`` and apply the protocol; say so when the observed labels are read, not sampled."""
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
    """Whether ``method`` gets the annotated labels (oracles only; ``ValueError`` when there are none)."""
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
    """k, the expected positives per image, from the first source that exists: ``--hp k``, the family's published value,
    full labels, the audit list, ``--method auto``'s estimate; else ``estimated`` (the trainer updates it each
    epoch)."""
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
    """The network of ``cfg`` on ``device``; ``report`` receives a line on the weights loaded."""
    lines: list[str] = []
    model = build_model(cfg.arch, num_classes, cfg.weights, lgconv=bool(cfg.lgconv), head=head,
                        load_head=not cfg.reset_head, boostlu=cfg.boostlu, image_size=cfg.image_size, report=lines)
    if report is not None:
        report.extend(lines or [f"weights: {cfg.arch} from random initialisation (--weights none)"])
    if cfg.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    model.set_trainable_scope(cfg.trainable)
    if BN_STATS[cfg.bn_stats]:
        model.freeze_batchnorm_statistics()
        if report is not None and not cfg.fixed_features:
            report.append("BatchNorm statistics: kept as the weights have them (--bn-stats frozen)")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def build_method(method: type[Method], hparams: MethodHparams, cfg: TrainConfig, splits: ProtocolSplits,
                 dataset_name: str, total_epochs: int, feature_width: int, device: torch.device,
                 expected_positives: ExpectedPositives | None,
                 pseudo_positives: np.ndarray | None = None) -> Method:
    """``method`` built for this run's training set on ``device``, with the observed labels (never the annotated ones),
    k and the CLIP pseudo-positives when it uses them."""
    ctx = MethodContext(
        num_classes=len(splits.classes), num_train=len(splits.train), dataset=dataset_name, batch_size=cfg.batch_size,
        train_observed=torch.from_numpy(splits.train_observed.astype(np.float32)),
        expected_positives=expected_positives.k if expected_positives is not None else float("nan"),
        epochs=total_epochs,  # epoch numbers given to on_epoch_end count every phase and stage
        feature_width=feature_width, linear_init_epochs=cfg.linear_init,
        pseudo_positives=None if pseudo_positives is None else torch.from_numpy(np.asarray(pseudo_positives, bool)))
    return method(ctx, hparams).to(device)


def run_preprocessing(cfg: TrainConfig) -> EvalTransform:
    """The run's evaluation transform, with the backbone's pretrained mean, std and interpolation."""
    config = input_config(cfg.arch)
    return EvalTransform(cfg.image_size, config.mean, config.std, config.interpolation, cfg.crop)


def prior_positives(cfg: TrainConfig, splits: ProtocolSplits, family: str,
                    expected_positives: ExpectedPositives | None) -> tuple[float, str]:
    """k for the head's prior bias and its source: the run's known k, else labels, audit, published k, observed
    positives."""
    if expected_positives is not None and expected_positives.known:
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
    """Set the new head's bias as ``cfg.head_bias`` says (a loaded head keeps its own); returns what was done."""
    if not HEAD_BIASES[cfg.head_bias] or any("head loaded" in line for line in report):
        return "default"
    classes = model.head.class_bias.numel() if hasattr(model.head, "class_bias") else model.head.bias.numel()
    value = prior_logit(k, classes)
    model.set_head_bias(value)
    report.append(f"head bias: {value:.3f} = logit({k:.2f} / {classes}), the label prior ({source})")
    return "prior"
