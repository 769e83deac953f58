"""One end-to-end epoch: the training data, the training step (one module DistributedDataParallel wraps; the method's
buffers outside it: docs/distributed.md), the optimisation (:data:`OPTIMIZERS`, :data:`SCHEDULERS`, scaler, EMA) and
the step loop, which reads device values only every :data:`HOST_SYNC_EVERY` steps and at the end of the epoch."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from models.data.dataset import ImageLabelDataset, SkipReporter, collate_readable
from models.registry import Row, Table
from train.distributed import PerSampleSeeded, current_world, sum_over_ranks
from train.methods import LossOutput, Method

if TYPE_CHECKING:
    from train.config import TrainConfig

# ----------------------------------------------------------------- the training step

IMAGES = "images"  # the standard training view; extra views and extra inputs are "images_<name>"


def _output_key(kind: str, input_key: str) -> str:
    """``images`` -> ``logits``, ``images_strong`` -> ``logits_strong`` (``kind``: logits or embeddings)."""
    return kind + input_key[len(IMAGES):]


def method_step(model: Callable[..., Any], method: Method, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Run ``model`` as ``method`` asks and return its loss on ``batch``: ``images`` and the extra views in one call
    (their logits join the batch as ``logits`` / ``logits_<name>``, embeddings likewise), then the method's extra model
    inputs one call each."""
    views = [IMAGES, *sorted(k for k in batch if k.startswith(IMAGES + "_"))]
    n = batch[IMAGES].shape[0]
    x = torch.cat([batch[k] for k in views]) if len(views) > 1 else batch[IMAGES]
    if method.needs_embeddings:
        logits, embeddings = model.forward_embeddings(x)
    else:
        logits, embeddings = model(x), None
    inputs = dict(batch)
    for i, key in enumerate(views):
        inputs[_output_key("logits", key)] = logits[i * n:(i + 1) * n].float()
        if embeddings is not None:
            inputs[_output_key("embeddings", key)] = embeddings[i * n:(i + 1) * n]
    for key, value in method.extra_model_inputs(inputs).items():
        inputs[key] = value
        if key.startswith(IMAGES + "_"):
            inputs[_output_key("logits", key)] = model(value).float()
    return method.training_loss(inputs["logits"], inputs)


class TrainingStep(nn.Module):
    """``forward(batch)`` = :func:`method_step` as a ``(loss, logs)`` tuple, so DDP finds the loss."""

    def __init__(self, model: nn.Module, method: Method) -> None:
        super().__init__()
        self.model = model
        self.method_parameters = nn.ParameterList(list(method.parameters()))
        self._method = (method,)  # a tuple: not registered as a submodule, so DDP does not see its buffers

    @property
    def method(self) -> Method:
        """The training method whose step this module runs."""
        return self._method[0]

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """The method's loss and its values to log for ``batch``."""
        out = method_step(self.model, self.method, batch)
        return out.loss, out.logs


def wrap_training_step(model: nn.Module, method: Method, device: torch.device) -> nn.Module:
    """The step module of ``model`` and ``method``: plain in one process, ``DistributedDataParallel`` under torchrun
    (``find_unused_parameters`` only for a method that ``leaves_parameters_unused``). Build a new one whenever the
    trainable parameters change, dropping the old one first."""
    step = TrainingStep(model, method)
    if not current_world().distributed:
        return step
    return DistributedDataParallel(step, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=method.leaves_parameters_unused)


