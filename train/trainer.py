"""The training loop: data + protocol, model, method, optimisation, evaluation, run folder, resume."""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from models.atomic_files import atomic_path
from models.checkpoint import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Checkpoint,
    ModelMeta,
    load_checkpoint,
    save_checkpoint,
)
from models.preprocess import EvalTransform, TrainTransform
from models.resnet import build_model, model_from_meta
from train.config import TrainConfig
from train.data.dataset import ImageLabelDataset, SkipReporter, collate_readable
from train.data.observed_file import OBSERVED_FILE, protocol_file_bytes, sha256_of
from train.data.protocol import ProtocolSplits, build_protocol, parse_observed, protocol_record
from train.data.registry import load_dataset
from train.distributed import (
    PerSampleSeeded,
    barrier,
    broadcast_buffers,
    broadcast_object,
    current_world,
    init_world,
    per_rank_batch,
    sum_over_ranks,
)
from train.inference import Rows, predict_rows
from train.linear_init import LinearPhase
from train.methods import EpochEndContext, LossOutput, Method, MethodContext, get_method, make_hparams
from train.metrics import evaluate
from train.optimizers import build_optimizer, build_scheduler
from train.runs import BEST, CONFIG_FILE, LAST, METRICS_FILE, SUMMARY_FILE
from train.training_step import run_training_step, wrap_training_step


def log(message: str) -> None:
    """Print a status line (through tqdm so it does not break an active progress bar); rank 0 only."""
    if current_world().is_main:
        tqdm.write(message, file=sys.stderr)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """All RNG states as tensors/lists (loadable with ``weights_only=True``)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Precision:
    """Autocast settings for the device."""

    dtype: torch.dtype | None  # None = no autocast
    device_type: str

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context (or a no-op)."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(amp: str, device: torch.device) -> Precision:
    """``auto``: bf16 on CUDA GPUs that support it, fp16 on older ones, none on CPU."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return Precision(None, device.type)
    if amp == "auto":
        return Precision(torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16, device.type)
    return Precision(torch.bfloat16 if amp == "bf16" else torch.float16, device.type)


def resolve_head(head: str, method: type[Method]) -> str:
    """The classifier head to build: ``auto`` -> the method's required head, else ``linear``; an explicit head
    that the method cannot train with is a ``ValueError``."""
    if head == "auto":
        return method.required_head or "linear"
    if method.required_head and head != method.required_head:
        raise ValueError(f"method {method.name!r} needs --head {method.required_head} (got --head {head})")
    return head


# Query2Label / LAC run at 448 px (14 x 14 = 196 tokens). The 7 x 7 floor (224 px, where Query2Label also
# reports results) is a heuristic; measured at 64 px (2 x 2 tokens), runs/compare/lac-seed0 stage 1: the 20
# class embeddings of an image have cosine similarity 0.9999997, i.e. the head is not label-wise at all.
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
            "Use --image-size 224 or more for a label-wise head; lac logs class_embedding_cos, the mean cosine "
            "between one image's class embeddings (1 = identical)")


