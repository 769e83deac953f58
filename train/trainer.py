"""The training run: set up from a config, then epoch after epoch - train, evaluate and select, checkpoint - through
the LinearInit phase and the method's stages, and finally test the selected weights.

The parts live in their own modules: set-up (``train.run_setup``), the step loop (``train.epoch_loop``), one
stage's optimisation (``train.stage_optimisation``), evaluation and selection (``train.selection``), what the
checkpoints hold (``train.checkpoint_contents``), the run folder's files (``train.run_folder_writer``), the phase
on fixed features (LinearInit and ``--trainable head``, ``train.fixed_features``) and the full-label diagnostics
(``train.diagnostics``).
:class:`Trainer` holds them together and decides what happens when.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from models.checkpoint import ModelMeta, save_checkpoint
from models.files.atomic_writes import atomic_path
from models.files.run_folder import BEST, LAST
from models.network import model_from_meta
from models.preprocess import TrainTransform
from train.checkpoint_contents import capture_rng, load_shared, restore_rng, run_meta
from train.config import TrainConfig, resolve_model_defaults
from train.data.dataset import ImageLabelDataset, SkipReporter
from train.data.label_regime import describe_regimes
from train.data.observed_file import OBSERVED_FILE
from train.data.types import LabelledImages
from train.diagnostics import score_label_estimates
from train.distributed import barrier, broadcast_buffers, broadcast_object, init_world, per_rank_batch
from train.epoch_loop import build_train_data, train_epoch
from train.expected_positives import CHOOSER_K, ExpectedPositives, estimate_k
from train.feature_cache import FeatureCache, feature_key, weights_digest
from train.fixed_features import FixedFeaturePhase, HeadOptimisation
from train.inference import DatasetForward, Rows
from train.methods import EpochEndContext, LossOutput, get_method, make_hparams
from train.pseudo_labels.stage import PseudoLabelPlan, PseudoLabels, plan_pseudo_labels, prepare_pseudo_labels
from train.pseudo_labels.stage import describe as describe_pseudo_labels
from train.run_folder_writer import RunFolderWriter
from train.run_setup import (
    build_method,
    build_run_model,
    expected_positives_for_run,
    grant_full_labels,
    initialise_head_bias,
    lem_token_warning,
    load_run_data,
    log,
    make_run_name,
    prior_positives,
    resolve_head,
    resolve_precision,
    run_preprocessing,
    seed_everything,
    use_channels_last,
)
from train.selection import Assessment, BestSoFar, Candidate, assess, figure, pick, resolve_criterion
from train.stage_optimisation import Optimisation
from train.training_step import run_training_step, wrap_training_step


def held_out_line(metrics: dict[str, Any], logits: np.ndarray | None, num_classes: int) -> str:
    """The end-of-run figures of a split with full labels, each saying what it is: mAP (over the classes that have
    a positive there, when some have none) and OF1 / CF1 at the uncalibrated threshold 0.5 with the tags per image
    it gives (the exported model calibrates per-class thresholds instead)."""
    text = f"mAP {figure(metrics['mAP'])}"
    missing = int(metrics.get("classes_without_positives") or 0)
    if missing and metrics.get("mAP") is not None:
        text += f" (over the {num_classes - missing} of {num_classes} classes with a positive)"
    if metrics.get("OF1") is None:
        return text
    tags = "" if logits is None else f", {float((np.asarray(logits) >= 0).sum(1).mean()):.2f} tags per image"
    return (text + f"  OF1 {figure(metrics['OF1'])}  CF1 {figure(metrics['CF1'])} at threshold 0.5{tags} "
            "(python -m export calibrates per-class thresholds)")


class Trainer:
    """Builds everything from a :class:`TrainConfig` and runs (or resumes) training in ``run_dir``."""

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False) -> None:
        cfg = resolve_model_defaults(cfg)  # "auto" settings of a config made in code (the CLI resolves them)
        self.cfg = cfg
        self.world, self.device = init_world(cfg.device, cfg.sync_bn)
        self.progress = cfg.progress and self.world.is_main
        self.precision = resolve_precision(cfg.amp, self.device)
        self.channels_last = use_channels_last(cfg.channels_last, self.device, cfg.arch)
        seed_everything(cfg.seed)

        self.data = load_run_data(cfg)
        self.dataset, self.splits, self.classes = self.data.dataset, self.data.splits, self.data.splits.classes
        method_cls = get_method(cfg.method)
        full_labels_in_batches = grant_full_labels(method_cls, self.splits)  # an oracle on data without: refused
        name = broadcast_object(cfg.name or make_run_name(cfg, self.dataset.name))  # one timestamp for all ranks
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.runs_dir) / name
        if not resume and self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise FileExistsError(f"run folder {self.run_dir} already exists and is not empty; pick another --name")
        self.hparams = make_hparams(method_cls, cfg.hp, self.dataset.family)
        # where CLIP's pseudo-labels come from; a CLIP that cannot be had stops the run here, before anything trains
        self.pseudo_plan: PseudoLabelPlan | None = None
        if method_cls.uses_pseudo_labels:
            self.pseudo_plan = plan_pseudo_labels(method_cls, self.hparams, cfg, self.run_dir, resume,
                                                  self.splits.train_observed)
        elif cfg.clip or cfg.clip_prompt or cfg.pseudo_labels:
            log(f"note: --clip, --clip-prompt and --pseudo-labels are ignored: {cfg.method} trains on no pseudo-labels")
        barrier()  # every rank has checked the folder before rank 0 writes into it
        if self.world.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.files = RunFolderWriter(self.run_dir, writer=self.world.is_main)
        self.resumed = resume

        head = resolve_head(cfg.head, method_cls)
        warning = lem_token_warning(head, cfg.image_size)
        if warning:
            log(warning)
        self.weights_report: list[str] = []
        self.model = build_run_model(cfg, len(self.classes), head, self.device, self.channels_last,
                                     self.weights_report)
        # Epochs on fixed backbone features: LinearInit's first phase, or every epoch with --trainable head.
        self.feature_epochs = cfg.epochs if cfg.trainable == "head" else cfg.linear_init
        # Training stages (one for most methods): each starts from the previous stage's best weights.
        # --epochs 0 (only with --linear-init) and --trainable head: no end-to-end stage at all
        end_to_end = cfg.epochs if cfg.trainable != "head" else 0
        self.stage_plan = method_cls.stage_epochs(self.hparams, end_to_end) if end_to_end else [0]
        self.total_epochs = self.feature_epochs + sum(self.stage_plan)
        self.expected_positives = expected_positives_for_run(method_cls, cfg, self.splits, self.dataset.family)
        self.pseudo_labels: PseudoLabels | None = None
        if self.pseudo_plan is not None:  # read, reused or computed with CLIP (train.pseudo_labels)
            self.pseudo_labels = prepare_pseudo_labels(self.pseudo_plan, self.splits, self.dataset, cfg,
                                                       self.run_dir, self.device)
            for line in describe_pseudo_labels(self.pseudo_labels):
                log(line)
        self.method = build_method(method_cls, self.hparams, cfg, self.splits, self.dataset.name, self.total_epochs,
                                   self.model.num_features, self.device, self.expected_positives,
                                   self.pseudo_labels.positives if self.pseudo_labels is not None else None)
        if not resume:
            k, source = prior_positives(cfg, self.splits, self.dataset.family, self.expected_positives)
            initialise_head_bias(self.model, cfg, self.weights_report, k, source)

        self.transform = run_preprocessing(cfg)
        self.predictor = DatasetForward(self.transform, self.device, self.precision.autocast, self.channels_last,
                                   SkipReporter(), cfg.eval_batch_size, cfg.workers, self.progress)
        views = self.method.extra_views(self.transform)
        if views and self.feature_epochs:
            option = "--trainable head" if cfg.trainable == "head" else "--linear-init"
            raise ValueError(f"{option} trains on cached features of one fixed view; {cfg.method} trains on extra "
                             f"augmented views ({', '.join(views)}), so it cannot use {option}")
        train_set = ImageLabelDataset(self.splits.train, TrainTransform.like(self.transform),
                                      self.splits.train_observed, views=views,
                                      annotated_in_items=full_labels_in_batches)
        self.batch_per_process = per_rank_batch(cfg.batch_size, self.world)
        self.train = build_train_data(train_set, self.batch_per_process, cfg.batch_size, cfg.seed, cfg.workers,
                                      self.device.type == "cuda", self.predictor.reporter)
        self.val_loader = self.predictor.eval_loader(self.splits.val)
        self.steps_per_epoch = len(self.train.loader)
        self.selection = resolve_criterion(cfg.select, self.splits.has_full_labels("val"))
        self.criterion = self.selection.criterion

        self._fresh_optimisation(stage=1)
        self.start_epoch = 1
        self.last_epoch: int | None = None  # the last epoch trained by this process
        self.best = BestSoFar()
        self.stage_history: list[dict[str, Any]] = []  # best epoch and val mAP of each finished stage
        self.linear: FixedFeaturePhase | None = None
        self._linear_resume: dict[str, Any] | None = None
        if resume:
            self._load_resume_state()

    # ----------------------------------------------------------------- stages and phases
    @property
    def ema(self) -> AveragedModel | None:
        """The current stage's EMA of the weights (None without ``--ema``)."""
        return self.optimisation.ema

    def _fresh_optimisation(self, stage: int) -> None:
        """A new optimiser, schedule (over ``stage``'s epochs), grad scaler and EMA; the step module (DDP under
        torchrun) is rebuilt at the next step, as the stage may train another set of parameters."""
        self.step_module: nn.Module | None = None  # the old DDP wrapper goes first: one reducer per parameter
        self.optimisation = Optimisation(self.cfg, self.model, self.method,
                                         self.stage_plan[stage - 1] * self.steps_per_epoch, self.precision.dtype,
                                         self.device)

    def stage_of(self, epoch: int) -> int:
        """The training stage (1-based) of ``epoch``; epochs on fixed features count as stage 1."""
        end = self.feature_epochs
        for stage, epochs in enumerate(self.stage_plan, start=1):
            end += epochs
            if epoch <= end:
                return stage
        return len(self.stage_plan)

    def _last_epoch_of_stage(self, stage: int) -> int:
        return self.feature_epochs + sum(self.stage_plan[:stage])

    def _feature_phase(self) -> FixedFeaturePhase:
        """The phase on fixed features (LinearInit's first phase, or the whole --trainable head run) on this run's
        model, method and data, with the features from the feature cache."""
        cfg = self.cfg
        annotated = self.train.dataset.labels if self.train.dataset.annotated_in_items else None
        if cfg.trainable == "head":  # the head alone, at its rate (as the end-to-end optimiser would give it)
            optimisation = HeadOptimisation(cfg.optimizer, cfg.lr * cfg.head_lr_mult, cfg.epochs, cfg.weight_decay,
                                            cfg.momentum, cfg.scheduler)
        else:  # LinearInit: the reference's fixed Adam phase
            optimisation = HeadOptimisation("adam", cfg.linear_init_lr, cfg.linear_init)
        backbone = weights_digest(self.model.backbone)
        preprocessing = {"image_size": self.transform.image_size, "mean": list(self.transform.mean),
                         "std": list(self.transform.std), "interpolation": self.transform.interpolation,
                         "crop": self.transform.crop}
        precision = str(self.precision.dtype or "float32")

        def key(images: LabelledImages) -> dict[str, Any]:
            return feature_key(list(images.paths), cfg.arch, backbone, preprocessing, precision)

        phase = FixedFeaturePhase(self.model, self.method, self.predictor, self.splits.train, self.splits.val,
                                  self.train.dataset.observed, self.train.dataset.negatives, annotated, optimisation,
                                  cfg.batch_size, cfg.seed, self.criterion, self.splits.has_full_labels("val"),
                                  FeatureCache(), key)
        reused = sum(phase.cache_hits)
        log(f"features of {len(phase.cache_hits)} splits: {reused} from the cache, {len(phase.cache_hits) - reused} "
            f"computed and stored ({FeatureCache().folder})")
        return phase

    def _next_stage(self, stage: int) -> None:
        """End the current stage: keep its best checkpoint as ``best-stageK.pt``, load its best weights, then start
        ``stage`` with a fresh optimiser, schedule and EMA and its own best-epoch selection."""
        finished = stage - 1
        best_path = self.run_dir / BEST
        if self.world.is_main:
            with atomic_path(self.run_dir / f"best-stage{finished}.pt") as tmp:
                shutil.copyfile(best_path, tmp)
        best = load_shared(best_path, self.device)
        self.model.load_state_dict(best.model)
        self.stage_history.append({"stage": finished, "best_epoch": self.best.epoch,
                                   f"val_{self.selection.name}": self.best.score,
                                   "weights": best.meta.metrics.get("weights", "model")})
        log(f"stage {finished} done (best val {self.selection.name} {self.best.score:.4g} at epoch {self.best.epoch}); "
            f"stage {stage} starts from those weights")
        self.method.start_stage(stage)
        self._fresh_optimisation(stage)
        self.best.reset()

    # ----------------------------------------------------------------- checkpoints
    def meta(self, epoch: int, metrics: dict[str, Any]) -> ModelMeta:
        """The checkpoint metadata for the current model: what it is, the run's data and protocol, its label regimes,
        selection criterion and k."""
        meta = run_meta(self.cfg, self.model, self.method, self.dataset, self.splits, self.data.protocol_sha256,
                        epoch, metrics)
        meta.data.update({
            "labels": self.cfg.labels,
            "label_regimes": {split: regime.kind for split, regime in self.splits.regimes.items()},
            "selection": self.selection.name,
            "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None,
            "k_estimate": self.cfg.chosen.get("expected_positives") if self.cfg.chosen else None,
        })
        return meta

    def save_last(self, epoch: int) -> None:
        """Write last.pt with everything ``--resume`` needs (rank 0; the state is the same on every rank)."""
        if not self.world.is_main:
            return
        training = {"epoch": epoch, **self.best.state_dict(), **self.optimisation.state_dict(),
                    "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None,
                    "method": self.method.state_dict(), "rng": capture_rng(), "stage_history": self.stage_history}
        if self.linear is not None:
            training["linear"] = self.linear.state_dict()
        save_checkpoint(self.run_dir / LAST, self.model.state_dict(), self.meta(epoch, {}), training)

    def _load_resume_state(self) -> None:
        path = self.run_dir / LAST
        ckpt = load_shared(path, self.device)
        if ckpt.training is None:
            raise ValueError(f"{path} holds no training state; cannot resume")
        if ckpt.meta.data.get("fingerprint") != self.splits.fingerprint:
            raise ValueError(f"{path}: the dataset changed since this run started (fingerprint "
                             f"{ckpt.meta.data.get('fingerprint')} != {self.splits.fingerprint})")
        t = ckpt.training
        self.start_epoch = int(t["epoch"]) + 1
        stage = self.stage_of(min(self.start_epoch, self.total_epochs))
        if stage > 1:  # the saved optimiser, schedule and EMA belong to a later stage
            self._fresh_optimisation(stage)
        self.stage_history = list(t.get("stage_history", []))
        self.model.load_state_dict(ckpt.model)
        self.method.load_state_dict(t["method"])
        self.optimisation.load_state_dict(t)
        restore_rng(t["rng"])
        self._linear_resume = t.get("linear")
        self.best.load_state_dict(t)
        if t.get("expected_positives") and self.expected_positives is not None:  # an estimate made before the stop
            k = t["expected_positives"]
            self._set_expected_positives(ExpectedPositives(float(k["k"]), k["source"], k.get("detail", "")))
        barrier()  # every rank has read last.pt
        self.files.keep_metrics_before(self.start_epoch)  # those epochs run again
        log(f"resuming {self.run_dir} at epoch {self.start_epoch}/{self.total_epochs} "
            f"(best {self.selection.name} so far {self.best.score:.4g} at epoch {self.best.epoch})")

    # ----------------------------------------------------------------- training
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        if self.channels_last:
            for key in out:
                if key.startswith("images"):
                    out[key] = out[key].contiguous(memory_format=torch.channels_last)
        return out

    def train_step(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Forward, backward, clip, optimiser/scheduler/EMA step on one batch already on the device. The forward
        is the method's step (:mod:`train.training_step`), in ``DistributedDataParallel`` under torchrun. A
        non-finite loss is not checked here (that would wait for the device): the epoch loop does, every few
        steps."""
        if self.step_module is None:  # built on first use: LinearInit's wrapper is gone by then
            self.step_module = wrap_training_step(self.model, self.method, self.device)
        with self.precision.autocast():
            out = run_training_step(self.step_module, batch)
        self.optimisation.update(out.loss)
        return out

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One end-to-end pass over the training set; returns mean loss, method logs, throughput and lr."""
        self.model.train()
        stats = train_epoch(self.train, epoch, self.train_step, self._to_device, f"epoch {epoch}/{self.total_epochs}",
                            self.progress)
        self._share_rank0_buffers()
        stats["lr"] = self.optimisation.lr
        return stats

    def _share_rank0_buffers(self) -> None:
        """Under torchrun: rank 0's BatchNorm running statistics (model and EMA) on every rank. DDP broadcasts
        them at the start of each forward, so after an epoch's last step the other ranks still hold their own;
        the sharded evaluation, EMA selection and checkpoints need the one set rank 0 keeps."""
        broadcast_buffers(self.model)
        if self.ema is not None:
            broadcast_buffers(self.ema)

    def _diagnostics(self) -> dict[str, float]:
        """The method's label estimates scored against the full training labels (rank 0, only where they exist)."""
        if not (self.world.is_main and self.splits.train_has_full_labels):
            return {}
        estimates = self.method.label_estimates()
        if not estimates:
            return {}
        return score_label_estimates(estimates, torch.from_numpy(self.splits.train.labels.astype(np.float32)))

    # ----------------------------------------------------------------- evaluation
    def _predict(self, model: nn.Module, loader: Any, desc: str) -> Rows:
        """Logits of ``model`` (eval mode) for every row of ``loader``'s dataset (unreadable images missing)."""
        was_training = model.training
        model.eval()
        rows = self.predictor.rows(model, loader, len(self.classes), desc)
        model.train(was_training)
        return rows

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities (N_train, C) of the current model over the training set, in dataset order (an unreadable
        image's row holds its observed labels)."""
        transform = self.train.dataset.transform if augment else self.predictor.eval_transform
        dataset = ImageLabelDataset(self.splits.train, transform, self.splits.train_observed)
        rows = self._predict(self.model, self.predictor.loader(dataset), "predict train")
        probs = torch.sigmoid(rows.values)
        probs[~rows.present] = dataset.observed[~rows.present]
        return probs

    def evaluate(self, model: nn.Module, loader: Any, desc: str, split: str = "val") -> Assessment:
        """``model``'s predictions on ``loader``'s dataset (the ``split``) against its labels, with the selection
        criterion; the figures that need full labels are None when the split has none. With ``--trainable head``
        the backbone part comes from the feature cache (the same values, computed once)."""
        if self.cfg.trainable == "head":
            if self.linear is None:
                self.linear = self._feature_phase()
            rows = self.linear.head_rows(model, getattr(self.splits, split), split)
        else:
            rows = self._predict(model, loader, desc)
        if rows.missing:
            log(f"{desc}: {rows.missing} unreadable image(s) left out of the metrics")
        labels = loader.dataset.labels[rows.present]
        return assess(rows.values[rows.present].numpy(), labels.numpy(), self.classes, self.criterion,
                      full_labels=self.splits.has_full_labels(split))

    def _set_expected_positives(self, k: ExpectedPositives) -> None:
        self.expected_positives = k
        self.method.set_expected_positives(k.k)

    def _estimate_expected_positives(self, assessment: Assessment) -> dict[str, float]:
        """When k is estimated: a new estimate from this epoch's validation scores (the same on every rank), given
        to the method for the next epoch; returns it for the metrics line."""
        k = self.expected_positives
        if (k is None or k.source != "estimated" or k.detail.startswith(CHOOSER_K) or assessment.logits is None
                or assessment.labels is None):
            return {}
        estimate = estimate_k(assessment.logits, assessment.labels)
        self._set_expected_positives(ExpectedPositives(estimate.k, "estimated", "from the model's validation "
                                                       "scores after each epoch", estimate))
        return {"k_estimate": estimate.k}

    def _candidates(self, linear: FixedFeaturePhase | None) -> list[Candidate]:
        """The epoch's candidate weights with their val assessment: the model (its head on cached features in
        LinearInit), plus its EMA when there is one."""
        if linear is not None:
            return [Candidate("model", self.model, linear.validate())]
        candidates = [Candidate("model", self.model, self.evaluate(self.model, self.val_loader, "val"))]
        if self.ema is not None:
            candidates.append(Candidate("ema", self.ema.module, self.evaluate(self.ema.module, self.val_loader,
                                                                              "val ema")))
        return candidates

    # ----------------------------------------------------------------- the run
    def fit(self) -> dict[str, Any]:
        """Train from ``start_epoch`` through the LinearInit phase (if any) and ``cfg.epochs`` end-to-end epochs,
        then test the best checkpoint; returns the summary."""
        cfg = self.cfg
        self.files.write_protocol(self.data.protocol_bytes, self.resumed)
        self.files.write_config(self._config_record())
        log(f"global batch {cfg.batch_size} = {self.world.size} process(es) x {self.batch_per_process}"
            + (" (torchrun, gradients averaged over the processes)" if self.world.distributed else ""))
        if self.start_epoch == 1:
            log(f"run {self.run_dir}: {cfg.method} on {self.dataset.name} ({self.splits.summary()}), {cfg.arch} "
                f"@{cfg.image_size}px, {self.device}" + (f", {self.precision.dtype}" if self.precision.dtype else ""))
            for line in self.weights_report:
                log(line)
            log(f"preprocessing: {self.transform}")
            log(describe_regimes(self.splits.regimes))
            log(self.selection.describe())
            if self.expected_positives is not None:
                log(f"{cfg.method}: {self.expected_positives.describe()}")
                if self.expected_positives.caveat():
                    log(f"note: {self.expected_positives.caveat()}")
            if len(self.stage_plan) > 1:
                log(f"{cfg.method} trains in {len(self.stage_plan)} stages of {', '.join(map(str, self.stage_plan))}"
                    " epochs; each stage starts from the previous stage's best weights")
        if self.start_epoch <= self.feature_epochs:
            if cfg.trainable == "head":
                log(f"fixed features: the {cfg.arch} backbone is frozen; the head trains {cfg.epochs} epochs on "
                    "features computed once")
            else:
                log(f"LinearInit: {cfg.linear_init} epochs on fixed {cfg.arch} features, "
                    + (f"then {cfg.epochs} end to end" if cfg.epochs else "no end-to-end phase (linear probe)"))
            self.linear = self._feature_phase()
            if self._linear_resume is not None:
                self.linear.load_state_dict(self._linear_resume)
        for epoch in range(self.start_epoch, self.total_epochs + 1):
            if self.patience_exhausted(epoch - 1):
                break
            self._run_epoch(epoch)
        return self.finish()

    def patience_exhausted(self, epoch: int) -> bool:
        """Whether ``--patience`` stops the run after ``epoch``: in the last stage (or on fixed features with
        ``--trainable head``), the selection criterion has not improved for ``patience`` epochs."""
        patience = self.cfg.patience
        if patience <= 0 or epoch < 1 or epoch >= self.total_epochs:
            return False
        if self.cfg.trainable != "head" and epoch <= self.feature_epochs:
            return False  # LinearInit's linear phase runs to its end
        if self.stage_of(epoch) < len(self.stage_plan):
            return False
        return epoch - self.best.epoch >= patience

    @property
    def done_training(self) -> bool:
        """Whether every epoch ran, or ``--patience`` stopped the run (a resume then only finishes it)."""
        return self.start_epoch > self.total_epochs or self.patience_exhausted(self.start_epoch - 1)

    def _config_record(self) -> dict[str, Any]:
        """config.json: the config as given and what it resolved to."""
        cfg = self.cfg
        return {"config": cfg.to_dict(), "resolved": {
            "world_size": self.world.size, "global_batch_size": cfg.batch_size,
            "batch_size_per_process": self.batch_per_process,
            "device": str(self.device), "amp": str(self.precision.dtype), "channels_last": self.channels_last,
            "method_hparams": self.method.hparams_dict(), "torch": torch.__version__,
            "dataset": self.dataset.name, "source": self.dataset.source, "fingerprint": self.splits.fingerprint,
            "splits": self.splits.summary(), "notes": self.dataset.notes,
            "observed_file": OBSERVED_FILE, "observed_sha256": self.data.protocol_sha256,
            "protocol_seed": self.splits.seed,
            "labels": {split: regime.to_dict() for split, regime in self.splits.regimes.items()},
            "selection": {"criterion": self.selection.name, "reason": self.selection.reason},
            "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None,
            "pseudo_labels": self.pseudo_labels.record() if self.pseudo_labels is not None else None,
        }}

    def _run_epoch(self, epoch: int) -> None:
        """Train ``epoch``, let the method act on it, evaluate and select, write its metrics line and checkpoints,
        and move to the next phase or stage when this one ends."""
        cfg = self.cfg
        self.last_epoch = epoch
        linear = self.linear if epoch <= self.feature_epochs else None
        stats = linear.train_epoch(epoch) if linear is not None else self.train_epoch(epoch)
        predict = linear.predict_train if linear is not None else self.predict_train
        stats.update(self.method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=predict)))
        stats.update(self._diagnostics())
        candidates = self._candidates(linear)
        if linear is not None:
            linear.remember_if_best(candidates[0].assessment.score)
        chosen = pick(candidates)
        stats.update(self._estimate_expected_positives(candidates[0].assessment))
        val = candidates[0].assessment.metrics
        stage = self.stage_of(epoch)
        record = {"epoch": epoch, **({"stage": stage} if len(self.stage_plan) > 1 else {}),
                  **{k: round(v, 6) for k, v in stats.items()},
                  "val_mAP": val["mAP"], "val_OF1": val["OF1"], "val_CF1": val["CF1"]}
        if val["mAP"] is None:
            record["val_mAP_observed"] = val["mAP_observed"]
        if self.selection.name != "val_mAP":
            record[f"val_{self.selection.name}"] = candidates[0].assessment.score
        if len(candidates) > 1:
            record["val_mAP_ema"] = candidates[1].assessment.metrics["mAP"]
            record[f"val_{self.selection.name}_ema"] = candidates[1].assessment.score
        improved = self.best.offer(chosen.assessment.score, epoch)
        if improved and self.world.is_main:
            val_summary = {k: v for k, v in chosen.assessment.metrics.items() if k != "per_class_AP"}
            save_checkpoint(self.run_dir / BEST, chosen.module.state_dict(),
                            self.meta(epoch, {"val": val_summary, "weights": chosen.name}))
        record["best"] = improved
        self.files.append_metrics(record)
        if linear is not None and epoch == cfg.linear_init and cfg.trainable != "head":
            # LinearInit's phase 1 over: its best epoch starts phase 2
            linear.restore_best()
            self.linear = None
            self.optimisation.restart_ema()  # average from the restored weights, not from the random head
        if stage < len(self.stage_plan) and epoch == self._last_epoch_of_stage(stage):
            self._next_stage(stage + 1)
        self.save_last(epoch)
        score = f"  val {self.selection.name} {candidates[0].assessment.score:.4g}" \
            if self.selection.name != "val_mAP" else ""
        phase = " (head on features)" if linear is not None and cfg.trainable == "head" else (
            " (linear)" if linear is not None else "")
        log(f"epoch {epoch}/{self.total_epochs}{phase}  loss {stats['loss']:.4f}"
            f"  val mAP {figure(val['mAP'])}{score}"
            + (f"  (ema {figure(record['val_mAP_ema'])})" if "val_mAP_ema" in record else "")
            + (f"  k {stats['k_estimate']:.2f}" if "k_estimate" in stats else "")
            + (f"  {stats['train_images_per_s']:.0f} img/s" if "train_images_per_s" in stats else "")
            + ("  *best*" if improved else ""))

    def finish(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on val and test (and, where the training split has full labels, its label
        recovery on the training set), store the metrics in best.pt, write summary.json."""
        best = load_shared(self.run_dir / BEST, self.device)
        model = model_from_meta(best.meta).to(self.device)
        model.load_state_dict(best.model)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        assessments = {"val": self.evaluate(model, self.val_loader, "val (best)")}
        if self.splits.test is not None:
            test_loader = self.predictor.eval_loader(self.splits.test)
            assessments["test"] = self.evaluate(model, test_loader, "test (best)", "test")
        metrics: dict[str, Any] = {split: a.metrics for split, a in assessments.items()}
        self.files.write_scores({f"{split}_{kind}": value for split, a in assessments.items()
                                 for kind, value in (("logits", a.logits), ("labels", a.labels))
                                 if value is not None})
        if self.splits.test is None:
            log("no test split in this dataset: reporting validation metrics only")
        if self.splits.train_has_full_labels:
            # Cole et al.'s label recovery: how well the model ranks the training set's hidden labels
            train_loader = self.predictor.eval_loader(self.splits.train)
            metrics["train_recovery"] = self.evaluate(model, train_loader, "train (label recovery)", "train").metrics
        compact = {k: {m: v for m, v in d.items() if m != "per_class_AP"} for k, d in metrics.items()}
        compact["weights"] = best.meta.metrics.get("weights", "model")
        best.meta.metrics = compact
        if self.world.is_main:
            save_checkpoint(self.run_dir / BEST, best.model, best.meta)
        last = self.start_epoch - 1 if self.last_epoch is None else self.last_epoch
        summary = {
            "run": str(self.run_dir), "method": self.cfg.method, "dataset": self.dataset.name,
            "observed": str(self.splits.observed), "arch": self.cfg.arch, "image_size": self.cfg.image_size,
            "epochs": self.cfg.epochs, "epochs_run": last,
            "stopped_early": bool(self.cfg.patience and last < self.total_epochs), "best_epoch": self.best.epoch,
            "selection": self.selection.name,
            "best_score": self.best.score,
            "labels": {split: regime.kind for split, regime in self.splits.regimes.items()},
            "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None, **metrics,
        }
        if self.stage_history:
            summary["stages"] = [*self.stage_history, {"stage": len(self.stage_plan), "best_epoch": self.best.epoch,
                                                       f"val_{self.selection.name}": self.best.score}]
        self.files.write_summary(summary)
        line = f"best epoch {self.best.epoch} ({self.selection.name}): val mAP {figure(metrics['val']['mAP'])}"
        if "test" in metrics:
            line += f" | test {held_out_line(metrics['test'], assessments['test'].logits, len(self.classes))}"
        if "train_recovery" in metrics:
            line += f" | train label recovery mAP {metrics['train_recovery']['mAP']:.2f}"
        log(line)
        log(f"saved {self.run_dir / BEST}  (export it with: python -m export {self.run_dir})")
        return summary
