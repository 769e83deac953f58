"""Choosing the method and its learning rate on the user's own labels (``--method auto``; docs/choosing.md): linear
heads of every candidate at every :data:`CANDIDATE_LRS` on cached features, one process per core, cross-fitted and
scored by :data:`CHOICE_CRITERION` without full val labels; ``an`` stays unless a candidate beats it beyond the noise
(:func:`pick`), and an audit list can overrule that."""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.data.audit_list import load_audit
from models.data.dataset import SkipReporter
from models.evaluation.expected_positives import CHOOSER_K, ExpectedPositives, estimate_k
from models.network import MultiLabelNet
from train.config import HEAD_EPOCHS, METHOD_AUTO, TrainConfig, resolve_model_defaults
from train.console import log
from train.cross_fitting import Pool, fold_data, labelled_pool
from train.distributed import current_world
from train.feature_cache import FeatureCache, split_feature_key
from train.fixed_features import FixedFeaturePhase, HeadOptimisation, JointTraining, head_threads, joint_groups
from train.methods import BASELINE, METHODS, EpochEndContext, get_method, make_hparams
from train.prepared_run import (
    RunData,
    build_method,
    build_run_model,
    expected_positives_for_run,
    initialise_head_bias,
    load_run_data,
    prior_positives,
    resolve_precision,
    run_preprocessing,
    seed_everything,
    use_channels_last,
)
from train.selection import CRITERIA, Assessment, DatasetForward, Rows, resolve_criterion

__all__ = ["AUDIT_CRITERION", "AUDIT_Z", "CANDIDATE_LRS", "CHOICE_CRITERION", "CONTENDERS", "GUARD_CRITERION",
           "MIN_AUDITED", "SWITCH_Z", "VETO_Z", "Candidate", "CandidateResult", "Choice", "apply_choice",
           "audited_rows", "candidate_methods", "choice_table", "choose", "choose_on_scores", "describe_choice",
           "extract_features", "fit_candidate", "left_out", "out_of_fold_logits", "paired_difference", "pick",
           "prepare"]

#: The learning rates every candidate method is trained with (the run's optimiser and schedule).
CANDIDATE_LRS: tuple[float, ...] = (1e-2, 2e-3, 5e-4)
#: How candidates are compared without full validation labels (a name of :data:`train.selection.CRITERIA`).
CHOICE_CRITERION = "observed-rank"
#: A contender must also score at least the baseline's by this criterion to replace it (cross-fitted choice only).
GUARD_CRITERION = "observed-map"
#: How many of the best-scoring candidates are tested against the baseline.
CONTENDERS = 5
#: A contender replaces the baseline when its score is higher by at least this many standard errors (one-sided 95%).
SWITCH_Z = 1.645
#: With an audit list (``--audit``): the label-free pick, the candidates that passed its test and the baseline are
#: compared by this criterion of their cross-fitted scores of the audited images against their full labels (class AUC).
AUDIT_CRITERION = "observed-auc"
#: The least number of audited training or validation images the choice is made on.
MIN_AUDITED = 10
#: An audit's margins in standard errors: a candidate that passed the label-free test replaces the pick at AUDIT_Z, the
#: baseline replaces that at VETO_Z (picked on the validation images the audits left out: docs/choosing.md).
AUDIT_Z, VETO_Z = 0.5, 1.645
#: Bootstrap resamples of the scored images for a paired difference.
RESAMPLES = 200
BOOTSTRAP_SEED = 0


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
    """A trained candidate: its score (-inf when it failed), why it failed, its epoch, validation logits and time."""

    candidate: Candidate
    score: float = -math.inf
    failed: str = ""
    best_epoch: int = 0
    selection_score: float = -math.inf
    val_logits: np.ndarray | None = None
    scored_logits: np.ndarray | None = None  # the logits of the features given as ``scored``, at that epoch
    seconds: float = 0.0
    versus_baseline: tuple[float, float] | None = None  # paired difference to the baseline: mean, standard error
    qualified: bool = False  # it passed :func:`pick`'s test against the baseline


