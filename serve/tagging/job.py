"""A tagging run's options, :class:`TagJob`, in four groups; invalid values raise ``ValueError``."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.runtimes import parse_device
from serve import DEFAULT_BATCH_SIZE, DEFAULT_MAX_PIXELS, DEFAULT_OUTPUT
from serve.outputs.caption_rules import CaptionRules
from serve.outputs.records import DEFAULT_SEPARATOR, default_errors_path
from serve.outputs.selection_modes import DEFAULT_MODE, Selection, make_selection
from serve.outputs.sidecars import SidecarSpec
from serve.outputs.tag_folders import TagFolders
from serve.tagging.engines import DEFAULT_ENGINE, ENGINES
from serve.tagging.sources import Partition, Source

if TYPE_CHECKING:
    from models.runtimes import Runtime
    from serve.predictor import Predictor

#: What to do with images whose outputs exist already (see :class:`OutputOptions`).
EXISTING_POLICIES = ("skip", "overwrite", "append")
DEFAULT_EXISTING = "skip"


def _at_least_one(options: object, *names: str) -> None:
    """``ValueError`` naming the first of ``names`` whose value is set and below 1."""
    for name in names:
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {value}")


@dataclass(frozen=True)
class TagChoice:
    """How tags are chosen and written: thresholds, overrides, the selection ``mode`` and the ``rules``."""

    threshold: float | None = None
    per_class: Mapping[str, float] | None = None
    mode: Selection = field(default_factory=Selection)
    rules: CaptionRules = field(default_factory=CaptionRules)

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold (--threshold) must be in [0, 1], got {self.threshold}")


@dataclass(frozen=True)
class OutputOptions:
    """The files of a run besides the run file (errors, sidecars, tag separator, tag folders, summary) and ``existing``:
    ``skip`` resumes, ``overwrite`` redoes everything, ``append`` also adds new tags to existing sidecars."""

    errors: Path | None = None
    sidecar: SidecarSpec | None = None
    tag_separator: str = DEFAULT_SEPARATOR
    sort_into: TagFolders | None = None
    summary: bool = True
    existing: str = DEFAULT_EXISTING

    def __post_init__(self) -> None:
        if self.errors is not None:
            object.__setattr__(self, "errors", Path(self.errors))
        if self.existing not in EXISTING_POLICIES:
            choices = ", ".join(EXISTING_POLICIES)
            raise ValueError(f"existing (--existing) must be one of {choices}, got {self.existing!r}")


@dataclass(frozen=True)
class RunOptions:
    """How a run goes: engine, runtime, batch size, workers, ``max_pixels``, progress, ``--shard``."""

    engine: str = DEFAULT_ENGINE
    backend: str | None = None
    device: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    workers: int | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    progress: bool = True
    partition: Partition | None = None

    def __post_init__(self) -> None:
        ENGINES.row(self.engine)  # an unknown name: the one message listing the engines
        _at_least_one(self, "batch_size", "workers", "max_pixels")


@dataclass(frozen=True)
class RayOptions:
    """The ray engine's cluster ``address`` (none: local) and each actor's GPUs and CPUs."""

    address: str | None = None
    gpus_per_worker: float = 0.0
    cpus_per_worker: int | None = None

    def __post_init__(self) -> None:
        _at_least_one(self, "cpus_per_worker")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker (--gpus-per-worker) must be >= 0, got {self.gpus_per_worker}")


#: Group attribute of :class:`TagJob` -> its class; each group's fields are options of the job.
GROUPS: dict[str, type] = {"choice": TagChoice, "outputs": OutputOptions, "run": RunOptions, "cluster": RayOptions}
_GROUP_OF = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
#: Options that are not a field of a group: the selection mode's text and its limits, and ``top_k``.
SELECTION_OPTIONS = ("selection", "max_tags", "min_score", "top_k")


@dataclass(init=False)
class TagJob:
    """A tagging run: ``source``, ``model`` (a file, or a loaded Predictor or runtime), ``output`` and the option
    groups. ``selection``: ``"thresholds"``, ``"mcut"``, ``"top-k:K"`` or a Selection (``top_k``: deprecated
    ``max_tags``)."""

    source: str | Path | Source
    model: Path | None
    output: Path
    choice: TagChoice
    outputs: OutputOptions
    run: RunOptions
    cluster: RayOptions
    predictor: Predictor | None = field(default=None, repr=False)

    def __init__(
        self,
        source: str | Path | Source,
        model: str | Path | Predictor | Runtime | None = None,
        output: str | Path = DEFAULT_OUTPUT,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - set(_GROUP_OF) - set(SELECTION_OPTIONS))
        if unknown:
            raise TypeError(f"TagJob() got an unexpected keyword argument {unknown[0]!r}")
        self.source = source
        self.output = Path(output)
        flat = {name: value for name, value in options.items() if name in _GROUP_OF}
        for group, cls in GROUPS.items():
            values = {n: v for n, v in flat.items() if _GROUP_OF[n] == group}
            if group == "choice":
                values["mode"] = _selection_mode(options, values.get("mode"))
            setattr(self, group, cls(**values))
        parse_device(self.run.device)  # ModelSpecError for unknown devices
        self.predictor = None
        if model is not None and not isinstance(model, (str, Path)):
            self.predictor = as_predictor(model)
            model = self.predictor.path
        if model is None and self.predictor is None:
            raise ValueError("a model is needed: a model file or a loaded Predictor")
        self.model = Path(model) if model is not None else None

    def __getattr__(self, name: str) -> Any:
        """An option by its flat name: ``job.batch_size`` is ``job.run.batch_size``."""
        group = _GROUP_OF.get(name)
        if group is None or group not in self.__dict__:
            raise AttributeError(f"'TagJob' object has no attribute {name!r}")
        return getattr(self.__dict__[group], name)

    @property
    def mode(self) -> Selection:
        """The selection mode, with its cap and floor."""
        return self.choice.mode

    @property
    def errors_file(self) -> Path:
        """Where failures are listed: ``errors``, else the default beside the output."""
        errors = self.outputs.errors
        return errors if errors is not None else default_errors_path(self.output)

    @property
    def separator(self) -> str:
        """The tag separator of the run file's CSV tags column and of the sidecars."""
        sidecar = self.outputs.sidecar
        return sidecar.separator if sidecar is not None else self.outputs.tag_separator