def make_run_name(cfg: TrainConfig, dataset_name: str) -> str:
    """``DATA-METHOD-ARCH-YYYYmmdd-HHMMSS``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{dataset_name}-{cfg.method}-{cfg.arch}-{stamp}"


class Trainer:
    """Builds everything from a :class:`TrainConfig` and runs (or resumes) training in ``run_dir``."""

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False) -> None:
        self.cfg = cfg
        self.world, self.device = init_world(cfg.device, cfg.sync_bn)
        self.progress = cfg.progress and self.world.is_main
        self.precision = resolve_precision(cfg.amp, self.device)
        self.channels_last = cfg.channels_last == "on" or (cfg.channels_last == "auto" and self.device.type == "cuda")
        seed_everything(cfg.seed)

        self.dataset = load_dataset(cfg.data)
        self.splits: ProtocolSplits = build_protocol(
            self.dataset, parse_observed(cfg.observed), cfg.val_fraction, cfg.protocol_seed
        )
        self.classes = self.splits.classes
        self._announce_observed()
        name = broadcast_object(cfg.name or make_run_name(cfg, self.dataset.name))  # one timestamp for all ranks
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.runs_dir) / name
        if not resume and self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise FileExistsError(f"run folder {self.run_dir} already exists and is not empty; pick another --name")
        barrier()  # every rank has checked the folder before rank 0 writes into it
        if self.world.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # the protocol file: the same bytes on every rank (deterministic); rank 0 writes it when training starts
        self.protocol_bytes = protocol_file_bytes(protocol_record(self.splits, self.dataset))
        self.protocol_sha256 = sha256_of(self.protocol_bytes)
        self.resumed = resume

        num_classes = len(self.classes)
        method_cls = get_method(cfg.method)
        self.hparams = make_hparams(method_cls, cfg.hp, self.dataset.name)
        self.head = resolve_head(cfg.head, method_cls)
        warning = lem_token_warning(self.head, cfg.image_size)
        if warning:
            log(warning)
        self.model = build_model(cfg.arch, num_classes, cfg.weights, lgconv=cfg.lgconv, head=self.head,
                                 load_head=not cfg.reset_head, boostlu=cfg.boostlu)
        if cfg.sync_bn:
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.model = self.model.to(self.device)
        self.model.set_trainable_scope(cfg.trainable)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        # Training stages (one for most methods): each starts from the previous stage's best weights.
        # --epochs 0 (only with --linear-init): a linear probe, no end-to-end stage at all
        self.stage_plan = method_cls.stage_epochs(self.hparams, cfg.epochs) if cfg.epochs else [0]
        self.total_epochs = cfg.linear_init + sum(self.stage_plan)
        ctx = MethodContext(
            num_classes=num_classes,
            num_train=len(self.splits.train),
            train_observed=torch.from_numpy(self.splits.train_observed.astype(np.float32)),
            expected_positives=float(self.splits.train.labels.sum(1).mean()),
            epochs=self.total_epochs,  # epoch numbers given to on_epoch_end count every phase and stage
            dataset=self.dataset.name,
            batch_size=cfg.batch_size,
            feature_width=self.model.num_features,
        )
        self.method: Method = method_cls(ctx, self.hparams).to(self.device)

        mean, std = IMAGENET_MEAN, IMAGENET_STD
        self.eval_transform = EvalTransform(cfg.image_size, mean, std)
        views = self.method.extra_views(cfg.image_size, mean, std)
        if views and cfg.linear_init:
            raise ValueError(f"--linear-init trains on cached features of one fixed view; {cfg.method} trains on "
                             f"extra augmented views ({', '.join(views)}), so it cannot use --linear-init")
        self.train_set = ImageLabelDataset(self.splits.train, TrainTransform(cfg.image_size, mean, std),
                                           self.splits.train_observed, views=views)
        self.skips = SkipReporter()  # unreadable images: one warning per file, rows left out
        self.loader_generator = torch.Generator()
        self.batch_per_process = per_rank_batch(cfg.batch_size, self.world)
        self.train_sampler: DistributedSampler[Any] | None = None
        self.seeded_train_set: PerSampleSeeded | None = None
        if self.world.distributed:  # a rank-independent shuffle and augmentation, sharded over the ranks
            self.seeded_train_set = PerSampleSeeded(self.train_set, cfg.seed)
            self.train_sampler = DistributedSampler(self.seeded_train_set, shuffle=True, seed=cfg.seed)
        self.train_loader = DataLoader(
            self.seeded_train_set or self.train_set, batch_size=self.batch_per_process,
            shuffle=self.train_sampler is None, sampler=self.train_sampler,
            generator=self.loader_generator if self.train_sampler is None else None,
            num_workers=cfg.workers, drop_last=len(self.train_set) > cfg.batch_size,
            pin_memory=self.device.type == "cuda", collate_fn=collate_readable,
        )
        self.val_loader = self._eval_loader(ImageLabelDataset(self.splits.val, self.eval_transform))

        self.steps_per_epoch = len(self.train_loader)
        self._fresh_optimisation(stage=1)
        self.start_epoch = 1
        self.best_map = -math.inf
        self.best_epoch = 0
        self.stage_history: list[dict[str, Any]] = []  # best epoch and val mAP of each finished stage
        self.linear: LinearPhase | None = None
        self._linear_resume: dict[str, Any] | None = None
        if resume:
            self._load_resume_state()

    # ----------------------------------------------------------------- construction helpers
    def _announce_observed(self) -> None:
        """Say on stdout (rank 0) when the observed labels are not sampled here but read from a file."""
        observed = self.splits.observed
        if not self.world.is_main:
            return
        if self.cfg.observed.strip().lower() == "single" and observed.kind == "given":
            print(f"observed labels: the dataset's own {observed.path} (not sampled; add ?resample to the --data "
                  "spec to sample them with --protocol-seed)")
        elif parse_observed(self.cfg.observed).kind == "file":
            print(f"observed labels: {observed} from {self.cfg.observed}, protocol seed {self.splits.seed} "
                  f"({len(self.splits.train)} train / {len(self.splits.val)} val images)")

    def _write_protocol_file(self, resume: bool) -> None:
        """Write the run's protocol file; a resumed run's existing file must hold the same protocol."""
        path = self.run_dir / OBSERVED_FILE
        if resume and path.is_file():
            if sha256_of(path.read_bytes()) != self.protocol_sha256:
                raise ValueError(f"{path}: the observed labels or the split changed since this run started")
            return
        with atomic_path(path) as tmp:
            tmp.write_bytes(self.protocol_bytes)

    def _fresh_optimisation(self, stage: int) -> None:
        """A new optimiser, schedule (over ``stage``'s epochs), grad scaler and EMA; the step module (DDP under
        torchrun) is rebuilt at the next step, as the stage may train another set of parameters."""
        self.step_module: nn.Module | None = None  # the old DDP wrapper goes first: one reducer per parameter
        params = [{"params": [p for p in self.model.parameters() if p.requires_grad]}]
        params += self.method.param_groups(self.cfg.lr)
        self.optimizer = self._make_optimizer(params)
        self.scheduler = self._make_scheduler(self.stage_plan[stage - 1])
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.dtype == torch.float16)
        self.ema = self._make_ema() if self.cfg.ema > 0 else None

    def stage_of(self, epoch: int) -> int:
        """The training stage (1-based) of ``epoch``; LinearInit epochs count as stage 1."""
        end = self.cfg.linear_init
        for stage, epochs in enumerate(self.stage_plan, start=1):
            end += epochs
            if epoch <= end:
                return stage
        return len(self.stage_plan)

    def _last_epoch_of_stage(self, stage: int) -> int:
        return self.cfg.linear_init + sum(self.stage_plan[:stage])

    def _make_ema(self) -> AveragedModel:
        return AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(self.cfg.ema), use_buffers=True)

    def _eval_loader(self, dataset: ImageLabelDataset) -> DataLoader[dict[str, torch.Tensor]]:
        """In-order loader; under torchrun each rank reads its shard (:func:`predict_rows` gathers them)."""
        sampler = DistributedSampler(dataset, shuffle=False) if self.world.distributed else None
        return DataLoader(dataset, batch_size=self.cfg.eval_batch_size, shuffle=False, sampler=sampler,
                          num_workers=self.cfg.workers, pin_memory=self.device.type == "cuda",
                          collate_fn=collate_readable)

    def _make_optimizer(self, params: list[dict[str, Any]]) -> torch.optim.Optimizer:
        c = self.cfg
        return build_optimizer(c.optimizer, params, c.lr, weight_decay=c.weight_decay, momentum=c.momentum)

    def _make_scheduler(self, epochs: int) -> torch.optim.lr_scheduler.LRScheduler | None:
        return build_scheduler(self.cfg.scheduler, self.optimizer, epochs * self.steps_per_epoch)

    # ----------------------------------------------------------------- metadata and checkpoints
    def meta(self, epoch: int, metrics: dict[str, Any]) -> ModelMeta:
        """The checkpoint metadata for the current model."""
        return ModelMeta(
            classes=list(self.classes), arch=self.cfg.arch, image_size=self.cfg.image_size, lgconv=self.cfg.lgconv,
            head=self.model.head_meta(),
            method=self.cfg.method, method_hparams=self.method.hparams_dict(),
            data={
                "name": self.dataset.name, "source": self.dataset.source, "fingerprint": self.splits.fingerprint,
                # the --observed value (export rebuilds the split from it), and the labels it gave
                "observed": self.cfg.observed, "observed_labels": str(self.splits.observed),
                "protocol_seed": self.cfg.protocol_seed,
                "val_fraction": self.cfg.val_fraction, "num_train": len(self.splits.train),
                "num_val": len(self.splits.val), "observed_file": OBSERVED_FILE,
                "observed_sha256": self.protocol_sha256,
            },
            metrics=metrics, epoch=epoch,
        )

    def save_last(self, epoch: int) -> None:
        """Write last.pt with everything ``--resume`` needs (rank 0; the state is the same on every rank)."""
        if not self.world.is_main:
            return
        training = {
            "epoch": epoch, "best_map": self.best_map, "best_epoch": self.best_epoch,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema else None,
            "method": self.method.state_dict(),
            "rng": capture_rng(),
            "stage_history": self.stage_history,
        }
        if self.linear is not None:
            training["linear"] = self.linear.state_dict()
        save_checkpoint(self.run_dir / LAST, self.model.state_dict(), self.meta(epoch, {}), training)

    def _load_shared(self, path: Path) -> Checkpoint:
        """Rank 0 reads the checkpoint and sends it to the other ranks (nodes need not share the run folder)."""
        if not self.world.distributed:
            return load_checkpoint(path, map_location=self.device)
        barrier()  # rank 0 has finished writing it
        return broadcast_object(load_checkpoint(path, map_location="cpu") if self.world.is_main else None)

    def _load_resume_state(self) -> None:
        path = self.run_dir / LAST
        ckpt = self._load_shared(path)
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
        self.optimizer.load_state_dict(t["optimizer"])
        if self.scheduler is not None and t["scheduler"] is not None:
            self.scheduler.load_state_dict(t["scheduler"])
        self.scaler.load_state_dict(t["scaler"])
        if self.ema is not None and t["ema"] is not None:
            self.ema.load_state_dict(t["ema"])
        restore_rng(t["rng"])
        self._linear_resume = t.get("linear")
        self.best_map = float(t["best_map"])
        self.best_epoch = int(t["best_epoch"])
        # Drop metric lines of epochs that ran after this checkpoint (they will run again).
        metrics = self.run_dir / METRICS_FILE
        barrier()  # every rank has read last.pt
        if metrics.exists() and self.world.is_main:
            lines = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in lines if json.loads(ln).get("epoch", 0) < self.start_epoch]
            metrics.write_text("".join(ln + "\n" for ln in kept))
        log(f"resuming {self.run_dir} at epoch {self.start_epoch}/{self.total_epochs} "
            f"(best val mAP so far {self.best_map:.2f} at epoch {self.best_epoch})")

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
        is the method's step (:mod:`train.training_step`), in ``DistributedDataParallel`` under torchrun.

        A non-finite loss skips the update (the caller raises)."""
        if self.step_module is None:  # built on first use: LinearInit's wrapper is gone by then
            self.step_module = wrap_training_step(self.model, self.method, self.device)
        with self.precision.autocast():
            out = run_training_step(self.step_module, batch)
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(out.loss):
            return out
        self.scaler.scale(out.loss).backward()  # under torchrun DDP averages the gradients during backward
        if self.cfg.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            trainable = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(trainable, self.cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        return out

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training set; returns mean loss, method logs and throughput."""
        self.model.train()
        self.loader_generator.manual_seed(self.cfg.seed * 1_000_003 + epoch)
        if self.train_sampler is not None and self.seeded_train_set is not None:
            self.train_sampler.set_epoch(epoch)
            self.seeded_train_set.set_epoch(epoch)
        sums: dict[str, float] = {}
        seen, start = 0, time.perf_counter()
        bar = tqdm(self.train_loader, desc=f"epoch {epoch}/{self.total_epochs}", leave=False,
                   disable=not self.progress, file=sys.stderr, unit="batch")
        for step, raw in enumerate(bar):
            readable = self.skips.take(raw, self.train_set.paths)
            if self._all_unreadable("images" not in readable):
                continue
            batch = self._to_device(readable)
            out = self.train_step(batch)
            loss = out.loss.item()
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at epoch {epoch}, step {step + 1}; try a lower "
                                         "--lr, --clip-grad 1.0, or --amp off")
            n = batch["images"].shape[0]
            seen += n
            sums["loss"] = sums.get("loss", 0.0) + loss * n
            for key, value in out.logs.items():
                sums[key] = sums.get(key, 0.0) + float(value) * n
            rate = seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{sums['loss'] / seen:.4f}", img_s=f"{rate:.0f}")
        elapsed = time.perf_counter() - start
        self._share_rank0_buffers()
        sums = sum_over_ranks({**sums, "_seen": float(seen)})  # every rank's images: global means and img/s
        seen = int(sums.pop("_seen"))
        stats = {k: v / max(seen, 1) for k, v in sums.items()}
        stats.update(train_images_per_s=seen / elapsed if elapsed > 0 else 0.0, train_seconds=elapsed,
                     lr=self.optimizer.param_groups[0]["lr"])
        return stats

    def _share_rank0_buffers(self) -> None:
        """Under torchrun: rank 0's BatchNorm running statistics (model and EMA) on every rank. DDP broadcasts
        them at the start of each forward, so after an epoch's last step the other ranks still hold their own;
        the sharded evaluation, EMA selection and checkpoints need the one set rank 0 keeps."""
        broadcast_buffers(self.model)
        if self.ema is not None:
            broadcast_buffers(self.ema)

    def _all_unreadable(self, empty: bool) -> bool:
        """True when this step has no readable image (on any rank, under torchrun: then every rank skips it)."""
        if not self.world.distributed:
            return empty
        return sum_over_ranks({"empty": float(empty)})["empty"] > 0

    def _predict(self, model: nn.Module, loader: DataLoader[dict[str, torch.Tensor]], desc: str) -> Rows:
        """Logits of ``model`` (eval mode) for every row of ``loader``'s dataset (unreadable images missing)."""
        was_training = model.training
        model.eval()
        rows = predict_rows(model, loader, len(self.classes), self.device, self.precision.autocast,
                            self.channels_last, self.skips, desc, self.progress)
        model.train(was_training)
        return rows

    def predict_train(self, augment: bool) -> torch.Tensor:
        """Probabilities (N_train, C) of the current model over the training set, in dataset order (an unreadable
        image's row holds its observed labels)."""
        transform = self.train_set.transform if augment else self.eval_transform
        dataset = ImageLabelDataset(self.splits.train, transform, self.splits.train_observed)
        rows = self._predict(self.model, self._eval_loader(dataset), "predict train")
        probs = torch.sigmoid(rows.values)
        probs[~rows.present] = dataset.observed[~rows.present]
        return probs

    def _evaluate_loader(
        self, model: nn.Module, loader: DataLoader[dict[str, torch.Tensor]], desc: str
    ) -> dict[str, Any]:
        rows = self._predict(model, loader, desc)
        assert isinstance(loader.dataset, ImageLabelDataset)
        if rows.missing:
            log(f"{desc}: {rows.missing} unreadable image(s) left out of the metrics")
        labels = loader.dataset.full[rows.present]
        return evaluate(rows.values[rows.present].numpy(), labels.numpy(), self.classes)

    def fit(self) -> dict[str, Any]:
        """Train from ``start_epoch`` through the LinearInit phase (if any) and ``cfg.epochs`` end-to-end epochs,
        then test the best checkpoint; returns the summary."""
        cfg = self.cfg
        if self.world.is_main:
            self._write_protocol_file(self.resumed)
            self._write_config()
        log(f"global batch {cfg.batch_size} = {self.world.size} process(es) x {self.batch_per_process}"
            + (" (torchrun, gradients averaged over the processes)" if self.world.distributed else ""))
        return self._fit_epochs()

    def _write_config(self) -> None:
        cfg = self.cfg
        (self.run_dir / CONFIG_FILE).write_text(json.dumps(
            {"config": cfg.to_dict(), "resolved": {
                "world_size": self.world.size, "global_batch_size": cfg.batch_size,
                "batch_size_per_process": self.batch_per_process,
                "device": str(self.device), "amp": str(self.precision.dtype), "channels_last": self.channels_last,
                "method_hparams": self.method.hparams_dict(), "torch": torch.__version__,
                "dataset": self.dataset.name, "source": self.dataset.source, "fingerprint": self.splits.fingerprint,
                "splits": self.splits.summary(), "notes": self.dataset.notes,
                "observed_file": OBSERVED_FILE, "observed_sha256": self.protocol_sha256,
                "protocol_seed": self.splits.seed,
            }}, indent=2) + "\n")

    def _fit_epochs(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.start_epoch == 1:
            log(f"run {self.run_dir}: {cfg.method} on {self.dataset.name} ({self.splits.summary()}), {cfg.arch} "
                f"@{cfg.image_size}px, {self.device}" + (f", {self.precision.dtype}" if self.precision.dtype else ""))
        total_epochs = self.total_epochs
        if self.start_epoch == 1 and len(self.stage_plan) > 1:
            log(f"{cfg.method} trains in {len(self.stage_plan)} stages of {', '.join(map(str, self.stage_plan))} "
                "epochs; each stage starts from the previous stage's best weights")
        if self.start_epoch <= cfg.linear_init:
            log(f"LinearInit: {cfg.linear_init} epochs on fixed {cfg.arch} features, "
                + (f"then {cfg.epochs} end to end" if cfg.epochs else "no end-to-end phase (linear probe)"))
            self.linear = LinearPhase(self)
            if self._linear_resume is not None:
                self.linear.load_state_dict(self._linear_resume)
        for epoch in range(self.start_epoch, total_epochs + 1):
            linear = self.linear if epoch <= cfg.linear_init else None
            stats = linear.train_epoch(epoch) if linear is not None else self.train_epoch(epoch)
            stats.update(self.method.on_epoch_end(EpochEndContext(
                epoch=epoch, predict_train=linear.predict_train if linear is not None else self.predict_train,
                train_full_labels=torch.from_numpy(self.splits.train.labels.astype(np.float32)),
            )))
            if linear is not None:
                val = linear.validate()
                linear.remember_if_best(_score(val["mAP"]))
            else:
                val = self._evaluate_loader(self.model, self.val_loader, "val")
            candidates: list[tuple[str, nn.Module, dict[str, Any]]] = [("model", self.model, val)]
            if self.ema is not None and linear is None:
                ema_val = self._evaluate_loader(self.ema.module, self.val_loader, "val ema")
                candidates.append(("ema", self.ema.module, ema_val))
            which, chosen, chosen_val = max(candidates, key=lambda c: _score(c[2]["mAP"]))
            stage = self.stage_of(epoch)
            record = {"epoch": epoch, **({"stage": stage} if len(self.stage_plan) > 1 else {}),
                      **{k: round(v, 6) for k, v in stats.items()},
                      "val_mAP": val["mAP"], "val_OF1": val["OF1"], "val_CF1": val["CF1"]}
            if len(candidates) > 1:
                record["val_mAP_ema"] = candidates[1][2]["mAP"]
            improved = _score(chosen_val["mAP"]) > self.best_map
            if improved:
                self.best_map, self.best_epoch = _score(chosen_val["mAP"]), epoch
                val_summary = {k: v for k, v in chosen_val.items() if k != "per_class_AP"}
                if self.world.is_main:
                    save_checkpoint(self.run_dir / BEST, chosen.state_dict(),
                                    self.meta(epoch, {"val": val_summary, "weights": which}))
            record["best"] = improved
            if self.world.is_main:
                with (self.run_dir / METRICS_FILE).open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
            if linear is not None and epoch == cfg.linear_init:  # phase 1 over: its best epoch starts phase 2
                linear.restore_best()
                self.linear = None
                if self.ema is not None:  # average from the restored weights, not from the random head
                    self.ema = self._make_ema()
            if stage < len(self.stage_plan) and epoch == self._last_epoch_of_stage(stage):
                self._next_stage(stage + 1)
            self.save_last(epoch)
            log(f"epoch {epoch}/{total_epochs}{' (linear)' if linear is not None else ''}  loss {stats['loss']:.4f}"
                f"  val mAP {val['mAP']:.2f}"
                + (f"  (ema {record['val_mAP_ema']:.2f})" if "val_mAP_ema" in record else "")
                + (f"  {stats['train_images_per_s']:.0f} img/s" if "train_images_per_s" in stats else "")
                + ("  *best*" if improved else ""))
        return self.finish()

    def _next_stage(self, stage: int) -> None:
        """End the current stage: keep its best checkpoint as ``best-stageK.pt``, load its best weights, then start
        ``stage`` with a fresh optimiser, schedule and EMA and its own best-epoch selection."""
        finished = stage - 1
        best_path = self.run_dir / BEST
        if self.world.is_main:
            shutil.copyfile(best_path, self.run_dir / f"best-stage{finished}.pt")
        best = self._load_shared(best_path)
        self.model.load_state_dict(best.model)
        self.stage_history.append({"stage": finished, "best_epoch": self.best_epoch, "val_mAP": self.best_map,
                                   "weights": best.meta.metrics.get("weights", "model")})
        self.method.start_stage(stage)
        self._fresh_optimisation(stage)
        self.best_map, self.best_epoch = -math.inf, 0
        log(f"stage {finished} done (best val mAP {self.stage_history[-1]['val_mAP']:.2f} at epoch "
            f"{self.stage_history[-1]['best_epoch']}); stage {stage} starts from those weights")

    def finish(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on val and test, store the metrics in best.pt, write summary.json."""
        best = self._load_shared(self.run_dir / BEST)
        model = model_from_meta(best.meta).to(self.device)
        model.load_state_dict(best.model)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        metrics: dict[str, Any] = {"val": self._evaluate_loader(model, self.val_loader, "val (best)")}
        if self.splits.test is not None:
            test_loader = self._eval_loader(ImageLabelDataset(self.splits.test, self.eval_transform))
            metrics["test"] = self._evaluate_loader(model, test_loader, "test (best)")
        else:
            log("no test split in this dataset: reporting validation metrics only")
        if not np.array_equal(self.splits.train_observed, self.splits.train.labels):
            # Cole et al.'s label recovery: how well the model ranks the training set's hidden labels
            train_loader = self._eval_loader(ImageLabelDataset(self.splits.train, self.eval_transform))
            metrics["train_recovery"] = self._evaluate_loader(model, train_loader, "train (label recovery)")
        compact = {k: {m: v for m, v in d.items() if m != "per_class_AP"} for k, d in metrics.items()}
        compact["weights"] = best.meta.metrics.get("weights", "model")
        best.meta.metrics = compact
        if self.world.is_main:
            save_checkpoint(self.run_dir / BEST, best.model, best.meta)
        summary = {
            "run": str(self.run_dir), "method": self.cfg.method, "dataset": self.dataset.name,
            "observed": str(self.splits.observed), "arch": self.cfg.arch, "image_size": self.cfg.image_size,
            "epochs": self.cfg.epochs, "best_epoch": self.best_epoch, **metrics,
        }
        if self.stage_history:
            summary["stages"] = [*self.stage_history, {"stage": len(self.stage_plan), "best_epoch": self.best_epoch,
                                                       "val_mAP": self.best_map}]
        if self.world.is_main:
            (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        line = f"best epoch {self.best_epoch}: val mAP {metrics['val']['mAP']:.2f}"
        if "test" in metrics:
            t = metrics["test"]
            line += f" | test mAP {t['mAP']:.2f}  OF1 {t['OF1']:.2f}  CF1 {t['CF1']:.2f}"
        if "train_recovery" in metrics:
            line += f" | train label recovery mAP {metrics['train_recovery']['mAP']:.2f}"
        log(line)
        log(f"saved {self.run_dir / BEST}  (export it with: python -m export {self.run_dir})")
        return summary


def _score(value: float) -> float:
    return -math.inf if value is None or math.isnan(value) else float(value)