def run_training_step(step: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Run the (wrapped or plain) step module on ``batch``; the method's :class:`LossOutput`."""
    loss, logs = step(batch)
    return LossOutput(loss, dict(logs))


# ----------------------------------------------------------------- optimisers and schedules

Groups = list[dict[str, Any]]


def fusable(groups: Iterable[dict[str, Any]]) -> bool:
    """True when every parameter of ``groups`` is a float tensor on CPU or CUDA (PyTorch's fused optimisers)."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def _adam(groups: Groups, lr: float, weight_decay: float, momentum: float, fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay, fused=fused)


def _adamw(groups: Groups, lr: float, weight_decay: float, momentum: float,
           fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fused)


def _sgd(groups: Groups, lr: float, weight_decay: float, momentum: float, fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=True, fused=fused)


#: ``--optimizer``: name, help, builder ``(groups, lr, weight_decay, momentum, fused) -> optimiser``.
OPTIMIZERS: Table[Callable[..., torch.optim.Optimizer]] = Table("optimizer", [
    Row("adam", "Adam (the references')", _adam),
    Row("adamw", "Adam with decoupled weight decay", _adamw),
    Row("sgd", "SGD with Nesterov momentum (--momentum)", _sgd),
])


def build_optimizer(name: str, groups: Groups, lr: float, weight_decay: float = 0.0,
                    momentum: float = 0.9) -> torch.optim.Optimizer:
    """An optimiser ``name`` (:data:`OPTIMIZERS`) over ``groups``, fused when ``fusable``."""
    make = OPTIMIZERS[name]
    return make(groups, lr, weight_decay, momentum, True if fusable(groups) else None)


ONECYCLE_WARMUP = 0.2  # share of the steps spent warming up to the peak learning rate
Schedule = torch.optim.lr_scheduler.LRScheduler


def _constant(optimizer: torch.optim.Optimizer, total_steps: int) -> Schedule | None:
    return None


def _cosine(optimizer: torch.optim.Optimizer, total_steps: int) -> Schedule | None:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def _one_cycle(optimizer: torch.optim.Optimizer, total_steps: int) -> Schedule | None:
    if total_steps <= 2:
        return None
    max_lr = [group["lr"] for group in optimizer.param_groups]
    warmup = max(ONECYCLE_WARMUP, 2.0 / total_steps)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=total_steps, pct_start=warmup)


#: ``--scheduler``: name, help, builder ``(optimizer, total_steps) -> schedule or None``.
SCHEDULERS: Table[Callable[[torch.optim.Optimizer, int], Schedule | None]] = Table("scheduler", [
    Row("none", "the learning rate stays at --lr", _constant),
    Row("onecycle", "one cycle: 20% of the steps warming up to --lr, then down", _one_cycle),
    Row("cosine", "cosine decay from --lr", _cosine),
])


def build_scheduler(name: str, optimizer: torch.optim.Optimizer, total_steps: int) -> Schedule | None:
    """The per-step learning-rate schedule ``name`` (:data:`SCHEDULERS`) over ``total_steps``; None = constant. Short
    runs get a warm-up of at least 2 steps (OneCycleLR divides by zero otherwise), one or two steps keep the peak
    rate."""
    make = SCHEDULERS[name]
    return None if total_steps <= 0 else make(optimizer, total_steps)


# ----------------------------------------------------------------- a stage's optimisation

def model_param_groups(model: nn.Module, lr: float, head_lr_mult: float = 1.0) -> list[dict[str, Any]]:
    """The model's trainable parameters as optimiser groups (the head at ``lr * head_lr_mult``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    head = getattr(getattr(model, "module", model), "head", None)
    if head_lr_mult == 1.0 or not isinstance(head, nn.Module):
        return [{"params": trainable}]
    in_head = {id(p) for p in head.parameters()}
    groups = [{"params": [p for p in trainable if id(p) not in in_head]},
              {"params": [p for p in trainable if id(p) in in_head], "lr": lr * head_lr_mult}]
    return [g for g in groups if g["params"]]


class Optimisation:
    """A stage's optimiser, per-step schedule, fp16 gradient scaler and weight EMA (``cfg.ema`` > 0)."""

    def __init__(self, cfg: TrainConfig, model: nn.Module, method: Method, steps: int,
                 amp_dtype: torch.dtype | None, device: torch.device) -> None:
        self.model = model
        self.ema_decay = cfg.ema
        self.clip_grad = cfg.clip_grad
        groups = [*model_param_groups(model, cfg.lr, cfg.head_lr_mult), *method.param_groups(cfg.lr)]
        self.optimizer = build_optimizer(cfg.optimizer, groups, cfg.lr, weight_decay=cfg.weight_decay,
                                         momentum=cfg.momentum)
        self.scheduler = build_scheduler(cfg.scheduler, self.optimizer, steps)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        self.ema: AveragedModel | None = None
        self.restart_ema()

    def restart_ema(self) -> None:
        """Average from the model's current weights on (e.g. after LinearInit restored its best head)."""
        if self.ema_decay > 0:
            self.ema = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(self.ema_decay), use_buffers=True)

    def update(self, loss: torch.Tensor) -> None:
        """Backward ``loss``, clip, and step the optimiser, the scaler, the schedule and the EMA."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            trainable = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(trainable, self.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)

    @property
    def lr(self) -> float:
        """The first group's current learning rate."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        """Resume state of the optimiser, schedule, scaler and EMA."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                "scaler": self.scaler.state_dict(), "ema": self.ema.state_dict() if self.ema else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])


# ----------------------------------------------------------------- the training data and the step loop

HOST_SYNC_EVERY = 25  # steps between two reads of the running totals on the host
DIVERGED_HINT = "try a lower --lr, --clip-grad 1.0, or --amp off"  # ends the error of a loss that was not finite


@dataclass
class TrainData:
    """The training set and its loader: seeded shuffle, rank-independent augmentation, sharded under torchrun."""

    dataset: ImageLabelDataset
    loader: DataLoader[dict[str, torch.Tensor]]
    generator: torch.Generator
    seed: int
    skips: SkipReporter  # the run's report of unreadable images (each once)
    sampler: DistributedSampler[Any] | None = None
    seeded: PerSampleSeeded | None = None

    def start_epoch(self, epoch: int) -> None:
        """Select ``epoch``'s shuffle and augmentation seeds."""
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)
        if self.sampler is not None and self.seeded is not None:
            self.sampler.set_epoch(epoch)
            self.seeded.set_epoch(epoch)