@dataclass
class Choice:
    """The chooser's result: the choice, every candidate's result, how they were compared, and k if estimated."""

    chosen: Candidate
    results: list[CandidateResult]
    criterion: str
    cross_fitted: bool
    baseline: Candidate
    expected_positives: ExpectedPositives | None = None
    seconds: float = 0.0
    label_free: Candidate | None = None  # the pick by the labels as given, before an audit had its say

    def record(self) -> dict[str, Any]:
        """What config.json keeps of the choice."""
        return {"method": self.chosen.method, "lr": self.chosen.lr, "criterion": self.criterion,
                "label_free": self.label_free.name if self.label_free else None,
                "cross_fitted": self.cross_fitted, "baseline": self.baseline.name, "seconds": round(self.seconds, 1),
                "versus_baseline": {r.candidate.name: [round(v, 4) for v in r.versus_baseline]
                                    for r in self.results if r.versus_baseline is not None},
                "expected_positives": self.expected_positives.to_dict() if self.expected_positives else None,
                "candidates": {r.candidate.name: (None if r.failed else round(r.score, 4)) for r in self.results}}


def left_out() -> dict[str, str]:
    """The methods the chooser leaves out (their ``left_out_of_auto``), with the measurement why."""
    return {name: method.left_out_of_auto for name, method in sorted(METHODS.items()) if method.left_out_of_auto}


def candidate_methods(train_observed: np.ndarray) -> list[str]:
    """The methods the chooser tries: those that train a head on fixed features from the user's labels (no oracles, no
    feature-map or CLIP methods, none :func:`left_out`; ``iu`` only with observed negatives)."""
    out = []
    for name in sorted(METHODS):
        method = METHODS[name]
        if (method.trains_on_full_labels or method.required_head or method.uses_pseudo_labels
                or method.left_out_of_auto):
            continue
        if method.uses_observed_negatives and not bool((np.asarray(train_observed) < 0).any()):
            continue
        out.append(name)
    return out


def extract_features(cfg: TrainConfig, data: RunData, model: MultiLabelNet, forward: DatasetForward,
                     splits: tuple[str, ...] = ("train", "val")) -> dict[str, Rows]:
    """The backbone features of ``splits`` from the feature cache, keyed as a ``--trainable head`` run's."""
    precision = str(resolve_precision(cfg.amp, forward.device).dtype or "float32")
    key_of = split_feature_key(cfg.arch, model, forward.eval_transform, precision)
    cache = FeatureCache()
    out = {}
    model.eval()
    present = [(split, images) for split in splits if (images := getattr(data.splits, split)) is not None]
    built: list[Callable[[torch.Tensor], torch.Tensor]] = []  # one backbone forward, for the splits left to extract
    for i, (split, images) in enumerate(present):

        def compute(images: Any = images, split: str = split, i: int = i) -> Rows:
            if not built:
                built.append(forward.fixed_features(model, sum(len(rest) for _, rest in present[i:])))
            return forward.rows(built[0], forward.eval_loader(images), model.num_features, f"features ({split})")

        key = key_of(images)
        with torch.random.fork_rng(devices=[forward.device] if forward.device.type == "cuda" else []):
            out[split], _ = cache.get(key, compute)
    return out


EpochObserver = Callable[[Candidate, int, MultiLabelNet, FixedFeaturePhase, Assessment], None]


def fit_candidate(candidate: Candidate, cfg: TrainConfig, data: RunData, model: MultiLabelNet,
                  forward: DatasetForward, features: dict[str, Rows], k: ExpectedPositives | None,
                  observer: EpochObserver | None = None) -> CandidateResult:
    """Train a fresh head of ``model`` for ``candidate`` on ``data``'s training features and keep the epoch the run's
    criterion picks on validation, with its validation logits (and those of ``features["scored"]``, NaN rows for
    unreadable images). ``observer`` is called after every epoch."""
    return _fit_heads(candidate, cfg, model, forward, [(data, features)], k, observer)[0]


