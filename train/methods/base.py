"""The method interface and registry (docs/methods.md, "The method interface"): a method is an ``nn.Module`` (its state
checkpointed) overriding :meth:`Method.loss` ``(logits, batch) -> LossOutput``; ``batch`` holds ``observed``, ``index``
and the model outputs its hooks ask for, never ground truth (but for an oracle); under torchrun a loss's collectives
run in the same order on every rank. Hyperparameters: a dataclass per method (``--hp``), presets, paper settings."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from models.data.dataset import FULL_LABELS
from models.data.dataset import NEGATIVES as NEGATIVES_KEY
from models.data.families import family_named
from models.preprocess import EvalTransform
from models.registry import Registry
from train.distributed import global_mean
from train.pseudo_labels.spec import PseudoLabelSpec

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
    expected_positives: float  # k, positives per image (uses_expected_positives; NaN for the others)
    epochs: int  # all training epochs of the run (LinearInit + every stage)
    dataset: str = ""  # dataset name, used to pick a preset
    batch_size: int = 32  # training batch size (sizes per-batch buffers such as LAC's queue)
    feature_width: int = 0  # width of the model's features / per-class embeddings (sizes projectors)
    linear_init_epochs: int = 0  # the first epochs of ``epochs`` that are LinearInit epochs (--linear-init)
    # (N_train, C) bool: CLIP's pseudo-positives of the training images (uses_pseudo_labels; None for the others).
    # As the pseudo-labelling selects them, so they may include an image's observed positive
    pseudo_positives: torch.Tensor | None = None


@dataclass
class LossOutput:
    """A step's loss and values to log (preferably detached scalar tensors, summed on the device)."""

    loss: torch.Tensor
    logs: dict[str, torch.Tensor | float] = dataclasses.field(default_factory=dict)


@dataclass
class EpochEndContext:
    """Given to :meth:`Method.on_epoch_end`: the epoch (1-based) and ``predict_train(augment)``, the model's train-set
    probabilities ``(N_train, C)`` in dataset order."""

    epoch: int
    predict_train: Callable[[bool], torch.Tensor]


SCORES, POSITIVES, NEGATIVES = "scores", "positives", "negatives"


@dataclass
class LabelEstimate:
    """A method's current belief about the training labels, for the trainer to score: ``"scores"`` (scored as recovery
    mAP) or a bool mask of ``"positives"`` / ``"negatives"`` (scored by precision)."""

    values: torch.Tensor
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in (SCORES, POSITIVES, NEGATIVES):
            raise ValueError(f"label estimate kind must be {SCORES}, {POSITIVES} or {NEGATIVES}, got {self.kind!r}")


@dataclass
class MethodHparams:
    """Base class of a method's hyperparameters (empty)."""


