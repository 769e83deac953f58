"""The method interface and registry.

A method is an ``nn.Module`` (so any state it keeps - label matrices, pseudo-labels, queues - is saved in
checkpoints through ``state_dict`` and moved to the device with the model) with these hooks:

- :meth:`Method.training_step` - per batch: the loss (the default runs the model and calls :meth:`loss`).
  Under torchrun the whole step runs inside one DistributedDataParallel forward (``train.training_step``),
  which averages the gradients of the model and of the method's parameters over the ranks; collectives a
  step issues itself (EPR's global mean, LAC's gathers) must run in the same order on every rank;
- :meth:`Method.param_groups` - optional extra optimiser parameter groups (e.g. a label estimator);
- :meth:`Method.on_epoch_end` - optional step after each training epoch (e.g. pseudo-labelling), given a
  function that predicts the whole training set;
- :meth:`Method.extra_views` - optional extra augmented views of each training image (e.g. LAC's strong view),
  added to the batch under their own keys;
- :meth:`Method.stage_epochs` / :meth:`Method.start_stage` - optional training stages: the trainer runs them
  one after the other, each starting from the previous stage's best weights with a fresh optimiser, schedule
  and EMA (LAC's two stages);
- ``required_head`` - the classifier head the method needs (``"lem"`` for LAC), or None for any.

Hyperparameters are a dataclass per method (``Hparams``); the CLI sets them with ``--hp name=value``, and
``presets`` holds per-dataset published values. ``paper_settings`` holds the published optimisation settings
(batch size, learning rate, epochs, EMA, ...) per dataset family, applied by ``--preset paper``. Adding a
method = one file with a ``@register`` class plus its import line in ``train/methods/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from train.distributed import global_mean

LOG_EPSILON = 1e-5  # Cole et al.'s neg_log epsilon, used by every probability-space loss


def neg_log(x: torch.Tensor) -> torch.Tensor:
    """``-log(x + 1e-5)``, the reference code's negative log of a probability."""
    return -torch.log(x + LOG_EPSILON)


def prob_bce(p: torch.Tensor, target: torch.Tensor | float) -> torch.Tensor:
    """Element-wise BCE of probabilities ``p`` against (soft) ``target`` with :func:`neg_log`."""
    return target * neg_log(p) + (1.0 - target) * neg_log(1.0 - p)


def expected_positives_regulariser(p: torch.Tensor, k: float) -> torch.Tensor:
    """Cole et al.'s EPR term ``((mean_n sum_c p_nc - k) / C)^2`` (squared error, weight 1). Under torchrun the
    mean runs over the global batch (every rank's images), so the term equals the one-process value."""
    k_hat = global_mean(p.sum(dim=1))
    return ((k_hat - k) / p.shape[1]) ** 2


@dataclass
class MethodContext:
    """What a method may know about the training set when it is built."""

    num_classes: int
    num_train: int
    train_observed: torch.Tensor  # (N_train, C) float: 1 observed positive, 0 unobserved, -1 observed negative
    expected_positives: float  # k: mean number of positives per training image (Cole's lookup)
    epochs: int  # all training epochs of the run (LinearInit + every stage)
    dataset: str = ""  # dataset name, used to pick a preset
    batch_size: int = 32  # training batch size (sizes per-batch buffers such as LAC's queue)
    feature_width: int = 0  # width of the model's features / per-class embeddings (sizes projectors)


@dataclass
class LossOutput:
    """A training step's loss and scalar values to log (averaged per epoch)."""

    loss: torch.Tensor
    logs: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclass
class EpochEndContext:
    """Given to :meth:`Method.on_epoch_end`: the epoch (1-based) and a train-set predictor.

    ``predict_train(augment)`` returns the model's probabilities ``(N_train, C)`` in dataset order, in eval
    mode; ``augment=True`` uses the training transform (as EM-APL's reference code does).
    """

    epoch: int
    predict_train: Callable[[bool], torch.Tensor]
    train_full_labels: torch.Tensor | None = None  # for logging label-recovery only, never for training


@dataclass
class MethodHparams:
    """Base class of a method's hyperparameters (empty)."""