def _fit_heads(candidate: Candidate, cfg: TrainConfig, model: MultiLabelNet, forward: DatasetForward,
               fits: list[tuple[RunData, dict[str, Rows]]], k: ExpectedPositives | None,
               observer: EpochObserver | None = None) -> list[CandidateResult]:
    """:func:`fit_candidate` of each (data, features) of ``fits``, each with its own head, trained together where they
    can; all fail when one cannot be built or diverges."""
    started = time.perf_counter()
    results = [CandidateResult(candidate) for _ in fits]
    phases = []
    for i, (data, features) in enumerate(fits):
        made = _phase(candidate, cfg, data, model, forward, features, k, own_head=i < len(fits) - 1)
        if isinstance(made, str):
            for result in results:
                result.failed = made
            return results
        phases.append(made)
    for joint, members in [(JointTraining([phases[i] for i in group]), group) for group in joint_groups(phases)]:
        try:
            for epoch in range(1, cfg.epochs + 1):
                joint.train_epoch(epoch)
                for i in members:
                    phase, result, features = phases[i], results[i], fits[i][1]
                    phase.method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=phase.predict_train))
                    assessment = phase.validate(metrics=observer is not None)  # the chooser reads the score
                    if observer is not None:
                        observer(candidate, epoch, model, phase, assessment)
                    if assessment.score > result.selection_score:
                        result.best_epoch, result.selection_score = epoch, assessment.score
                        result.val_logits = assessment.logits
                        if "scored" in features:
                            result.scored_logits = _head_logits(phase.head, features["scored"])
        except FloatingPointError as exc:
            for result in results:
                result.failed = f"diverged ({exc})"
            break
    for result in results:
        result.seconds = time.perf_counter() - started
    return results


def _phase(candidate: Candidate, cfg: TrainConfig, data: RunData, model: MultiLabelNet, forward: DatasetForward,
           features: dict[str, Rows], k: ExpectedPositives | None, own_head: bool) -> FixedFeaturePhase | str:
    """The fixed-feature phase of ``candidate`` on ``data`` (head reset, bias set, method built), or why not."""
    splits = data.splits
    method_cls = get_method(candidate.method)
    run_cfg = resolve_model_defaults(dataclasses.replace(cfg, method=candidate.method, lr=candidate.lr,
                                                         head_bias="auto"))
    seed_everything(cfg.seed)
    for module in model.head.modules():
        if isinstance(module, torch.nn.Linear):
            module.reset_parameters()
    expected = k if method_cls.uses_expected_positives else None
    if method_cls.uses_expected_positives and expected is None:
        expected = expected_positives_for_run(method_cls, run_cfg, splits, data.dataset.family)
    try:
        hparams = make_hparams(method_cls, dict(cfg.hp), data.dataset.family)
        method = build_method(method_cls, hparams, run_cfg, splits, data.dataset.name, cfg.epochs,
                              model.num_features, forward.device, expected)
    except ValueError as exc:
        return str(exc)
    prior_k, source = prior_positives(run_cfg, splits, data.dataset.family, expected)
    initialise_head_bias(model, run_cfg, [], prior_k, source)
    observed = torch.from_numpy((splits.train_observed > 0).astype(np.float32))
    negatives = torch.from_numpy((splits.train_observed < 0).astype(np.float32))
    optimisation = HeadOptimisation(cfg.optimizer, candidate.lr, cfg.epochs, cfg.weight_decay, cfg.momentum,
                                    cfg.scheduler)
    rule = resolve_criterion(cfg.select, splits.has_full_labels("val"))
    return FixedFeaturePhase(model, method, forward, splits.train, splits.val, observed, negatives, None,
                             optimisation, cfg.batch_size, cfg.seed, rule.criterion, splits.has_full_labels("val"),
                             features=features, head=copy.deepcopy(model.head) if own_head else None)


