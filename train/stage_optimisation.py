"""What one training stage optimises with - optimiser, learning-rate schedule, gradient scaler, weight EMA - and
the update of one step. Each stage (and the end-to-end phase after LinearInit) starts a fresh one."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from train.config import TrainConfig
from train.methods import Method
from train.optimizer_factory import build_optimizer, build_scheduler


def model_param_groups(model: nn.Module, lr: float, head_lr_mult: float = 1.0) -> list[dict[str, Any]]:
    """The model's trainable parameters as optimiser groups: one group at ``lr``, or, with ``head_lr_mult`` != 1,
    the backbone at ``lr`` and the classification head (``model.head``, also inside DDP) at ``lr * head_lr_mult``.
    Empty groups are left out (``--trainable head`` trains the head alone)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    head = getattr(getattr(model, "module", model), "head", None)
    if head_lr_mult == 1.0 or not isinstance(head, nn.Module):
        return [{"params": trainable}]
    in_head = {id(p) for p in head.parameters()}
    groups = [{"params": [p for p in trainable if id(p) not in in_head]},
              {"params": [p for p in trainable if id(p) in in_head], "lr": lr * head_lr_mult}]
    return [g for g in groups if g["params"]]


class Optimisation:
    """The optimiser over the model's trainable parameters and the method's own groups, its per-step schedule
    over ``steps``, the fp16 gradient scaler (off otherwise) and the EMA of the weights (``cfg.ema`` > 0)."""

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
        """Backward ``loss`` (under torchrun DDP averages the gradients meanwhile), clip, step the optimiser,
        the scaler, the schedule and the EMA."""
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
