"""Training configuration: :class:`TrainConfig`, every default, and :func:`resolve_settings`, which takes each setting
from the last layer that sets it (the default, ``--preset``, ``--from-run``, the options given, then the regime's and
the data's defaults) and records where it came from (config.json's ``sources``); the command line: train.options."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.data.label_regime import parse_declarations
from models.data.protocol import PROTOCOL_SEED, parse_observed
from models.files.run_folder import CONFIG_FILE, default_runs_dir
from models.network import (
    BOOSTLU_ALPHA,
    HEADS,
    TRAINABLE_SCOPES,
    head_on_feature_map,
    on_cached_stages,
    on_fixed_features,
)
from models.registry import Row, Table
from train.methods import BASELINE, METHODS, get_method
from train.methods.base import paper_settings_for
from train.selection import SELECT_CHOICES

AUTO = "auto"
REAL_IMAGES_ARCH = "tf_efficientnet_lite0"
SCRATCH_ARCH = "resnet18"
SCRATCH_IMAGE_SIZE = 64
REAL_IMAGE_SIZE = 224
#: ``--head-bias``: name, help, whether the new head starts at the label prior (``auto``: resolved per run).
HEAD_BIASES: Table[bool | None] = Table("--head-bias", [
    Row(AUTO, "prior with a pretrained backbone or fixed features for the methods whose loss takes unobserved labels "
        "as negatives (an, bce, iun, ll-*, opml, pu-mlc: measured +1 to +4 test mAP), default otherwise (measured "
        "worse for the others: bench/README.md)", None),
    Row("prior", "logit(k/C) for every class, k the expected positives per image or, unknown, the observed ones: "
        "the label prior", True),
    Row("default", "PyTorch's initialisation", False),
])
#: ``--bn-stats``: name, help, whether the backbone's BatchNorm statistics stay as the weights have them while it
#: trains (``auto``: resolved per run).
BN_STATS: Table[bool | None] = Table("--bn-stats", [
    Row(AUTO, "frozen with pretrained weights (measured: updating them on a small training set loses what "
        "LinearInit's head learnt and the fine-tune falls below it), train from random init", None),
    Row("frozen", "keep the ones the weights came with (those layers normalise as at inference; their scale and "
        "shift still learn)", True),
    Row("train", "update them from every batch", False),
])


def default_workers() -> int:
    """DataLoader workers: leave one core to the training process, at most 4."""
    return max(0, min(4, (os.cpu_count() or 1) - 1))


@dataclass
class TrainConfig:
    """Every setting of a training run (saved as the run's config.json; ``--resume`` reloads it)."""

    data: str = "builtin:small"
    observed: str = "auto"
    val_fraction: float = 0.2
    protocol_seed: int = PROTOCOL_SEED
    labels: str = "auto"
    select: str = "auto"
    audit: str = ""
    review: list[str] = field(default_factory=list)  # review files whose answers join the labels (absolute paths)
    method: str = BASELINE  # AN, the method every comparison starts from; "auto": chosen on the data (train.choose)
    hp: dict[str, str] = field(default_factory=dict)
    candidates: str = ""  # --method auto: the methods it tries (comma-separated; "": every one that can)
    chosen: dict[str, Any] = field(default_factory=dict)  # what --method auto chose and why (train.choose)
    clip: str = ""  # CLIP of the pseudo-labels (MODEL[:PRETRAINED], open_clip names); "": the method's own
    clip_prompt: str = ""  # prompt template with {} for the class name; "": the method's own
    clip_batch_size: int = 16  # images per CLIP call of the pseudo-label pass
    pseudo_labels: str = ""  # a pseudo_labels.npz to read instead of running CLIP
    arch: str = AUTO  # tf_efficientnet_lite0 on real images, resnet18 on the built-in shapes
    weights: str = AUTO  # imagenet on real images, none on the built-in shapes
    reset_head: bool = False
    image_size: int = 0  # 0: the default of the architecture and data
    crop: float = 1.0  # share of the resized image kept around its centre (1: the whole image)
    train_crop: float = 1.0  # least area share of a training image's random resized crop (1: off)
    lgconv: bool | None = None  # None: on for the torchvision ResNets, off for timm backbones
    head: str = "auto"
    head_bias: str = "auto"
    bn_stats: str = "auto"
    boostlu: float | None = None
    trainable: str = "all"
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 64
    optimizer: str = "adam"
    lr: float = 2e-3
    head_lr_mult: float = 1.0
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: str = "onecycle"
    amp: str = "auto"
    channels_last: str = "auto"
    ema: float = 0.0
    patience: int = 0
    linear_init: int = 0
    linear_init_lr: float = 1e-3
    clip_grad: float = 0.0
    sync_bn: bool = False
    seed: int = 0
    workers: int = field(default_factory=default_workers)
    device: str = "auto"
    runs_dir: str = field(default_factory=lambda: str(default_runs_dir()))
    name: str = ""
    progress: bool = True
    sources: dict[str, str] = field(default_factory=dict)  # where each setting's value came from (resolve_settings)

    @property
    def fixed_features(self) -> bool:
        """Whether the head alone trains, on fixed (cached) backbone features (``--trainable head``)."""
        return on_fixed_features(self.trainable)

    @property
    def cached_top(self) -> bool:
        """Whether the last stage and the head train on cached inputs of the last stage (``--trainable top``)."""
        return on_cached_stages(self.trainable)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of all fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values.setdefault("lgconv", False)  # runs saved before LgConv existed were plain ResNets
        values.setdefault("head_bias", "default")  # runs saved before the prior-initialised head bias
        scope_of = METHODS.get(str(values.get("trainable")))  # earlier runs named a scope after its method
        if scope_of is not None and scope_of.trainable_scope:
            values["trainable"] = scope_of.trainable_scope
        # runs saved before --bn-stats: a frozen backbone's BatchNorm never updated, a trained one always did
        values.setdefault("bn_stats", "frozen" if on_fixed_features(values.get("trainable", "all")) else "train")
        return cls(**values)


#: ``--method auto``: the method is chosen on the data before training (train.choose)
METHOD_AUTO = "auto"

HEAD_EPOCHS = 25  # --epochs of --trainable head when not given (Cole et al.'s linear_fixed_features: 25)

#: Fine-tuning pretrained weights (``--trainable all`` or ``layer4`` with ``--weights`` other than none), for each
#: setting not given: the head first on fixed features (LinearInit, :data:`HEAD_EPOCHS` epochs, where the method's head
#: trains on pooled features), then the network at a fine-tune learning rate without a schedule until the selection
#: criterion has not improved for ``patience`` epochs; with ``--bn-stats auto`` (frozen). The best epoch of both
#: phases is kept, so a fine-tune that does not help leaves the head. Measured on the development sets
#: (bench/README.md, fine-tuning the whole network); from random init the defaults of :class:`TrainConfig` stay.
FINE_TUNE_DEFAULTS: dict[str, Any] = {"lr": 3e-4, "scheduler": "none", "epochs": 10, "patience": 3}

# Settings that belong to the machine running a run, not to what the run is: --resume may change them, and
# a comparison that reuses run folders ignores them when it checks that an existing run matches its command.
MACHINE_FIELDS = ("device", "workers", "progress", "sync_bn", "clip_batch_size")

#: ``--preset``: named bundles of defaults (the options given still win).
RUN_PRESETS: Table[dict[str, Any]] = Table("preset", [
    Row("cpu", "the defaults: about a minute on a 2-core CPU on the built-in shapes", {}),
    Row("paper", "Cole et al. / EM / OPML: ResNet-50 ImageNet, 448 px, batch 8, Adam 1e-5, no schedule, 10 epochs",
        {"arch": "resnet50", "weights": "imagenet", "image_size": 448, "batch_size": 8, "eval_batch_size": 32,
         "epochs": 10, "optimizer": "adam", "lr": 1e-5, "scheduler": "none", "bn_stats": "train"}),
])
GIVEN = "given"  # the source of a setting named on the command line (or in code)


def paper_settings(method: str, data: str) -> dict[str, Any]:
    """The published optimisation settings of ``method`` for ``data``'s family (what ``--preset paper`` adds)."""
    from models.data.registry import spec_family

    if method == METHOD_AUTO:  # not known yet: --method auto chooses it on fixed features first
        return {}
    return paper_settings_for(get_method(method), spec_family(data))


def resolve_settings(given: dict[str, Any], preset: str = "", from_run: dict[str, Any] | None = None,
                     from_run_name: str = "") -> TrainConfig:
    """The run's settings from the options ``given``, the ``preset``, a run to start from (its ``--review`` and ``--hp``
    kept, the given ones added), the regime and the data; ``sources`` names where each non-default came from."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def apply(layer: dict[str, Any], source: str) -> None:
        for name, value in layer.items():
            values[name], sources[name] = value, source

    if preset:
        apply(RUN_PRESETS[preset], f"--preset {preset}")
    if preset == "paper":
        defaults = TrainConfig()
        method = given.get("method", defaults.method)
        apply(paper_settings(method, given.get("data", defaults.data)), f"{method}'s published settings")
    base = from_run or {}
    apply(base, f"--from-run {from_run_name}")
    given = dict(given)
    if "review" in given:
        given["review"] = [*base.get("review", []), *given["review"]]
    if "hp" in given:
        given["hp"] = {**base.get("hp", {}), **given["hp"]}
    apply(given, GIVEN)
    crop = values.pop("crop", None)
    if on_fixed_features(values.get("trainable", "all")) and "epochs" not in values:
        apply({"epochs": HEAD_EPOCHS}, "fixed features")  # the seeds' 25 linear epochs, seconds each
    cfg = resolve_model_defaults(TrainConfig(**values, sources=sources))
    if preset != "paper" and not cfg.fixed_features and cfg.weights.lower() != "none":
        cfg = fine_tune_defaults(cfg, set(values))
    if crop is not None:
        cfg.crop = parse_crop(str(crop), cfg.arch)
    return cfg


def pooled_head_fits(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s method, head and BoostLU let its head train on cached pooled features (LinearInit's head,
    ``--trainable head``); ``--method auto``'s candidates all can."""
    method_fits = cfg.method == METHOD_AUTO or get_method(cfg.method).trains_on_pooled_features()
    return method_fits and cfg.boostlu is None and cfg.head in ("auto", "linear")


def fine_tune_defaults(cfg: TrainConfig, given: set[str]) -> TrainConfig:
    """``cfg`` with :data:`FINE_TUNE_DEFAULTS` where not ``given``, and LinearInit where the run can have it."""
    updates = {name: value for name, value in FINE_TUNE_DEFAULTS.items() if name not in given}
    if "linear_init" not in given and cfg.method != METHOD_AUTO and pooled_head_fits(cfg):
        updates["linear_init"] = HEAD_EPOCHS
    return dataclasses.replace(cfg, **updates, sources={**cfg.sources, **dict.fromkeys(updates, "fine-tune")})


def run_config(run: str, runs_dir: str | Path | None = None) -> tuple[Path, TrainConfig]:
    """The folder and config of run ``run`` (a folder or a name under ``runs_dir``); ``ValueError`` without one."""
    folder = Path(run).expanduser()
    if not folder.is_dir():
        folder = Path(runs_dir or default_runs_dir()) / run
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{run}: no {CONFIG_FILE} in {folder} (give a run folder of python -m train)")
    return folder, TrainConfig.from_dict(json.loads(path.read_text())["config"])


def settings_of_run(run: str, runs_dir: str | None = None) -> dict[str, Any]:
    """The settings of run ``run`` for ``--from-run``: its config without its name, the choice and the sources."""
    try:
        settings = run_config(run, runs_dir)[1].to_dict()
    except ValueError as exc:
        raise ValueError(f"--from-run {exc}") from None
    for own in ("name", "chosen", "sources"):  # the new run names itself, chooses again, records its own sources
        settings.pop(own)
    return settings


def resolve_model_defaults(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every ``auto`` model setting resolved for ``cfg.data``, each recorded in ``sources``."""
    from models.backbones import family_of

    builtin = is_builtin(cfg.data)
    data = "auto: the built-in shapes" if builtin else "auto: real images"
    resolved: dict[str, tuple[Any, str]] = {}
    if cfg.arch == AUTO:
        resolved["arch"] = (SCRATCH_ARCH if builtin and cfg.weights.lower() == "none" else REAL_IMAGES_ARCH), data
    arch = resolved["arch"][0] if "arch" in resolved else cfg.arch
    if cfg.weights == AUTO:  # on the built-in shapes another backbone starts from random init, offline
        resolved["weights"] = ("none" if builtin and arch != REAL_IMAGES_ARCH else "imagenet"), data
    weights = resolved["weights"][0] if "weights" in resolved else cfg.weights
    scratch = weights.lower() == "none"
    if not cfg.image_size:
        resolved["image_size"] = default_image_size(arch, cfg.data, scratch), data if builtin else f"auto: {arch}"
    head_fits = pooled_head_fits(cfg) and not (cfg.linear_init or cfg.ema) and cfg.train_crop == 1.0
    if builtin and not scratch and "trainable" not in cfg.sources and head_fits:
        resolved["trainable"] = "head", data  # the quick start: a head on the pretrained features
        resolved.update({} if "epochs" in cfg.sources else {"epochs": (HEAD_EPOCHS, data)})
    trainable = resolved["trainable"][0] if "trainable" in resolved else cfg.trainable
    fixed = on_fixed_features(trainable)
    if cfg.lgconv is None:
        resolved["lgconv"] = family_of(arch).supports_lgconv, f"auto: {arch}"
    if cfg.head_bias == AUTO and cfg.method != METHOD_AUTO:
        prior = get_method(cfg.method).starts_at_label_prior
        resolved["head_bias"] = default_head_bias(trainable, weights, prior), f"auto: {cfg.method}"
    bn_stats = default_bn_stats(trainable, weights)
    if (cfg.bn_stats == AUTO or fixed) and cfg.bn_stats != bn_stats:
        pretrained = "pretrained weights" if not scratch else "no weights"
        resolved["bn_stats"] = bn_stats, "fixed features" if fixed else f"auto: {pretrained}"
    return dataclasses.replace(cfg, **{name: value for name, (value, _) in resolved.items()},
                               sources={**cfg.sources, **{name: why for name, (_, why) in resolved.items()}})


def parse_crop(text: str, arch: str) -> float:
    """``--crop``: a fraction in (0, 1], or ``pretrained`` (the backbone's own crop_pct)."""
    if text.strip().lower() == "pretrained":
        from models.network import input_config

        return input_config(arch).crop
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--crop takes a fraction in (0, 1] or 'pretrained', got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"--crop must be in (0, 1], got {value}")
    return value


def validate(cfg: TrainConfig) -> None:
    """Raise ``ValueError`` with a readable message for inconsistent settings."""
    parse_observed(cfg.observed)
    parse_declarations(cfg.labels)
    for name in filter(None, (x.strip() for x in cfg.candidates.split(","))):
        METHODS.row(name)  # an unknown method: the one message listing them
    if cfg.candidates and cfg.method != METHOD_AUTO:
        raise ValueError("--candidates lists the methods --method auto tries; give it with --method auto")
    if cfg.method == METHOD_AUTO:
        clashing = [flag for flag, used in (("--boostlu", cfg.boostlu is not None),
                                             (f"--head {cfg.head}", head_on_feature_map(cfg.head)),
                                             ("--linear-init", cfg.linear_init > 0)) if used]
        if clashing:
            raise ValueError(f"--method auto chooses among heads trained on fixed features; it cannot be combined "
                             f"with {', '.join(clashing)} (name the method instead)")
    checks = [
        (cfg.select in SELECT_CHOICES, f"--select must be one of {', '.join(SELECT_CHOICES)}"),
        (cfg.epochs >= 1 or (cfg.epochs == 0 and cfg.linear_init >= 1),
         "--epochs must be >= 1 (0 only with --linear-init N: a linear probe on fixed features)"),
        (cfg.batch_size >= 1 and cfg.eval_batch_size >= 1, "batch sizes must be >= 1"),
        (cfg.lr > 0, "--lr must be > 0"),
        (cfg.head_lr_mult > 0, "--head-lr-mult must be > 0"),
        (cfg.image_size == 0 or cfg.image_size >= 16, "--image-size must be >= 16"),
        (0.0 <= cfg.ema < 1.0, "--ema must be in [0, 1)"),
        (cfg.clip_grad >= 0, "--clip-grad must be >= 0"),
        (cfg.patience >= 0, "--patience must be >= 0"),
        (cfg.linear_init >= 0 and cfg.linear_init_lr > 0, "--linear-init must be >= 0, --linear-init-lr > 0"),
        (cfg.workers >= 0, "--workers must be >= 0"),
        (0.0 < cfg.val_fraction < 1.0, "--val-fraction must be in (0, 1)"),
        (cfg.trainable in TRAINABLE_SCOPES, f"--trainable must be one of {', '.join(TRAINABLE_SCOPES)}"),
        (cfg.head in ("auto", *HEADS), f"--head must be auto or one of {', '.join(HEADS)}"),
        (not cfg.reset_head or cfg.weights.lower() != "none", "--reset-head needs --weights FILE"),
        (cfg.boostlu is None or cfg.boostlu > 0, f"--boostlu must be > 0 (published: {BOOSTLU_ALPHA:g})"),
        (cfg.boostlu is None or not head_on_feature_map(cfg.head), f"--boostlu needs the linear head (the {cfg.head} "
         "head has no class activation maps to boost)"),
        (cfg.boostlu is None or cfg.linear_init == 0, "--boostlu cannot be combined with --linear-init (its head "
         "works on feature maps, LinearInit caches pooled features)"),
        (cfg.boostlu is None or not cfg.fixed_features, "--boostlu cannot train on fixed features (--trainable "
         "head caches pooled features; BoostLU's head works on the feature maps)"),
        (not head_on_feature_map(cfg.head) or not cfg.fixed_features, f"the {cfg.head} head works on feature maps; "
         "--trainable head caches pooled features (use --head linear)"),
        (cfg.linear_init == 0 or not cfg.fixed_features, "--linear-init trains the head on fixed features before "
         "training end to end; with --trainable head every epoch is already on fixed features"),
        (not cfg.cached_top or (cfg.boostlu is None and not head_on_feature_map(cfg.head) and cfg.ema == 0),
         "--trainable top trains the linear head on pooled features, without --boostlu, --head lem or --ema"),
        (0.0 < cfg.crop <= 1.0, "--crop must be in (0, 1]"),
        (0.0 < cfg.train_crop <= 1.0, "--train-crop must be in (0, 1]"),
        (cfg.train_crop == 1.0 or not (cfg.fixed_features or cfg.cached_top), "--train-crop crops images in "
         "training; --trainable head and top train on cached features of whole images"),
        (cfg.head_bias in HEAD_BIASES, f"--head-bias must be one of {', '.join(HEAD_BIASES)}"),
        (cfg.bn_stats in BN_STATS, f"--bn-stats must be one of {', '.join(BN_STATS)}"),
        (cfg.clip_batch_size >= 1, "--clip-batch-size must be >= 1"),
        (not cfg.clip_prompt or "{}" in cfg.clip_prompt, "--clip-prompt must hold {} where the class name goes")]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def is_builtin(data: str) -> bool:
    """Whether the ``--data`` spec names the built-in procedural data."""
    spec = data.strip()
    return spec == "builtin" or spec.startswith("builtin:")


def default_image_size(arch: str, data: str, scratch: bool) -> int:
    """``--image-size auto``: on the built-in shapes the preset's own size (64 px from random init), else the
    backbone's pretrained input size (224 for the default Lite0)."""
    from models.backbones import family_of

    if is_builtin(data):
        from models.data.registry import parse_builtin_argument
        from models.sources.builtin import BUILTIN_PRESETS

        preset = parse_builtin_argument(data.strip().partition(":")[2])[0]
        return BUILTIN_PRESETS[preset].image_size if preset in BUILTIN_PRESETS and not scratch else SCRATCH_IMAGE_SIZE
    return REAL_IMAGE_SIZE if arch == REAL_IMAGES_ARCH else family_of(arch).input_config(arch).image_size


def default_head_bias(trainable: str, weights: str, starts_at_label_prior: bool) -> str:
    """``--head-bias auto``: the label prior for a method that starts there, on fixed features or a pretrained backbone;
    else PyTorch's initialisation (measured: bench/README.md, head bias)."""
    pretrained = on_fixed_features(trainable) or weights.lower() != "none"
    return "prior" if pretrained and starts_at_label_prior else "default"


def default_bn_stats(trainable: str, weights: str) -> str:
    """``--bn-stats auto``: frozen with pretrained weights or on fixed features, updated when a backbone from random
    init trains (measured: bench/README.md, fine-tuning the whole network)."""
    return "frozen" if on_fixed_features(trainable) or weights.lower() != "none" else "train"


#: Settings :func:`describe_settings` leaves out: where and how this machine runs it, and records of the run itself.
_NOT_DESCRIBED = ("runs_dir", "name", "chosen", "sources", *MACHINE_FIELDS)


def describe_settings(cfg: TrainConfig) -> str:
    """One line: every non-default setting grouped by source (one not in ``sources`` counts as given)."""
    defaults = TrainConfig()
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in _NOT_DESCRIBED or (f.name not in cfg.sources and value == getattr(defaults, f.name)):
            continue
        if isinstance(value, list):
            value = f"{len(value)} file(s)"
        elif isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        groups.setdefault(cfg.sources.get(f.name, GIVEN), []).append(f"{f.name}={value}")
    if not groups:
        return "settings: the defaults"
    return "settings: " + "; ".join(f"{source}: {' '.join(items)}" for source, items in groups.items())