def _head_logits(head: torch.nn.Module, rows: Rows) -> np.ndarray:
    """The head's logits of cached feature ``rows`` (eval mode, one thread), NaN for unreadable images."""
    was_training = head.training
    head.eval()
    with torch.inference_mode(), head_threads():
        logits = head(rows.values.to(next(head.parameters()).device)).float().cpu().numpy()
    head.train(was_training)
    logits[~rows.present.numpy()] = np.nan
    return logits


def out_of_fold_logits(candidate: Candidate, cfg: TrainConfig, data: RunData, model: MultiLabelNet,
                       forward: DatasetForward, pool: Pool, k: ExpectedPositives | None) -> tuple[np.ndarray, str]:
    """Cross-fitted logits of ``candidate`` for every image of ``pool`` (NaN rows for unreadable images; held-out rows
    too, :func:`train.cross_fitting.fold_data`) and why a fold failed ("" when none did)."""
    logits = np.full((len(pool), len(data.splits.classes)), np.nan, dtype=np.float32)
    folds = range(int(pool.folds.max()) + 1)
    results = _fit_heads(candidate, cfg, model, forward, [fold_data(data, pool, fold) for fold in folds], k)
    for fold, result in zip(folds, results, strict=True):
        if result.failed or result.scored_logits is None:
            return logits, result.failed or "no epoch could be scored"
        logits[(pool.folds == fold) | (pool.folds == -1 - fold)] = result.scored_logits
    return logits, ""


def head_config(cfg: TrainConfig) -> TrainConfig:
    """The candidates' settings: ``cfg`` on fixed features, the head's defaults unless ``--trainable head``."""
    if not cfg.fixed_features:
        head = TrainConfig()
        cfg = dataclasses.replace(cfg, epochs=HEAD_EPOCHS, lr=head.lr, scheduler=head.scheduler)
    method = BASELINE if cfg.method == METHOD_AUTO else cfg.method
    return resolve_model_defaults(dataclasses.replace(cfg, trainable="head", method=method, head_bias="auto",
                                                      linear_init=0))


def prepare(cfg: TrainConfig) -> tuple[RunData, MultiLabelNet, DatasetForward, dict[str, Rows]]:
    """Load the run's data, build its frozen backbone and extract the training and validation features."""
    cfg = head_config(cfg)
    seed_everything(cfg.seed)
    data = load_run_data(cfg)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)
    precision = resolve_precision(cfg.amp, device)
    channels_last = use_channels_last(cfg.channels_last, device, cfg.arch)
    model = build_run_model(cfg, len(data.splits.classes), "linear", device, channels_last)
    forward = DatasetForward(run_preprocessing(cfg), device, precision.autocast, channels_last, SkipReporter(),
                             cfg.eval_batch_size, cfg.workers, cfg.progress)
    return data, model, forward, extract_features(cfg, data, model, forward)