def _selection_mode(options: Mapping[str, Any], mode: Selection | None) -> Selection:
    """The selection mode of the flat options on top of ``mode``."""
    max_tags, min_score, top_k = (options.get(n) for n in ("max_tags", "min_score", "top_k"))
    selection = options.get("selection", mode if mode is not None else DEFAULT_MODE)
    if top_k is not None:
        warnings.warn("--top-k is deprecated, use --max-tags (max_tags in Python): the same cap", DeprecationWarning, 3)
        if top_k < 1:
            raise ValueError(f"top_k (--top-k) must be >= 1, got {top_k}")
        if max_tags is not None and max_tags != top_k:
            raise ValueError("--top-k is the old name of --max-tags (top_k and max_tags in Python): give one of them")
        max_tags = top_k
    if max_tags is not None and max_tags < 1:
        raise ValueError(f"max_tags (--max-tags) must be >= 1, got {max_tags}")
    if min_score is not None and not 0.0 <= min_score <= 1.0:
        raise ValueError(f"min_score (--min-score) must be in [0, 1], got {min_score}")
    try:
        if isinstance(selection, str):
            return make_selection(selection, max_tags, min_score)
        limits: dict[str, Any] = {"max_tags": max_tags} if max_tags is not None else {}
        if min_score is not None:
            limits["min_score"] = float(min_score)
        return dataclasses.replace(selection, **limits)
    except ValueError as exc:
        raise ValueError(f"selection (--select): {exc}") from None


def as_predictor(model: Predictor | Runtime) -> Predictor:
    """A :class:`~serve.predictor.Predictor` from a loaded one or a runtime (``ValueError`` unless logits)."""
    from serve.predictor import Predictor

    if isinstance(model, Predictor):
        return model
    if model.meta.output != "logits":
        raise ValueError(f"model output is {model.meta.output!r}; the tagger expects logits")
    return Predictor(model, path=getattr(model, "path", None))
