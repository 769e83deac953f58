"""Choosing the method and its learning rate on the user's own labels: ``python -m train --method auto``.

Which single-positive method works best depends on the data: the rankings of the package's development sets differ
(bench/README.md, choices that hold), so no fixed recommendation holds. The chooser measures them on the data at
hand, from the labels the user has:

1. the backbone's features of the training and validation images are computed once (the feature cache of
   ``--trainable head``);
2. a linear head is trained on them for every candidate method (:func:`candidate_methods`) at every learning rate of
   :data:`CANDIDATE_LRS` - the seeds' fixed-feature mode, the same phase ``python -m train --trainable head`` runs,
   seconds per head;
3. each head keeps the epoch that the run's selection criterion picks on val (``--select``, label-free without full
   validation labels), and each is scored at that epoch by the CHOICE criterion (:data:`CHOICE_CRITERION`); the
   candidate with the highest score is the choice. On ties (within :data:`TIE_MARGIN`) the baseline ``an`` wins.

The choice criterion compares whole models, not epochs of one model: per class, how well the observed positives of
the validation images rank among all validation images. When the observed positives are a random sample of the
positives, the AUC against observed labels is an increasing affine function of the true AUC (Menon et al. 2015), so
it ranks models as the true AUC would; measured across methods on every development set (bench/README.md).

k (the expected positives per image) for the methods that need it comes from the usual sources
(train/expected_positives.py); when it would be estimated, it is estimated once from the best ``an`` head's
validation scores and given to every candidate that needs it (and to the final run).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.network import MultiLabelNet
from train.config import TrainConfig, resolve_model_defaults
from train.data.dataset import SkipReporter
from train.expected_positives import ExpectedPositives, estimate_expected_positives
from train.feature_cache import FeatureCache, feature_key, weights_digest
from train.fixed_features import FixedFeaturePhase, HeadOptimisation
from train.inference import DatasetForward, Rows
from train.label_free_selection import LABEL_FREE_CRITERIA
from train.methods import BASELINE, METHODS, EpochEndContext, get_method, make_hparams
from train.run_setup import (
    RunData,
    build_method,
    build_run_model,
    expected_positives_for_run,
    initialise_head_bias,
    load_run_data,
    log,
    prior_positives,
    resolve_precision,
    run_preprocessing,
    seed_everything,
    use_channels_last,
)
from train.selection import CRITERIA, Assessment, resolve_criterion

__all__ = [
    "CANDIDATE_LRS",
    "CHOICE_CRITERION",
    "Candidate",
    "CandidateResult",
    "Choice",
    "FeatureData",
    "candidate_methods",
    "choice_table",
    "choose",
    "extract_features",
    "fit_candidate",
]

#: The learning rates every candidate method is trained with (the run's optimiser and schedule).
CANDIDATE_LRS: tuple[float, ...] = (1e-2, 2e-3, 5e-4)
#: How candidates are compared (a name of :data:`train.selection.CRITERIA`).
CHOICE_CRITERION = "observed-auc"
#: A candidate must beat ``an``'s score by more than this to be chosen over it (criterion units).
TIE_MARGIN = 0.0


@dataclass(frozen=True)
class Candidate:
    """One head to train: a method at a learning rate."""

    method: str
    lr: float

    @property
    def name(self) -> str:
        """``method@lr``."""
        return f"{self.method}@{self.lr:g}"


@dataclass
class CandidateResult:
    """A trained candidate: its selected epoch, the selection criterion's value there, the choice criterion's value
    there (``score``), its validation logits at that epoch, or why it failed."""

    candidate: Candidate
    best_epoch: int = 0
    selection_score: float = -math.inf
    score: float = -math.inf
    val_logits: np.ndarray | None = None
    seconds: float = 0.0
    failed: str = ""


@dataclass
class FeatureData:
    """What every candidate trains on: the backbone's features of the training and validation images, the
    observed training labels (1 positive, -1 observed negative, 0 unknown) and the validation labels."""

    train: Rows
    val: Rows
    train_observed: np.ndarray
    val_labels: np.ndarray
    val_full_labels: bool


@dataclass
class Choice:
    """The chooser's result: the chosen candidate, every candidate's result, and k when it was estimated here."""

    chosen: Candidate
    results: list[CandidateResult]
    criterion: str
    selection: str
    expected_positives: ExpectedPositives | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def candidate_methods(train_observed: np.ndarray) -> list[str]:
    """The methods the chooser tries: every registered method that trains a head on fixed features from the labels
    a user has - not the oracles (full labels), not those that need feature maps (``lac``) or CLIP pseudo-labels, and
    ``iu`` only where some negatives are observed."""
    has_negatives = bool((np.asarray(train_observed) < 0).any())
    out = []
    for name in sorted(METHODS):
        method = METHODS[name]
        if method.trains_on_full_labels or method.required_head or method.uses_pseudo_labels:
            continue
        if method.uses_observed_negatives != has_negatives and method.uses_observed_negatives:
            continue
        if method.observed_negatives_refusal(train_observed) is not None:
            continue
        out.append(name)
    return out


def feature_key_function(cfg: TrainConfig, model: MultiLabelNet, forward: DatasetForward,
                         precision: str) -> Callable[[Any], dict[str, Any]]:
    """The feature-cache key of a split for ``model``'s backbone with ``cfg``'s preprocessing (as the trainer's)."""
    backbone = weights_digest(model.backbone)
    transform = forward.eval_transform
    preprocessing = {"image_size": transform.image_size, "mean": list(transform.mean), "std": list(transform.std),
                     "interpolation": transform.interpolation, "crop": transform.crop}

    def key(images: Any) -> dict[str, Any]:
        return feature_key(list(images.paths), cfg.arch, backbone, preprocessing, precision)

    return key


def extract_features(cfg: TrainConfig, data: RunData, model: MultiLabelNet, forward: DatasetForward,
                     splits: tuple[str, ...] = ("train", "val")) -> dict[str, Rows]:
    """The backbone features of ``splits`` (from the feature cache, computed and stored the first time)."""
    precision = str(resolve_precision(cfg.amp, forward.device).dtype or "float32")
    key = feature_key_function(cfg, model, forward, precision)
    cache = FeatureCache()
    out = {}
    model.eval()
    for split in splits:
        images = getattr(data.splits, split)
        if images is None:
            continue

        def compute(images: Any = images, split: str = split) -> Rows:
            return forward.rows(model.features, forward.eval_loader(images), model.num_features, f"features ({split})")

        with torch.random.fork_rng(devices=[forward.device] if forward.device.type == "cuda" else []):
            out[split], _ = cache.get(key(images), compute)
    return out


EpochObserver = Callable[[Candidate, int, MultiLabelNet, FixedFeaturePhase, Assessment], None]


def fit_candidate(candidate: Candidate, cfg: TrainConfig, data: RunData, model: MultiLabelNet,
                  forward: DatasetForward, features: dict[str, Rows], k: ExpectedPositives | None,
                  choice_criterion: str = CHOICE_CRITERION,
                  observer: EpochObserver | None = None) -> CandidateResult:
    """Train a fresh head of ``model`` for ``candidate`` on the given features (``cfg``'s optimiser, schedule,
    batch size, epochs and seed) and score it: the epoch the run's selection criterion picks on val, and the choice
    criterion there. ``observer`` is called after every epoch (benchmarks score other splits with it)."""
    started = time.perf_counter()
    result = CandidateResult(candidate)
    splits = data.splits
    method_cls = get_method(candidate.method)
    run_cfg = dataclasses.replace(cfg, method=candidate.method, lr=candidate.lr, head_bias="auto")
    run_cfg = resolve_model_defaults(run_cfg)
    seed_everything(cfg.seed)
    head: MultiLabelNet = model
    for module in head.head.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()  # type: ignore[operator]
    report: list[str] = []
    expected = k if method_cls.uses_expected_positives else None
    if method_cls.uses_expected_positives and expected is None:
        expected = expected_positives_for_run(method_cls, run_cfg, splits, data.dataset.family)
    hparams = make_hparams(method_cls, dict(cfg.hp), data.dataset.family)
    try:
        method = build_method(method_cls, hparams, run_cfg, splits, data.dataset.name, cfg.epochs,
                              model.num_features, forward.device, expected)
    except ValueError as exc:
        result.failed = str(exc)
        return result
    prior_k, source = prior_positives(run_cfg, splits, data.dataset.family, expected)
    initialise_head_bias(model, run_cfg, report, prior_k, source)
    observed = torch.from_numpy((splits.train_observed > 0).astype(np.float32))
    negatives = torch.from_numpy((splits.train_observed < 0).astype(np.float32))
    optimisation = HeadOptimisation(cfg.optimizer, candidate.lr, cfg.epochs, cfg.weight_decay, cfg.momentum,
                                    cfg.scheduler)
    rule = resolve_criterion(cfg.select, splits.has_full_labels("val"))
    phase = FixedFeaturePhase(model, method, forward, splits.train, splits.val, observed, negatives, None,
                              optimisation, cfg.batch_size, cfg.seed, rule.criterion,
                              splits.has_full_labels("val"), features=features)
    choose_by = CRITERIA[choice_criterion]
    try:
        for epoch in range(1, cfg.epochs + 1):
            phase.train_epoch(epoch)
            method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=phase.predict_train))
            assessment = phase.validate()
            if observer is not None:
                observer(candidate, epoch, model, phase, assessment)
            if assessment.score > result.selection_score:
                result.best_epoch, result.selection_score = epoch, assessment.score
                result.val_logits = assessment.logits
    except FloatingPointError as exc:
        result.failed = f"diverged ({exc})"
    if result.val_logits is not None and not result.failed:
        value = choose_by(result.val_logits, data.splits.val.labels[phase.val_present.numpy()])
        result.score = -math.inf if math.isnan(value) else float(value)
    result.seconds = time.perf_counter() - started
    return result