def choose(cfg: TrainConfig, methods: list[str] | None = None, lrs: tuple[float, ...] = CANDIDATE_LRS,
           criterion: str = CHOICE_CRITERION,
           prepared: tuple[RunData, MultiLabelNet, DatasetForward, dict[str, Rows]] | None = None) -> Choice:
    """Train and score every candidate (``methods`` x ``lrs``) on fixed features of ``cfg``'s data; returns the
    :class:`Choice`. ``prepared``: :func:`prepare`'s output when the caller has it."""
    started = time.perf_counter()
    head_cfg = head_config(cfg)
    data, model, forward, features = prepared if prepared is not None else prepare(head_cfg)
    splits = data.splits
    listed = [m.strip() for m in cfg.candidates.split(",") if m.strip()]
    names = list(dict.fromkeys([BASELINE, *(methods or listed or candidate_methods(splits.train_observed))]))
    baseline = Candidate(BASELINE, head_cfg.lr)
    lrs = tuple(dict.fromkeys([*lrs, head_cfg.lr]))
    cross_fitted = not splits.has_full_labels("val")
    pool = labelled_pool(data, features) if cross_fitted else None
    used = criterion if cross_fitted else "val_mAP"
    log(f"choose: {len(names)} methods x {len(lrs)} learning rates on fixed {head_cfg.arch} features, "
        + (f"cross-fitted over the {len(pool)} training and validation images ({int(pool.folds.max()) + 1} folds), "
           f"compared by {criterion}" if pool is not None else "compared by the val mAP (full val labels)"))
    results: list[CandidateResult] = []
    # the baseline first (its scores estimate k for the candidates that need it), then the others
    first = [Candidate(BASELINE, lr) for lr in (head_cfg.lr, *[x for x in lrs if x != head_cfg.lr])]
    rest = [Candidate(name, lr) for name in names if name != BASELINE for lr in lrs]
    shared = _Shared(head_cfg, data, model, forward, features, pool, None, criterion)
    for result in _score_all(first, rest, shared, lambda done: _expected_positives(head_cfg, data, pool, done)):
        results.append(result)
        outcome = f"failed: {result.failed}" if result.failed else f"{used} {result.score:.2f}"
        log(f"choose: {result.candidate.name:<16} {outcome}  [{result.seconds:.1f} s]")
    k = shared.k
    audit = audited_rows(cfg.audit, pool) if pool is not None and cfg.audit else None
    if pool is None:  # full validation labels: the val mAP, the same switching rule
        chosen = pick(results, baseline, CRITERIA[used], splits.val.labels)
        label_free = chosen
    else:
        chosen, label_free = choose_on_scores(results, baseline, pool.images.labels, audit, criterion)
        if audit is not None:
            used = f"{criterion}, then the class AUC of {len(audit[0])} audited images"
    for r in results:
        r.val_logits = None  # the table keeps scores only
    return Choice(chosen, results, used, cross_fitted, baseline, k, time.perf_counter() - started, label_free)


@dataclass
class _Shared:
    """What scoring a candidate reads besides the candidate (inherited by the worker processes of a parallel choice)."""

    cfg: TrainConfig
    data: RunData
    model: MultiLabelNet
    forward: DatasetForward
    features: dict[str, Rows]
    pool: Pool | None
    k: ExpectedPositives | None
    criterion: str


def score_candidate(candidate: Candidate, shared: _Shared) -> CandidateResult:
    """One candidate's result: cross-fitted over the pool and scored against the observed labels, or (no pool) fitted
    once and scored by its selection score, with its validation logits."""
    started = time.perf_counter()
    s = shared
    if s.pool is not None:
        logits, failed = out_of_fold_logits(candidate, s.cfg, s.data, s.model, s.forward, s.pool, s.k)
        result = CandidateResult(candidate, failed=failed)
        if not failed:
            result.score = _rows_score(CRITERIA[s.criterion], logits, s.pool.images.labels)
            result.val_logits = logits
    else:
        result = fit_candidate(candidate, s.cfg, s.data, s.model, s.forward, s.features, s.k)
        result.score = result.selection_score
        if result.val_logits is not None:
            present = s.features["val"].present.numpy()
            rows = np.full((len(present), result.val_logits.shape[1]), np.nan, dtype=np.float32)
            rows[present] = result.val_logits
            result.val_logits = rows
    result.seconds = time.perf_counter() - started
    return result


def choice_processes(device: torch.device) -> int:
    """How many candidates train at once: one per usable core on a forkable CPU run outside torchrun, else one."""
    if device.type != "cpu" or current_world().distributed or "fork" not in mp.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_SHARED: _Shared | None = None  # set while a process pool of a choice runs: its workers inherit it when forked


def _start_worker() -> None:
    # one intra-op thread from the start: the parent's thread pool does not survive the fork, and a parallel
    # region the child opens on it never returns
    torch.set_num_threads(1)


def _score_in_worker(candidate: Candidate, k: ExpectedPositives | None) -> CandidateResult:
    assert _SHARED is not None
    return score_candidate(candidate, _SHARED if k is None else dataclasses.replace(_SHARED, k=k))


