"""One training step: the model calls a method asks for, then its loss; as a module, so that torchrun training
wraps the whole step in DistributedDataParallel.

:func:`method_step` is the only place that runs the model for a method (:mod:`train.methods.base` says what a
method may ask for: extra views in the same call, per-class embeddings, further inputs in calls of their own).
A step may thus call the model more than once (PU-MLC's mixup pass) and use the method's own parameters
(ROLE's label matrix, LAC's projector). Wrapping the model alone would hide those calls from DDP's reducer;
wrapping :class:`TrainingStep` puts every model call of a step inside one DDP forward, and DDP then averages the
gradients of the model and of the method's parameters with its bucketed all-reduce, overlapped with backward.

What DDP sees (parameters it reduces, buffers it broadcasts from rank 0 at each forward) is the model and
the method's *parameters* only: the method module is held outside the module tree, so its buffers
(EM-APL's pseudo-label matrix, OPML-SP's corrections, LAC's queue) are never broadcast; they stay identical
on all ranks by construction (see docs/distributed.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.distributed import current_world
from train.methods import LossOutput, Method

IMAGES = "images"  # the standard training view; extra views and extra inputs are "images_<name>"


def _output_key(kind: str, input_key: str) -> str:
    """``images`` -> ``logits``, ``images_strong`` -> ``logits_strong`` (``kind``: logits or embeddings)."""
    return kind + input_key[len(IMAGES):]


def method_step(model: Callable[..., Any], method: Method, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Run ``model`` as ``method`` asks and return its loss on ``batch``.

    ``images`` and every extra view (``images_<name>`` keys of the batch) go through the model in one call
    (``forward_embeddings`` when the method needs per-class embeddings); their float32 logits (and embeddings)
    join the batch as ``logits`` / ``logits_<name>`` (``embeddings`` / ``embeddings_<name>``). Then the method's
    :meth:`~train.methods.base.Method.extra_model_inputs` run through the model one call each, and
    :meth:`~train.methods.base.Method.loss` gets the logits of ``images`` and the whole batch."""
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
    """``forward(batch)`` = :func:`method_step` of the model and the method as a ``(loss, logs)`` tuple, so that
    DDP finds the loss tensor in the output."""

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
    """The step module of ``model`` and ``method``: plain in one process, in ``DistributedDataParallel`` under
    torchrun (``device_ids=[rank's GPU]`` on CUDA, None on CPU).

    ``find_unused_parameters`` is on only for a method that declares ``leaves_parameters_unused`` (LAC's projector
    is unused in stage 1, and on a rank that selects no pair): DDP then traverses the autograd graph after every
    forward to mark what was not used, and a parameter unused on every rank keeps ``grad=None`` as in one process.
    Every other step uses all of its trainable parameters, so the traversal is skipped. Build a new wrapper
    whenever the set of trainable parameters changes (a new stage, another phase): DDP registers the parameters
    it reduces when it is built, and two live wrappers of the same parameters must not exist (drop the old one
    first)."""
    step = TrainingStep(model, method)
    if not current_world().distributed:
        return step
    return DistributedDataParallel(step, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=method.leaves_parameters_unused)


def run_training_step(step: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Run the (wrapped or plain) step module on ``batch``; the method's :class:`LossOutput`."""
    loss, logs = step(batch)
    return LossOutput(loss, dict(logs))