def prepare(cfg: TrainConfig) -> tuple[RunData, MultiLabelNet, DatasetForward, dict[str, Rows]]:
    """Load the run's data, build its backbone (frozen) and extract the training and validation features."""
    cfg = resolve_model_defaults(dataclasses.replace(cfg, trainable="head"))
    seed_everything(cfg.seed)
    data = load_run_data(cfg)
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    precision = resolve_precision(cfg.amp, device)
    channels_last = use_channels_last(cfg.channels_last, device, cfg.arch)
    model = build_run_model(cfg, len(data.splits.classes), "linear", device, channels_last)
    forward = DatasetForward(run_preprocessing(cfg), device, precision.autocast, channels_last, SkipReporter(),
                             cfg.eval_batch_size, cfg.workers, cfg.progress)
    return data, model, forward, extract_features(cfg, data, model, forward)


def choose(cfg: TrainConfig, methods: list[str] | None = None, lrs: tuple[float, ...] = CANDIDATE_LRS,
           choice_criterion: str = CHOICE_CRITERION, prepared: tuple[Any, ...] | None = None,
           observer: EpochObserver | None = None) -> Choice:
    """Train every candidate (``methods`` x ``lrs``; default :func:`candidate_methods`) on fixed features of
    ``cfg``'s data and return the :class:`Choice` (module docstring). ``prepared``: the output of :func:`prepare`
    when the caller has it already."""
    started = time.perf_counter()
    head_cfg = resolve_model_defaults(dataclasses.replace(cfg, trainable="head"))
    data, model, forward, features = prepared if prepared is not None else prepare(head_cfg)
    splits = data.splits
    names = methods or candidate_methods(splits.train_observed)
    if BASELINE not in names:
        names = [BASELINE, *names]
    rule = resolve_criterion(head_cfg.select, splits.has_full_labels("val"))
    results: list[CandidateResult] = []
    k: ExpectedPositives | None = None
    for name in names:  # the baseline first: its heads estimate k for the methods that need it
        for lr in lrs:
            result = fit_candidate(Candidate(name, lr), head_cfg, data, model, forward, features, k,
                                   choice_criterion, observer)
            results.append(result)
            status = f"failed: {result.failed}" if result.failed else (
                f"{choice_criterion} {result.score:.2f} (epoch {result.best_epoch})")
            log(f"choose: {result.candidate.name:<16} {status}  [{result.seconds:.1f} s]")
        if name == BASELINE and k is None:
            k = _estimated_k(head_cfg, data, [r for r in results if r.candidate.method == BASELINE])
    scored = [r for r in results if not r.failed and math.isfinite(r.score)]
    if not scored:
        raise ValueError("no candidate method could be trained and scored on this data")
    best = max(scored, key=lambda r: r.score)
    baseline = [r for r in scored if r.candidate.method == BASELINE]
    if baseline:
        best_an = max(baseline, key=lambda r: r.score)
        if best.score - best_an.score <= TIE_MARGIN:
            best = best_an
    return Choice(best.candidate, results, choice_criterion, rule.name, k, time.perf_counter() - started)