def _score_all(first: list[Candidate], rest: list[Candidate], shared: _Shared,
               estimate: Callable[[list[CandidateResult]], ExpectedPositives | None]) -> Iterator[CandidateResult]:
    """The results of ``first``, then of ``rest``, in order, with k estimated from ``first``'s before a candidate that
    reads it trains; in forked processes (:func:`choice_processes`) where possible, else one after the other."""
    global _SHARED
    later = [c for c in rest if METHODS[c.method].uses_expected_positives]
    done: dict[Candidate, CandidateResult] = {}
    estimated = False
    if min(choice_processes(shared.forward.device), len(first) + len(rest)) > 1:
        _SHARED = shared
        try:
            with ProcessPoolExecutor(choice_processes(shared.forward.device), mp_context=mp.get_context("fork"),
                                     initializer=_start_worker) as executor:
                futures = {c: executor.submit(_score_in_worker, c, None) for c in first + rest if c not in later}
                for candidate in first:
                    done[candidate] = futures[candidate].result()
                    yield done[candidate]
                shared.k, estimated = estimate([done[c] for c in first]), True
                futures.update({c: executor.submit(_score_in_worker, c, shared.k) for c in later})
                for candidate in rest:
                    done[candidate] = futures[candidate].result()
                    yield done[candidate]
        except RuntimeError as exc:  # this process ran autograd in threads before: forked children may not train
            if "fork" not in str(exc):
                raise
            log("note: this process cannot train heads in forked workers (PyTorch: autograd threads were started "
                "before); the remaining candidates train one after the other")
        finally:
            _SHARED = None
    for candidate in first:
        if candidate not in done:
            done[candidate] = score_candidate(candidate, shared)
            yield done[candidate]
    if not estimated:
        shared.k = estimate([done[c] for c in first])
    for candidate in rest:
        if candidate not in done:
            yield score_candidate(candidate, shared)


def choose_on_scores(results: list[CandidateResult], baseline: Candidate, observed: np.ndarray,
                     audit: tuple[np.ndarray, np.ndarray] | None = None, criterion: str = CHOICE_CRITERION,
                     label_free: Candidate | None = None, margins: tuple[float, float] = (AUDIT_Z, VETO_Z),
                     ) -> tuple[Candidate, Candidate]:
    """(The choice, the label-free pick) from the candidates' cross-fitted scores and the observed labels (:func:`pick`
    guarded by :data:`GUARD_CRITERION`); with ``audit`` (rows, full labels), a candidate that passed that test replaces
    the pick when it beats it by ``margins[0]`` standard errors of :data:`AUDIT_CRITERION`, the baseline replaces that
    choice at ``margins[1]``. ``label_free``: the pick when known (the results carry its ``qualified`` marks)."""
    if label_free is None:
        label_free = pick(results, baseline, CRITERIA[criterion], observed, CRITERIA[GUARD_CRITERION])
    if audit is None:
        return label_free, label_free
    rows, labels = audit
    criterion = CRITERIA[AUDIT_CRITERION]
    audited = [dataclasses.replace(r, val_logits=r.val_logits[rows], versus_baseline=None, qualified=False,
                                   score=_rows_score(criterion, r.val_logits[rows], labels)) for r in results
               if r.val_logits is not None and not r.failed and (r.qualified or r.candidate in (label_free, baseline))]
    chosen = pick([r for r in audited if r.candidate != baseline or baseline == label_free], label_free, criterion,
                  labels, z=margins[0])
    vetoed = pick([r for r in audited if r.candidate in (chosen, baseline)], chosen, criterion, labels, z=margins[1])
    return vetoed, label_free


