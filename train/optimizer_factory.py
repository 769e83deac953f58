"""The trainer's optimisers (Adam, AdamW, SGD with Nesterov momentum) on PyTorch's fused kernels, and its schedules:
two tables (:data:`OPTIMIZERS`, :data:`SCHEDULERS`) whose rows give the choices, the help and the builders."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from models.registry import Row, Table

Groups = list[dict[str, Any]]


def fusable(groups: Iterable[dict[str, Any]]) -> bool:
    """True when every parameter of ``groups`` is a floating-point tensor on CPU or CUDA, where PyTorch's fused
    Adam/AdamW/SGD steps run (one kernel over all tensors instead of a Python loop: 3 to 5x faster on CPU)."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def _adam(groups: Groups, lr: float, weight_decay: float, momentum: float,
          fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay, fused=fused)


def _adamw(groups: Groups, lr: float, weight_decay: float, momentum: float,
           fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fused)


def _sgd(groups: Groups, lr: float, weight_decay: float, momentum: float,
         fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=True, fused=fused)


#: ``--optimizer``: name, help, builder ``(groups, lr, weight_decay, momentum, fused) -> optimiser``.
OPTIMIZERS: Table[Callable[..., torch.optim.Optimizer]] = Table("optimizer", [
    Row("adam", "Adam (the references')", _adam),
    Row("adamw", "Adam with decoupled weight decay", _adamw),
    Row("sgd", "SGD with Nesterov momentum (--momentum)", _sgd),
])


def build_optimizer(name: str, groups: Groups, lr: float, weight_decay: float = 0.0,
                    momentum: float = 0.9) -> torch.optim.Optimizer:
    """An optimiser ``name`` (a row of :data:`OPTIMIZERS`) over the parameter ``groups``; fused when ``fusable``.

    A run resumed from a checkpoint of an unfused optimiser keeps that checkpoint's setting (``load_state_dict``
    restores each group's ``fused`` flag), so resuming stays exact.
    """
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
    """The per-step learning-rate schedule ``name`` (a row of :data:`SCHEDULERS`) over ``total_steps``; None =
    constant.

    ``onecycle`` warms up over 20% of the steps, and over at least one step: PyTorch's OneCycleLR divides by zero
    when the warm-up is exactly one step short (e.g. 5 steps in all), so short runs warm up for 2/total. A run of
    one or two steps has no room for a cycle and keeps the peak learning rate.
    """
    make = SCHEDULERS[name]
    return None if total_steps <= 0 else make(optimizer, total_steps)