class Method(nn.Module):
    """Base class of a training method (loss + optional state and hooks)."""

    name: ClassVar[str] = ""
    Hparams: ClassVar[type[MethodHparams]] = MethodHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # TrainConfig fields per dataset family ("*": every family), applied over ``--preset paper``
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {}
    uses_full_labels: ClassVar[bool] = False  # oracle methods train on the annotated labels
    uses_observed_negatives: ClassVar[bool] = False  # reads batch["observed_negatives"] (the protocol's -1 entries)
    required_head: ClassVar[str | None] = None  # a classifier head the method needs (models.resnet.HEADS)
    description: ClassVar[str] = ""

    def __init__(self, ctx: MethodContext, hparams: MethodHparams) -> None:
        super().__init__()
        if not (self.uses_full_labels or self.uses_observed_negatives) and bool((ctx.train_observed < 0).any()):
            raise ValueError(f"the observed labels hold observed negatives, which method {self.name!r} does not use "
                             "(the reference's losses reject them too); train with iu, or observe no negatives")
        self.ctx = ctx
        self.hp = hparams

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The label matrix the method trains on: annotated labels for oracles, else the observed ones."""
        return batch["full"] if self.uses_full_labels else batch["observed"]

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Loss from the model's logits ``(N, C)`` and the batch (keys images, observed, full, index)."""
        raise NotImplementedError

    def training_step(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """One batch: run ``model`` and return the loss. Losses are computed in float32."""
        logits = model(batch["images"])
        return self.loss(logits.float(), batch)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Extra optimiser parameter groups (default: none)."""
        return []

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        """Called after each training epoch; returns values to log (default: nothing)."""
        return {}

    def extra_views(self, image_size: int, mean: Sequence[float],
                    std: Sequence[float]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """Extra training views: batch key -> transform of the decoded ``uint8 (3, H, W)`` image to a model
        input (default: none; the batch's ``images`` always holds the standard training view)."""
        return {}

    @classmethod
    def stage_epochs(cls, hparams: MethodHparams, epochs: int) -> list[int]:
        """Epochs of each training stage given the hyperparameters and ``--epochs`` (default: one stage)."""
        return [epochs]

    def start_stage(self, stage: int) -> None:
        """Called when stage ``stage`` (2, 3, ...) starts, after the previous stage's best weights are loaded."""

    def hparams_dict(self) -> dict[str, Any]:
        """The hyperparameters as a JSON-able dict (stored in checkpoints)."""
        return dataclasses.asdict(self.hp)


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding a method to :data:`METHODS` under ``cls.name``."""
    if not cls.name or cls.name in METHODS:
        raise ValueError(f"method name {cls.name!r} is empty or registered twice")
    METHODS[cls.name] = cls
    return cls


def _convert(value: str, annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    kind = args[0] if args else annotation  # Optional[float] -> float
    if value.lower() == "none" and args:
        return None
    if kind is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {value!r}")
    return kind(value)


def dataset_family(dataset: str) -> str:
    """The preset family of a dataset name: ``voc2012`` -> ``voc``, ``coco2014`` -> ``coco``,
    ``builtin-default`` -> ``builtin``; other names are returned unchanged."""
    name = dataset.lower()
    for family in ("voc", "coco", "nus", "cub", "builtin"):
        if name.startswith(family):
            return family
    return name


def preset_for(method: type[Method], dataset: str) -> dict[str, Any]:
    """The method's published hyperparameters for ``dataset``'s family (empty if it has none)."""
    return dict(method.presets.get(dataset_family(dataset), {}))


def paper_settings_for(method: type[Method], dataset: str) -> dict[str, Any]:
    """The method's published optimisation settings (``TrainConfig`` field -> value) for ``dataset``'s family:
    its ``"*"`` entry updated by the family's own entry; empty when the papers publish none."""
    settings = dict(method.paper_settings.get("*", {}))
    settings.update(method.paper_settings.get(dataset_family(dataset), {}))
    return settings


def make_hparams(method: type[Method], overrides: dict[str, str], dataset: str = "") -> MethodHparams:
    """Build a method's hyperparameters: dataclass defaults, then the preset for ``dataset``'s family
    (:func:`dataset_family`) if the method has one, then ``overrides`` (strings from ``--hp``), each
    converted to its field's type."""
    fields = {f.name: f for f in dataclasses.fields(method.Hparams)}
    hints = typing.get_type_hints(method.Hparams)
    values: dict[str, Any] = dict(preset_for(method, dataset))
    for key, raw in overrides.items():
        if key not in fields:
            valid = ", ".join(fields) or "(none)"
            raise ValueError(f"method {method.name!r} has no hyperparameter {key!r}; valid: {valid}")
        try:
            values[key] = _convert(raw, hints[key])
        except ValueError as exc:
            raise ValueError(f"--hp {key}={raw}: {exc}") from None
    return method.Hparams(**values)