def build_train_data(dataset: ImageLabelDataset, batch_per_process: int, global_batch: int, seed: int,
                     workers: int, pin_memory: bool, skips: SkipReporter) -> TrainData:
    """The loader of ``dataset``; the last incomplete batch is dropped unless the set is below one batch."""
    generator = torch.Generator()
    sampler: DistributedSampler[Any] | None = None
    seeded: PerSampleSeeded | None = None
    if current_world().distributed:
        seeded = PerSampleSeeded(dataset, seed)
        sampler = DistributedSampler(seeded, shuffle=True, seed=seed)
    loader = DataLoader(
        seeded or dataset, batch_size=batch_per_process, shuffle=sampler is None, sampler=sampler,
        generator=generator if sampler is None else None, num_workers=workers,
        drop_last=len(dataset) > global_batch, pin_memory=pin_memory, collate_fn=collate_readable)
    return TrainData(dataset, loader, generator, seed, skips, sampler, seeded)


def all_ranks_empty(empty: bool) -> bool:
    """True when some rank has no readable image this step (every rank then skips it together)."""
    if not current_world().distributed:
        return empty
    return sum_over_ranks({"empty": float(empty)})["empty"] > 0


class EpochTotals:
    """Batch-weighted sums of an epoch's loss and logs on the device, and the first non-finite step."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.sums: dict[str, torch.Tensor | float] = {}
        self.seen = 0
        self._bad_step: torch.Tensor | None = None  # -1 while every loss was finite
        self._bad_loss: torch.Tensor | None = None

    def add(self, out: LossOutput, images: int, step: int) -> None:
        """Count step ``step`` (1-based) of ``images`` images; no host sync."""
        loss = out.loss.detach().float()
        if self._bad_step is None:
            self._bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), device=loss.device)
        first_bad = ~torch.isfinite(loss) & (self._bad_step < 0)
        self._bad_step = torch.where(first_bad, step, self._bad_step)
        self._bad_loss = torch.where(first_bad, loss, self._bad_loss)
        self.seen += images
        for key, value in [("loss", loss), *out.logs.items()]:
            weighted = (value.detach().float() if isinstance(value, torch.Tensor) else float(value)) * images
            self.sums[key] = self.sums.get(key, 0.0) + weighted

    def raise_if_diverged(self) -> None:
        """``FloatingPointError`` naming the first non-finite step on any rank (a host sync)."""
        step = -1 if self._bad_step is None else int(self._bad_step)
        anywhere = step >= 0
        if current_world().distributed:
            anywhere = sum_over_ranks({"bad": float(anywhere)})["bad"] > 0
        if not anywhere:
            return
        where = (f"loss is {float(self._bad_loss)} at epoch {self.epoch}, step {step}"  # type: ignore[arg-type]
                 if step >= 0 else f"the loss of another process is not finite in epoch {self.epoch}")
        raise FloatingPointError(f"{where}; {DIVERGED_HINT}")

    def mean_loss(self) -> float:
        """This process's mean loss so far (a host sync)."""
        return float(self.sums.get("loss", 0.0)) / max(self.seen, 1)

    def means(self) -> tuple[dict[str, float], int]:
        """The epoch's means over every rank (sums divided by images) and the number of images (one host sync)."""
        tensors = {k: v for k, v in self.sums.items() if isinstance(v, torch.Tensor)}
        read = dict(zip(tensors, torch.stack(list(tensors.values())).tolist(), strict=True)) if tensors else {}
        totals = {k: float(read.get(k, v)) for k, v in self.sums.items()}  # type: ignore[arg-type]
        totals = sum_over_ranks({**totals, "_seen": float(self.seen)})
        seen = totals.pop("_seen")
        return {k: v / max(seen, 1.0) for k, v in totals.items()}, int(seen)


def to_device(batch: dict[str, torch.Tensor], device: torch.device, channels_last: bool) -> dict[str, torch.Tensor]:
    """A batch on ``device`` (non-blocking), its image views in the channels-last layout when asked."""
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if channels_last:
        for key in out:
            if key.startswith("images"):
                out[key] = out[key].contiguous(memory_format=torch.channels_last)
    return out


def train_epoch(data: TrainData, epoch: int, step: Callable[[dict[str, torch.Tensor]], LossOutput],
                to_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]], desc: str,
                progress: bool) -> dict[str, float]:
    """One pass over ``data``; returns the mean loss and logs over every rank, images/s and seconds."""
    data.start_epoch(epoch)
    totals = EpochTotals(epoch)
    start = time.perf_counter()
    bar = tqdm(data.loader, desc=desc, leave=False, disable=not progress, file=sys.stderr, unit="batch")
    for index, raw in enumerate(bar):
        readable = data.skips.take(raw, data.dataset.paths)
        if all_ranks_empty("images" not in readable):
            continue
        batch = to_device(readable)
        totals.add(step(batch), batch["images"].shape[0], index + 1)
        if index == 0 or (index + 1) % HOST_SYNC_EVERY == 0:  # the first step: a run that diverges at once stops
            totals.raise_if_diverged()
            rate = totals.seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{totals.mean_loss():.4f}", img_s=f"{rate:.0f}")
    elapsed = time.perf_counter() - start
    totals.raise_if_diverged()
    stats, images = totals.means()
    stats.update(train_images_per_s=images / elapsed if elapsed > 0 else 0.0, train_seconds=elapsed)
    return stats