def _estimated_k(cfg: TrainConfig, data: RunData, an_results: list[CandidateResult]) -> ExpectedPositives | None:
    """k for the candidates that need it: the run's own source when there is one (given, published, full labels,
    audit), else estimated from the validation scores of the best ``an`` head."""
    probe = next((m for m in METHODS.values() if m.uses_expected_positives), None)
    if probe is None:
        return None
    known = expected_positives_for_run(probe, cfg, data.splits, data.dataset.family)
    if known is not None and known.source != "estimated":
        return known
    usable = [r for r in an_results if r.val_logits is not None and not r.failed]
    if not usable:
        return known
    best = max(usable, key=lambda r: r.score)
    labels = data.splits.val.labels[: len(best.val_logits)] if best.val_logits is not None else None
    value = estimate_expected_positives(best.val_logits, labels)
    return ExpectedPositives(value, "estimated", f"from the validation scores of the chooser's best {BASELINE} head "
                             f"({best.candidate.name})")


def choice_table(choice: Choice) -> str:
    """The chooser's table (one row per method: its best learning rate, selected epoch and score), best first."""
    best: dict[str, CandidateResult] = {}
    for r in choice.results:
        if r.failed or not math.isfinite(r.score):
            continue
        if r.candidate.method not in best or r.score > best[r.candidate.method].score:
            best[r.candidate.method] = r
    rows = sorted(best.values(), key=lambda r: -r.score)
    lines = [f"{'method':<10} {'lr':>8} {'epoch':>6} {choice.criterion:>14} {'val ' + choice.selection:>22}"]
    for r in rows:
        mark = "  <- chosen" if r.candidate == choice.chosen else ""
        lines.append(f"{r.candidate.method:<10} {r.candidate.lr:>8g} {r.best_epoch:>6} {r.score:>14.2f} "
                     f"{r.selection_score:>22.4g}{mark}")
    failed = sorted({r.candidate.name for r in choice.results if r.failed})
    if failed:
        lines.append("failed: " + ", ".join(failed))
    return "\n".join(lines)


def describe_choice(choice: Choice) -> str:
    """One line: what was chosen, by which criterion, among how many candidates, in how long."""
    methods = len({r.candidate.method for r in choice.results})
    return (f"choose: {choice.chosen.method} at --lr {choice.chosen.lr:g} (highest val {choice.criterion} among "
            f"{methods} methods x {len({r.candidate.lr for r in choice.results})} learning rates on fixed features, "
            f"each at the epoch {choice.selection} picks; {choice.seconds:.0f} s)")


def labels_present(values: np.ndarray) -> np.ndarray:
    """Rows of a label matrix with at least one positive."""
    return np.asarray(values).sum(1) > 0


def label_free(name: str) -> bool:
    """Whether ``name`` is a label-free criterion (usable on single-positive validation labels)."""
    return name in LABEL_FREE_CRITERIA