def audited_rows(spec: str, pool: Pool) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows of ``pool`` the audit list labels fully and their labels; None below :data:`MIN_AUDITED`."""
    audit = load_audit(spec, list(pool.images.classes))
    where = {Path(p).resolve(): i for i, p in enumerate(pool.images.paths)}
    found = [(where[Path(p).resolve()], row) for p, row in zip(audit.paths, audit.labels, strict=True)
             if Path(p).resolve() in where]
    found = [(i, row) for i, row in found if pool.features.present[i]]
    left = len(audit) - len(found)
    if len(found) < MIN_AUDITED:
        log(f"choose: {len(found)} of the {len(audit)} audited images are training or validation images of this run "
            f"(at least {MIN_AUDITED} are needed to choose on them): the choice goes by the labels as given")
        return None
    if left:
        log(f"choose: {left} of the {len(audit)} audited images are not training or validation images of this run "
            "(or unreadable): they are left out of the choice")
    return np.array([i for i, _ in found]), np.stack([row for _, row in found])


def paired_difference(criterion: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray,
                      labels: np.ndarray, resamples: int = RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """``criterion(a) - criterion(b)`` on the same images and its bootstrap standard error (NaN rows left out)."""
    keep = ~(np.isnan(a).any(1) | np.isnan(b).any(1))
    a, b, labels = a[keep], b[keep], labels[keep]
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(resamples):
        rows = rng.integers(0, len(labels), len(labels))
        diffs.append(criterion(a[rows], labels[rows]) - criterion(b[rows], labels[rows]))
    diffs = [d for d in diffs if math.isfinite(d)]
    if len(diffs) < 2:
        return math.nan, math.nan
    return float(criterion(a, labels) - criterion(b, labels)), float(np.std(diffs, ddof=1))


def pick(results: list[CandidateResult], baseline: Candidate, criterion: Callable[[np.ndarray, np.ndarray], float],
         labels: np.ndarray, guard: Callable[[np.ndarray, np.ndarray], float] | None = None,
         z: float | None = None) -> Candidate:
    """The baseline, unless one of the :data:`CONTENDERS` best candidates beats it by ``z`` bootstrap standard errors of
    ``criterion`` (and, with ``guard``, is not worse on it); records each contender's ``versus_baseline``."""
    z = SWITCH_Z if z is None else z
    scored = [r for r in results if not r.failed and math.isfinite(r.score) and r.val_logits is not None]
    if not scored:
        raise ValueError("no candidate method could be trained and scored on this data")
    base = next((r for r in scored if r.candidate == baseline), None)
    if base is None:  # the baseline failed: the best score, without a test
        return max(scored, key=lambda r: r.score).candidate
    contenders = sorted((r for r in scored if r.candidate != baseline and r.score > base.score),
                        key=lambda r: -r.score)[:CONTENDERS]
    for r in contenders:
        assert r.val_logits is not None and base.val_logits is not None
        r.versus_baseline = paired_difference(criterion, r.val_logits, base.val_logits, labels)
        mean, error = r.versus_baseline
        r.qualified = math.isfinite(error) and error > 0 and mean >= z * error and (
            guard is None or _rows_score(guard, r.val_logits, labels) >= _rows_score(guard, base.val_logits, labels))
    qualified = [r for r in contenders if r.qualified]
    return max(qualified, key=lambda r: r.versus_baseline[0]).candidate if qualified else baseline


def _rows_score(criterion: Callable[[np.ndarray, np.ndarray], float], logits: np.ndarray, labels: np.ndarray) -> float:
    """``criterion`` over the rows of ``logits`` without a NaN (unreadable images); -inf when it is undefined."""
    keep = ~np.isnan(logits).any(1)
    value = float(criterion(logits[keep], labels[keep]))
    return -math.inf if math.isnan(value) else value