class Method(nn.Module):
    """Base class of a training method: :meth:`loss` plus optional state and hooks (see the module docstring)."""

    name: ClassVar[str] = ""
    Hparams: ClassVar[type[MethodHparams]] = MethodHparams
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # TrainConfig fields per dataset family ("*": every family), applied over ``--preset paper``
    paper_settings: ClassVar[dict[str, dict[str, Any]]] = {}
    # The oracle capability: the trainer adds the training images' annotated labels to each batch (``full``)
    # so that the method can train on them - a reference bound, not an SPML method. The trainer grants it only
    # when the training split has full labels and refuses to start otherwise.
    trains_on_full_labels: ClassVar[bool] = False
    # reads batch["observed_negatives"] (the known negatives: the protocol's -1 entries, a user's "-dog" or "no"
    # answers) in its own loss; for every other method :meth:`training_loss` adds their term
    uses_observed_negatives: ClassVar[bool] = False
    # reads ctx.expected_positives (k): the trainer resolves it (published, given, audit, or estimated and then
    # updated through set_expected_positives after every epoch; models/evaluation/expected_positives.py)
    uses_expected_positives: ClassVar[bool] = False
    # --head-bias auto starts a new head at the label prior for this method (with a pretrained backbone or on fixed
    # features): measured better for the losses that take unobserved labels as negatives (an, bce, iun, the Large Loss
    # family, opml, pu-mlc: +1.2 to +3.9 test mAP on the clip art's fixed features), worse for those that keep them
    # open (em -10.5, opml-sp -17.8, gr-loss -3.0, role -2.9; bench/README.md, head bias)
    starts_at_label_prior: ClassVar[bool] = False
    required_head: ClassVar[str | None] = None  # a classifier head the method needs (models.network.HEADS)
    trainable_scope: ClassVar[str | None] = None  # the backbone scope of its papers (--preset paper)
    needs_embeddings: ClassVar[bool] = False  # the step calls forward_embeddings (label-wise embedding head)
    leaves_parameters_unused: ClassVar[bool] = False  # a step may leave some of its parameters out (DDP)
    # trains on CLIP pseudo-labels: the trainer runs the pseudo-label stage (pseudo_label_spec) and fills
    # ctx.pseudo_positives
    uses_pseudo_labels: ClassVar[bool] = False
    paper: ClassVar[str] = ""  # who published it, e.g. "Cole et al. 2021" (docs/methods.md has the references)
    description: ClassVar[str] = ""
    # why --method auto does not try it on fixed features ("": it does): a measured failure its label-free scores
    # cannot see (train/choose.py)
    left_out_of_auto: ClassVar[str] = ""

    def __init__(self, ctx: MethodContext, hparams: MethodHparams) -> None:
        super().__init__()
        self.ctx = ctx
        self.hp = hparams

    @classmethod
    def known_negatives_use(cls) -> str:
        """What the method does with known negatives: ``own loss``, ``full labels`` (an oracle) or ``added term``."""
        if cls.trains_on_full_labels:
            return "full labels"
        return "own loss" if cls.uses_observed_negatives else "added term"

    def training_loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """:meth:`loss`, plus, where the method's loss has no place for known negatives, ``-log(1 - p)`` at each of them
        over the batch's N*C entries (logged as ``known_negatives_loss``)."""
        out = self.loss(logits, batch)
        negatives = batch.get(NEGATIVES_KEY)
        if negatives is None or self.known_negatives_use() != "added term" or not bool((negatives > 0.5).any()):
            return out
        term = torch.where(negatives > 0.5, neg_log(1.0 - torch.sigmoid(logits)), torch.zeros_like(logits)).mean()
        return LossOutput(out.loss + term, {**out.logs, "known_negatives_loss": term.detach()})

    @classmethod
    def pseudo_label_spec(cls, hparams: MethodHparams) -> PseudoLabelSpec:
        """The CLIP pseudo-labelling the method asks for (only called when :attr:`uses_pseudo_labels`)."""
        raise NotImplementedError(f"method {cls.name!r} uses no pseudo-labels")

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The label matrix the method trains on: the annotated labels for an oracle, else the observed ones."""
        return batch[FULL_LABELS] if self.trains_on_full_labels else batch["observed"]

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The loss of a batch from the float32 logits ``(N, C)`` and the batch (see the module docstring)."""
        raise NotImplementedError

    def extra_model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Further model inputs made from the batch: ``images_<name>`` entries run through the model and reach
        :meth:`loss` as ``logits_<name>``, others unchanged (default: none)."""
        return {}

    def set_expected_positives(self, k: float) -> None:
        """Take a new estimate of k (the trainer's, after an epoch, when k is estimated)."""
        self.ctx.expected_positives = float(k)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Extra optimiser parameter groups (default: none)."""
        return []

    def on_epoch_end(self, ctx: EpochEndContext) -> dict[str, float]:
        """Called after each training epoch; returns values to log (default: nothing)."""
        return {}

    def label_estimates(self) -> dict[str, LabelEstimate]:
        """The method's current estimates of the training labels by name (default: none)."""
        return {}

    def extra_views(self, preprocessing: EvalTransform) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """Extra training views: batch key ``images_<name>`` -> transform of the decoded ``uint8 (3, H, W)`` image
        ending in the model's ``preprocessing`` (default: none)."""
        return {}

    @classmethod
    def trains_on_pooled_features(cls) -> bool:
        """Whether the head can train on cached pooled features (no extra views, no feature-map head)."""
        return cls.extra_views is Method.extra_views and cls.required_head in (None, "linear")

    @classmethod
    def stage_epochs(cls, hparams: MethodHparams, epochs: int) -> list[int]:
        """Epochs of each training stage given the hyperparameters and ``--epochs`` (default: one stage)."""
        return [epochs]

    def start_stage(self, stage: int) -> None:
        """Called when stage ``stage`` (2, 3, ...) starts, after the previous stage's best weights are loaded."""

    def hparams_dict(self) -> dict[str, Any]:
        """The hyperparameters as a JSON-able dict (stored in checkpoints)."""
        return dataclasses.asdict(self.hp)


#: The methods by name, in table order: the oracle bounds first, then the rest, each alphabetical.
METHODS: Registry[type[Method]] = Registry("method", order=lambda row: (not row.value.trains_on_full_labels, row.name))
#: Class decorator adding a method to :data:`METHODS` under ``cls.name`` (its ``description`` is its help).
register = METHODS.register


def _convert(value: str, annotation: Any) -> Any:
    """``value`` (an ``--hp`` string) as ``annotation``: a scalar type, ``X | None`` (``none`` gives None), or a
    tuple of scalars written comma-separated (``beta=0,2,-2,-2``; ``tuple[float, ...]`` takes any length)."""
    if typing.get_origin(annotation) is tuple:
        items = typing.get_args(annotation)
        parts = [part.strip() for part in value.strip().strip("()[]").split(",")]
        if len(items) == 2 and items[1] is Ellipsis:
            items = (items[0],) * len(parts)
        elif len(parts) != len(items):
            raise ValueError(f"expected {len(items)} comma-separated values, got {value!r}")
        return tuple(_convert(part, item) for part, item in zip(parts, items, strict=True))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    kind = args[0] if args else annotation  # Optional[float] -> float
    if value.lower() == "none" and args:
        return None
    if typing.get_origin(kind) is tuple:  # Optional[tuple[...]]
        return _convert(value, kind)
    if kind is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {value!r}")
    return kind(value)


def dataset_family(dataset: str) -> str:
    """The preset family of a dataset name (``voc2012`` -> ``voc``); any other name is returned unchanged."""
    return family_named(dataset) or dataset


def preset_for(method: type[Method], dataset: str) -> dict[str, Any]:
    """The method's published hyperparameters for ``dataset``'s family (empty if it has none)."""
    return dict(method.presets.get(dataset_family(dataset), {}))


def paper_settings_for(method: type[Method], dataset: str) -> dict[str, Any]:
    """The method's published optimisation settings for ``dataset``'s family (empty when none are published)."""
    settings: dict[str, Any] = {"trainable": method.trainable_scope} if method.trainable_scope else {}
    settings.update(method.paper_settings.get("*", {}))
    settings.update(method.paper_settings.get(dataset_family(dataset), {}))
    return settings


def make_hparams(method: type[Method], overrides: dict[str, str], dataset: str = "") -> MethodHparams:
    """A method's hyperparameters: dataclass defaults, then the family's preset, then ``overrides`` (``--hp``
    strings)."""
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
