"""The training run: epoch after epoch (train, evaluate and select, checkpoint) through the fixed-feature phase and the
method's stages, then the selected weights tested. Built by :func:`train.prepared_run.prepare_run`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from models.checkpoint import save_checkpoint
from models.data.dataset import ImageLabelDataset
from models.evaluation.expected_positives import CHOOSER_K, ExpectedPositives, estimate_k
from models.files.atomic_writes import atomic_path
from models.files.run_folder import BEST, LAST
from models.network import model_from_meta
from train.config import TrainConfig
from train.console import log
from train.diagnostics import run_diagnostics
from train.distributed import barrier, broadcast_buffers
from train.epoch import Optimisation, run_training_step, to_device, train_epoch, wrap_training_step
from train.fixed_features import FixedFeaturePhase
from train.methods import EpochEndContext, LossOutput
from train.prepared_run import PreparedRun, prepare_run
from train.run_records import (
    capture_rng,
    epoch_line,
    epoch_record,
    feature_phase_line,
    load_shared,
    opening_lines,
    restore_rng,
    summary_line,
)
from train.selection import AssessedWeights, Assessment, BestSoFar, Rows, assess, best_weights
from train.top_phase import TopPhase


class Trainer:
    """Trains (or resumes) the run of a :class:`TrainConfig` in ``run_dir``; ``self.run`` holds the parts."""

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False) -> None:
        self.run: PreparedRun = prepare_run(cfg, run_dir, resume)
        self._fresh_optimisation(stage=1)
        self.start_epoch = 1
        self.last_epoch: int | None = None  # the last epoch trained by this process
        self.best = BestSoFar()
        self.stage_history: list[dict[str, Any]] = []  # best epoch and val score of each finished stage
        self.linear: FixedFeaturePhase | None = None
        self.top: TopPhase | None = None  # --trainable top: the phase after LinearInit's
        self._linear_resume: dict[str, Any] | None = None
        self._top_resume: dict[str, Any] | None = None
        if resume:
            self._load_resume_state()

    # ----------------------------------------------------------------- stages
    @property
    def ema(self) -> AveragedModel | None:
        """The current stage's EMA of the weights (None without ``--ema``)."""
        return self.optimisation.ema

    def _fresh_optimisation(self, stage: int) -> None:
        """A new optimiser, schedule, scaler and EMA; the step module is rebuilt at the next step."""
        self.step_module: nn.Module | None = None  # the old DDP wrapper goes first: one reducer per parameter
        run = self.run
        self.optimisation = Optimisation(run.cfg, run.model, run.method, run.stage_plan[stage - 1] *
                                         run.steps_per_epoch, run.precision.dtype, run.device)

    def _next_stage(self, stage: int) -> None:
        """End the stage (``best-stageK.pt``, its best weights loaded) and start ``stage`` afresh."""
        run, finished = self.run, stage - 1
        best_path = run.run_dir / BEST
        if run.world.is_main:
            with atomic_path(run.run_dir / f"best-stage{finished}.pt") as tmp:
                shutil.copyfile(best_path, tmp)
        best = load_shared(best_path, run.device)
        run.model.load_state_dict(best.model)
        self.stage_history.append({"stage": finished, "best_epoch": self.best.epoch,
                                   f"val_{run.selection.name}": self.best.score,
                                   "weights": best.meta.metrics.get("weights", "model")})
        log(f"stage {finished} done (best val {run.selection.name} {self.best.score:.4g} at epoch {self.best.epoch}); "
            f"stage {stage} starts from those weights")
        run.method.start_stage(stage)
        self._fresh_optimisation(stage)
        self.top = None  # a new stage: a new optimiser over the same cached inputs
        self.best.reset()

    # ----------------------------------------------------------------- checkpoints and resuming
    def save_last(self, epoch: int) -> None:
        """Write last.pt with everything ``--resume`` needs (rank 0; the state is the same on every rank)."""
        run = self.run
        if not run.world.is_main:
            return
        k = run.expected_positives
        training = {"epoch": epoch, **self.best.state_dict(), **self.optimisation.state_dict(),
                    "expected_positives": k.to_dict() if k else None, "method": run.method.state_dict(),
                    "rng": capture_rng(), "stage_history": self.stage_history}
        if self.linear is not None:
            training["linear"] = self.linear.state_dict()
        if self.top is not None:
            training["top"] = self.top.state_dict()
        save_checkpoint(run.run_dir / LAST, run.model.state_dict(), run.checkpoint_meta(epoch, {}), training)

    def _load_resume_state(self) -> None:
        """Restore model, method, optimisation, RNG, best epoch and k from ``last.pt``."""
        run = self.run
        path = run.run_dir / LAST
        ckpt = load_shared(path, run.device)
        if ckpt.training is None:
            raise ValueError(f"{path} holds no training state; cannot resume")
        if ckpt.meta.data.get("fingerprint") != run.splits.fingerprint:
            raise ValueError(f"{path}: the dataset changed since this run started (fingerprint "
                             f"{ckpt.meta.data.get('fingerprint')} != {run.splits.fingerprint})")
        t = ckpt.training
        self.start_epoch = int(t["epoch"]) + 1
        stage = run.stage_of(min(self.start_epoch, run.total_epochs))
        if stage > 1:  # the saved optimiser, schedule and EMA belong to a later stage
            self._fresh_optimisation(stage)
        self.stage_history = list(t.get("stage_history", []))
        run.model.load_state_dict(ckpt.model)
        run.method.load_state_dict(t["method"])
        self.optimisation.load_state_dict(t)
        restore_rng(t["rng"])
        self._linear_resume = t.get("linear")
        self._top_resume = t.get("top")
        self.best.load_state_dict(t)
        if t.get("expected_positives") and run.expected_positives is not None:  # an estimate made before
            self._set_expected_positives(ExpectedPositives.from_dict(t["expected_positives"]))
        barrier()  # every rank has read last.pt
        run.files.keep_metrics_before(self.start_epoch)  # those epochs run again
        log(f"resuming {run.run_dir} at epoch {self.start_epoch}/{run.total_epochs} "
            f"(best {run.selection.name} so far {self.best.score:.4g} at epoch {self.best.epoch})")

    # ----------------------------------------------------------------- training
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_device(batch, self.run.device, self.run.channels_last)

    def train_step(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Forward, backward, clip and optimiser / scheduler / EMA step on one batch on the device."""
        if self.step_module is None:  # built on first use: LinearInit's wrapper is gone by then
            self.step_module = wrap_training_step(self.run.model, self.run.method, self.run.device)
        with self.run.precision.autocast():
            out = run_training_step(self.step_module, batch)
        self.optimisation.update(out.loss)
        return out

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One end-to-end pass over the training set; returns mean loss, method logs, throughput and lr. Under torchrun
        rank 0's BatchNorm statistics then go to every rank."""
        self.run.model.train()
        stats = train_epoch(self.run.train, epoch, self.train_step, self._to_device,
                            f"epoch {epoch}/{self.run.total_epochs}", self.run.progress)
        broadcast_buffers(self.run.model)
        if self.ema is not None:
            broadcast_buffers(self.ema)
        stats["lr"] = self.optimisation.lr
        return stats

    # ----------------------------------------------------------------- evaluation
    def _predict(self, model: nn.Module, loader: Any, desc: str) -> Rows:
        """Logits of ``model`` (eval mode) for every row of ``loader``'s dataset (unreadable images missing)."""
        was_training = model.training
        model.eval()
        rows = self.run.predictor.rows(model, loader, len(self.run.classes), desc)
        model.train(was_training)
        return rows

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities (N_train, C) of the model over the training set, in dataset order."""
        run = self.run
        transform = run.train.dataset.transform if augment else run.predictor.eval_transform
        dataset = ImageLabelDataset(run.splits.train, transform, run.splits.train_observed)
        rows = self._predict(run.model, run.predictor.loader(dataset), "predict train")
        probs = torch.sigmoid(rows.values)
        probs[~rows.present] = dataset.observed[~rows.present]
        return probs

    def evaluate(self, model: nn.Module, loader: Any, desc: str, split: str = "val") -> Assessment:
        """``model``'s predictions on ``split`` against its labels, with the selection criterion."""
        run = self.run
        if run.cfg.fixed_features:
            self.linear = self.linear or run.feature_phase()
            rows = self.linear.head_rows(model, getattr(run.splits, split), split)
        else:
            rows = self._predict(model, loader, desc)
        if rows.missing:
            log(f"{desc}: {rows.missing} unreadable image(s) left out of the metrics")
        labels = loader.dataset.labels[rows.present]
        return assess(rows.values[rows.present].numpy(), labels.numpy(), run.classes, run.criterion,
                      full_labels=run.splits.has_full_labels(split))

    def _set_expected_positives(self, k: ExpectedPositives) -> None:
        self.run.expected_positives = k
        self.run.method.set_expected_positives(k.k)

    def _estimate_expected_positives(self, assessment: Assessment) -> dict[str, float]:
        """A new estimate of k from this epoch's validation scores, given to the method; returned."""
        k = self.run.expected_positives
        if (k is None or k.known or k.detail.startswith(CHOOSER_K) or assessment.logits is None
                or assessment.labels is None):
            return {}
        estimate = estimate_k(assessment.logits, assessment.labels)
        self._set_expected_positives(ExpectedPositives(estimate.k, "estimated", "from the model's validation "
                                                       "scores after each epoch", estimate))
        return {"k_estimate": estimate.k}

    def _candidates(self, linear: FixedFeaturePhase | None) -> list[AssessedWeights]:
        """The epoch's candidate weights (the model, and its EMA) with their val assessment."""
        model, val = self.run.model, self.run.val_loader
        if linear is not None:
            return [AssessedWeights("model", model, linear.validate())]
        candidates = [AssessedWeights("model", model, self.evaluate(model, val, "val"))]
        if self.ema is not None:
            candidates.append(AssessedWeights("ema", self.ema.module, self.evaluate(self.ema.module, val, "val ema")))
        return candidates

    # ----------------------------------------------------------------- the run
    def fit(self) -> dict[str, Any]:
        """Train from ``start_epoch`` through every phase and stage, test the best checkpoint; the summary."""
        run = self.run
        cfg = run.cfg
        run.files.write_protocol(run.data.protocol_bytes, run.resumed)
        run.files.write_config(run.config_record())
        log(f"global batch {cfg.batch_size} = {run.world.size} process(es) x {run.batch_per_process}"
            + (" (torchrun, gradients averaged over the processes)" if run.world.distributed else ""))
        if self.start_epoch == 1:
            for line in opening_lines(self.run):
                log(line)
        if self.start_epoch <= run.feature_epochs:
            log(feature_phase_line(cfg))
            self.linear = run.feature_phase()
            if self._linear_resume is not None:
                self.linear.load_state_dict(self._linear_resume)
        for epoch in range(self.start_epoch, run.total_epochs + 1):
            if self.patience_exhausted(epoch - 1):
                break
            self._run_epoch(epoch)
        return self.finish()

    def patience_exhausted(self, epoch: int) -> bool:
        """Whether ``--patience`` stops the run after ``epoch`` (in the last stage, or with ``--trainable head``)."""
        run = self.run
        patience = run.cfg.patience
        if patience <= 0 or epoch < 1 or epoch >= run.total_epochs:
            return False
        if not run.cfg.fixed_features and epoch <= run.feature_epochs:
            return False  # LinearInit's linear phase runs to its end
        # the last stage (the whole network after LinearInit) gets its ``patience`` epochs to beat the stages before
        start = 0 if run.cfg.fixed_features else run.last_epoch_of_stage(len(run.stage_plan) - 1)
        return run.stage_of(epoch) == len(run.stage_plan) and epoch - max(self.best.epoch, start) >= patience

    @property
    def done_training(self) -> bool:
        """Whether every epoch ran, or ``--patience`` stopped the run (a resume then only finishes it)."""
        return self.start_epoch > self.run.total_epochs or self.patience_exhausted(self.start_epoch - 1)

    def _run_epoch(self, epoch: int) -> None:
        """Train ``epoch``, evaluate and select, write metrics and checkpoints, move on when a stage ends."""
        run = self.run
        cfg = run.cfg
        self.last_epoch = epoch
        linear = self.linear if epoch <= run.feature_epochs else None
        cached = linear or (self._top_phase() if cfg.cached_top and epoch > run.feature_epochs else None)
        stats = cached.train_epoch(epoch) if cached is not None else self.train_epoch(epoch)
        predict = cached.predict_train if cached is not None else self.predict_train
        stats.update(run.method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=predict)))
        stats.update(run_diagnostics(run.method, run.splits, run.world.is_main))
        candidates = self._candidates(cached)
        if linear is not None:
            linear.remember_if_best(candidates[0].assessment.score)
        chosen = best_weights(candidates)
        stats.update(self._estimate_expected_positives(candidates[0].assessment))
        stage = run.stage_of(epoch)
        improved = self.best.offer(chosen.assessment.score, epoch)
        if improved and run.world.is_main:
            val_summary = {k: v for k, v in chosen.assessment.metrics.items() if k != "per_class_AP"}
            save_checkpoint(run.run_dir / BEST, chosen.module.state_dict(),
                            run.checkpoint_meta(epoch, {"val": val_summary, "weights": chosen.name}))
        record = epoch_record(epoch, stage if len(run.stage_plan) > 1 else None, stats, run.selection.name,
                              candidates, improved)
        run.files.append_metrics(record)
        if linear is not None and epoch == cfg.linear_init and not cfg.fixed_features:
            linear.restore_best()  # LinearInit's phase 1 over: its best epoch starts phase 2
            self.linear = None
            self.optimisation.restart_ema()  # average from the restored weights, not from the random head
        if stage < len(run.stage_plan) and epoch == run.last_epoch_of_stage(stage):
            self._next_stage(stage + 1)
        self.save_last(epoch)
        phase = (" (last stage on cached inputs)" if cached is not None else "") if linear is None else (
            " (head on features)" if cfg.fixed_features else " (linear)")
        log(epoch_line(epoch, run.total_epochs, phase, stats, record, run.selection.name))

    def _top_phase(self) -> TopPhase:
        """``--trainable top``'s phase, built at its first epoch (and after a resume, with its saved state)."""
        if self.top is None:
            self.top = self.run.top_phase()
            if self._top_resume is not None:
                self.top.load_state_dict(self._top_resume)
                self._top_resume = None
        return self.top

    def finish(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on val and test, store the metrics in best.pt, write summary.json."""
        run = self.run
        best = load_shared(run.run_dir / BEST, run.device)
        model = model_from_meta(best.meta).to(run.device)
        model.load_state_dict(best.model)
        if run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        assessments = {"val": self.evaluate(model, run.val_loader, "val (best)")}
        if run.splits.test is not None:
            test_loader = run.predictor.eval_loader(run.splits.test)
            assessments["test"] = self.evaluate(model, test_loader, "test (best)", "test")
        else:
            log("no test split in this dataset: reporting validation metrics only")
        metrics: dict[str, Any] = {split: a.metrics for split, a in assessments.items()}
        run.files.write_scores({f"{split}_{kind}": value for split, a in assessments.items()
                                for kind, value in (("logits", a.logits), ("labels", a.labels)) if value is not None})
        if run.splits.train_has_full_labels:  # Cole et al.'s label recovery: how the hidden labels rank
            train_loader = run.predictor.eval_loader(run.splits.train)
            metrics["train_recovery"] = self.evaluate(model, train_loader, "train (label recovery)", "train").metrics
        best.meta.metrics = {**{k: {m: v for m, v in d.items() if m != "per_class_AP"} for k, d in metrics.items()},
                             "weights": best.meta.metrics.get("weights", "model")}
        if run.world.is_main:
            save_checkpoint(run.run_dir / BEST, best.model, best.meta)
        last = self.start_epoch - 1 if self.last_epoch is None else self.last_epoch
        k = run.expected_positives
        summary = {
            "run": str(run.run_dir), "method": run.cfg.method, "dataset": run.dataset.name,
            "observed": str(run.splits.observed), "arch": run.cfg.arch, "image_size": run.cfg.image_size,
            "epochs": run.cfg.epochs, "epochs_run": last, "stopped_early": last < run.total_epochs,
            "best_epoch": self.best.epoch, "selection": run.selection.name, "best_score": self.best.score,
            "labels": {split: regime.kind for split, regime in run.splits.regimes.items()},
            "val_review": run.data.review.get("val"), "expected_positives": k.to_dict() if k else None, **metrics}
        if self.stage_history:
            summary["stages"] = [*self.stage_history, {"stage": len(run.stage_plan), "best_epoch": self.best.epoch,
                                                        f"val_{run.selection.name}": self.best.score}]
        run.files.write_summary(summary)
        log(summary_line(self.best.epoch, run.selection.name, metrics, assessments, len(run.classes)))
        log(f"saved {run.run_dir / BEST}  (export it with: python -m export {run.run_dir})")
        return summary
