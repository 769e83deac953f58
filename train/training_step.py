"""One training step as a module, so that torchrun training wraps the whole step in DistributedDataParallel.

A method's step may call the model more than once (PU-MLC's mixup pass), call other entry points
(LAC's ``forward_embeddings``) and use the method's own parameters (ROLE's label matrix, LAC's projector).
Wrapping the model alone would hide those calls from DDP's reducer; wrapping :class:`TrainingStep` puts
every model call of a step inside one DDP forward, and DDP then averages the gradients of the model and of
the method's parameters with its bucketed all-reduce, overlapped with backward.

What DDP sees (parameters it reduces, buffers it broadcasts from rank 0 at each forward) is the model and
the method's *parameters* only: the method module is held outside the module tree, so its buffers
(EM-APL's pseudo-label matrix, OPML-SP's corrections, LAC's queue) are never broadcast; they stay identical
on all ranks by construction (see docs/distributed.md).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.distributed import current_world
from train.methods import LossOutput, Method


class TrainingStep(nn.Module):
    """``forward(batch)`` = ``method.training_step(model, batch)`` as a ``(loss, logs)`` tuple, so that DDP finds
    the loss tensor in the output."""

    def __init__(self, model: nn.Module, method: Method) -> None:
        super().__init__()
        self.model = model
        self.method_parameters = nn.ParameterList(list(method.parameters()))
        self._method = (method,)  # a tuple: not registered as a submodule, so DDP does not see its buffers

    @property
    def method(self) -> Method:
        """The training method whose step this module runs."""
        return self._method[0]

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The method's loss and its values to log for ``batch``."""
        out = self.method.training_step(self.model, batch)
        return out.loss, out.logs


def wrap_training_step(model: nn.Module, method: Method, device: torch.device) -> nn.Module:
    """The step module of ``model`` and ``method``: plain in one process, in ``DistributedDataParallel`` under
    torchrun (``device_ids=[rank's GPU]`` on CUDA, None on CPU).

    ``find_unused_parameters=True``: a method may leave some trainable parameters out of a step (LAC's projector
    in stage 1) or use them on some ranks only (no selected pair on a rank); DDP then still reduces every bucket,
    and a parameter unused on every rank keeps ``grad=None`` as in one process (no optimiser or weight-decay
    step on it). Build a new wrapper whenever the set of trainable parameters changes (a new stage, another
    phase): DDP registers the parameters it reduces when it is built, and two live wrappers of the same
    parameters must not exist (drop the old one first)."""
    step = TrainingStep(model, method)
    if not current_world().distributed:
        return step
    return DistributedDataParallel(step, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=True)


def run_training_step(step: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Run the (wrapped or plain) step module on ``batch``; the method's :class:`LossOutput`."""
    loss, logs = step(batch)
    return LossOutput(loss, dict(logs))
