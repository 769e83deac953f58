"""A training run prepared in one place, top-down: :func:`prepare_run` turns a :class:`~train.config.TrainConfig` into
the :class:`PreparedRun` the trainer fits (the building blocks are in :mod:`train.run_setup`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.data.dataset import ImageLabelDataset, SkipReporter
from models.data.observed_file import OBSERVED_FILE, sha256_of
from models.data.types import DatasetSplits
from models.evaluation.expected_positives import ExpectedPositives
from models.network import MultiLabelNet
from models.preprocess import EvalTransform, TrainTransform
from train.config import TrainConfig, resolve_model_defaults
from train.console import log
from train.distributed import World, barrier, broadcast_object, init_world, per_rank_batch
from train.epoch_loop import TrainData, build_train_data
from train.feature_cache import FeatureCache, split_feature_key
from train.fixed_features import FixedFeaturePhase, HeadOptimisation
from train.inference import DatasetForward
from train.methods import Method, get_method, make_hparams
from train.pseudo_label_stage import PseudoLabels, plan_pseudo_labels, prepare_pseudo_labels
from train.pseudo_label_stage import describe as describe_pseudo_labels
from train.run_folder_writer import RunFolderWriter
from train.run_setup import (
    Autocast,
    RunData,
    build_method,
    build_run_model,
    expected_positives_for_run,
    grant_full_labels,
    initialise_head_bias,
    lem_token_warning,
    load_run_data,
    make_run_name,
    prior_positives,
    resolve_head,
    resolve_precision,
    run_preprocessing,
    seed_everything,
    use_channels_last,
)
from train.selection import SelectionRule, resolve_criterion

__all__ = ["PreparedRun", "config_record", "feature_phase", "prepare_run"]


@dataclass
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


def prepare_run(cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False) -> PreparedRun:
    """Prepare the run of ``cfg`` in ``run_dir`` (default ``RUNS_DIR/NAME``), in the order the parts depend on each
    other: the processes and device, the data and its protocol, the run folder, the method's pseudo-labels, the
    model, k, the method, the head's bias, the loaders and the selection criterion. ``resume``: the folder exists
    and the trainer restores its state afterwards (the head keeps its trained bias)."""
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
    feature_epochs = cfg.epochs if cfg.trainable == "head" else cfg.linear_init
    end_to_end = cfg.epochs if cfg.trainable != "head" else 0  # 0: --trainable head, or a LinearInit probe
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
    views = method.extra_views(transform)
    if views and feature_epochs:
        option = "--trainable head" if cfg.trainable == "head" else "--linear-init"
        raise ValueError(f"{option} trains on cached features of one fixed view; {cfg.method} trains on extra "
                         f"augmented views ({', '.join(views)}), so it cannot use {option}")
    train_set = ImageLabelDataset(splits.train, TrainTransform.like(transform), splits.train_observed, views=views,
                                  annotated_in_items=full_labels_in_batches)
    batch_per_process = per_rank_batch(cfg.batch_size, world)
    train = build_train_data(train_set, batch_per_process, cfg.batch_size, cfg.seed, cfg.workers,
                             device.type == "cuda", predictor.reporter)
    selection = resolve_criterion(cfg.select, splits.has_full_labels("val"))
    return PreparedRun(cfg, world, device, progress, precision, channels_last, data, dataset, list(splits.classes),
                       folder, RunFolderWriter(folder, writer=world.is_main), resume, hparams, weights_report, model,
                       feature_epochs, stage_plan, total_epochs, expected, pseudo_labels, method, transform, predictor,
                       train, batch_per_process, predictor.eval_loader(splits.val), len(train.loader), selection)


def feature_phase(run: PreparedRun) -> FixedFeaturePhase:
    """The phase on fixed features of ``run`` (LinearInit's first phase, or the whole ``--trainable head`` run) with
    the features from the feature cache."""
    cfg = run.cfg
    train = run.train.dataset
    annotated = train.labels if train.annotated_in_items else None
    if cfg.trainable == "head":  # the head alone, at its rate (as the end-to-end optimiser would give it)
        optimisation = HeadOptimisation(cfg.optimizer, cfg.lr * cfg.head_lr_mult, cfg.epochs, cfg.weight_decay,
                                        cfg.momentum, cfg.scheduler)
    else:  # LinearInit: the reference's fixed Adam phase
        optimisation = HeadOptimisation("adam", cfg.linear_init_lr, cfg.linear_init)
    key = split_feature_key(cfg.arch, run.model, run.transform, str(run.precision.dtype or "float32"))
    splits = run.splits
    phase = FixedFeaturePhase(run.model, run.method, run.predictor, splits.train, splits.val, train.observed,
                              train.negatives, annotated, optimisation, cfg.batch_size, cfg.seed,
                              run.selection.criterion, splits.has_full_labels("val"), FeatureCache(), key)
    reused = sum(phase.cache_hits)
    log(f"features of {len(phase.cache_hits)} splits: {reused} from the cache, {len(phase.cache_hits) - reused} "
        f"computed and stored ({FeatureCache().folder})")
    return phase


def config_record(run: PreparedRun) -> dict[str, Any]:
    """config.json: the config as given and what it resolved to."""
    cfg, splits = run.cfg, run.splits
    return {"config": cfg.to_dict(), "resolved": {
        "world_size": run.world.size, "global_batch_size": cfg.batch_size,
        "batch_size_per_process": run.batch_per_process,
        "device": str(run.device), "amp": str(run.precision.dtype), "channels_last": run.channels_last,
        "method_hparams": run.method.hparams_dict(), "torch": torch.__version__,
        "dataset": run.dataset.name, "source": run.dataset.source, "fingerprint": splits.fingerprint,
        "splits": splits.summary(), "notes": run.dataset.notes,
        "observed_file": OBSERVED_FILE, "observed_sha256": run.data.protocol_sha256,
        "protocol_seed": splits.seed, "review": run.data.review or None,
        "labels": {split: regime.to_dict() for split, regime in splits.regimes.items()},
        "selection": {"criterion": run.selection.name, "reason": run.selection.reason},
        "expected_positives": run.expected_positives.to_dict() if run.expected_positives else None,
        "pseudo_labels": run.pseudo_labels.record() if run.pseudo_labels is not None else None,
    }}