def _expected_positives(cfg: TrainConfig, data: RunData, pool: Pool | None,
                        an_results: list[CandidateResult]) -> ExpectedPositives | None:
    """k for the candidates: the run's own source if any, else estimated from the best ``an`` head's scores."""
    probe = next((m for m in METHODS.values() if m.uses_expected_positives), None)
    if probe is None:
        return None
    known = expected_positives_for_run(probe, cfg, data.splits, data.dataset.family)
    usable = [r for r in an_results if r.val_logits is not None and not r.failed]
    if (known is not None and known.known) or pool is None or not usable:
        return known
    best = max(usable, key=lambda r: r.score)
    assert best.val_logits is not None
    keep = ~np.isnan(best.val_logits).any(1)
    estimate = estimate_k(best.val_logits[keep], pool.images.labels[keep])
    return ExpectedPositives(estimate.k, "estimated", f"{CHOOSER_K}: from the cross-fitted scores of "
                             f"{best.candidate.name} over {int(keep.sum())} training and validation images",
                             estimate)


def apply_choice(cfg: TrainConfig, choice: Choice) -> TrainConfig:
    """``cfg`` set to train the choice, recorded in ``chosen`` (with k when estimated)."""
    chosen = choice.chosen
    if cfg.fixed_features:
        settings: dict[str, Any] = {"method": chosen.method, "lr": chosen.lr}
    else:
        settings = {"method": chosen.method, "linear_init": HEAD_EPOCHS, "linear_init_lr": chosen.lr}
    sources = {**cfg.sources, **dict.fromkeys(settings, "--method auto")}
    return resolve_model_defaults(dataclasses.replace(cfg, **settings, chosen=choice.record(), sources=sources))


def choice_table(choice: Choice) -> str:
    """The chooser's table: each method's best learning rate and score, baseline and choice always, best first."""
    best: dict[str, CandidateResult] = {}
    for r in choice.results:
        if not r.failed and (r.candidate.method not in best or r.score > best[r.candidate.method].score):
            best[r.candidate.method] = r
    rows = list(best.values())
    for r in choice.results:  # the chosen candidate and the baseline are always shown
        if (r.candidate in (choice.chosen, choice.baseline)) and not r.failed and r not in rows:
            rows.append(r)
    lines = [f"{'method':<10} {'lr':>8} {choice.criterion:>14}   vs {choice.baseline.name} (paired, +- 1 s.e.)"]
    for r in sorted(rows, key=lambda r: -r.score):
        versus = "" if r.versus_baseline is None else f"{r.versus_baseline[0]:+.2f} +- {r.versus_baseline[1]:.2f}"
        mark = "  <- chosen" if r.candidate == choice.chosen else ("  (baseline)" if r.candidate == choice.baseline
                                                                   else "")
        lines.append(f"{r.candidate.method:<10} {r.candidate.lr:>8g} {r.score:>14.2f}   {versus:<18}{mark}")
    failed = sorted({f"{r.candidate.name} ({r.failed})" for r in choice.results if r.failed})
    if failed:
        lines.append("failed: " + "; ".join(failed))
    return "\n".join(lines)


def describe_choice(choice: Choice) -> str:
    """One line: what was chosen, by which criterion, among how many candidates, in how long."""
    methods = len({r.candidate.method for r in choice.results})
    lrs = len({r.candidate.lr for r in choice.results})
    how = "cross-fitted over the training and validation images" if choice.cross_fitted else "on the val split"
    audited = "audited images" in choice.criterion and choice.cross_fitted
    first = choice.label_free or choice.chosen
    basis = f"{SWITCH_Z:g} standard errors of {choice.criterion.split(',')[0]}"
    why = (f"no candidate beat the baseline {choice.baseline.name} by {basis}" if first == choice.baseline else
           f"{first.name} beat the baseline {choice.baseline.name} by {basis}"
           + (f" and did not lose to it by {GUARD_CRITERION}" if choice.cross_fitted else ""))
    if audited:
        margin = VETO_Z if choice.chosen == choice.baseline else AUDIT_Z
        why += ("; the audit kept it" if choice.chosen == first else f"; by {choice.criterion.split(', then ')[-1]}, "
                f"{choice.chosen.name} beat it by {margin:g} standard errors")
    return (f"choose: {choice.chosen.method} at lr {choice.chosen.lr:g}: {why}, {how}, among {methods} methods x "
            f"{lrs} learning rates on fixed features ({choice.seconds:.0f} s)")
