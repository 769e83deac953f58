"""The pseudo-label stage of a run (methods that :attr:`~train.methods.base.Method.uses_pseudo_labels`):
:func:`plan_pseudo_labels` decides where they come from before the run folder is made, :func:`prepare_pseudo_labels`
reads or computes them before the method is built (writing ``RUN/pseudo_labels.npz``), :func:`describe` reports them.
The CLIP pass leaves the random number generators as it found them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.data.observed_file import image_root, relative_paths
from models.data.protocol import ProtocolSplits
from models.data.types import DatasetSplits
from train.config import TrainConfig
from train.console import log
from train.distributed import barrier, broadcast_object, current_world, gather_objects
from train.methods.base import Method, MethodHparams
from train.pseudo_labels.clip_scores import (
    ClipChoice,
    check_available,
    class_prompts,
    load_clip,
    parse_clip,
    score_images,
    text_features,
    view_count,
)
from train.pseudo_labels.crops import select_aevlp
from train.pseudo_labels.spec import WHOLE_IMAGE, PseudoLabelSpec
from train.pseudo_labels.store import (
    FILE_NAME,
    PseudoLabelFile,
    PseudoLabelFileError,
    images_digest,
    matrix_digest,
    read,
    write,
)

CACHE, GIVEN, COMPUTE = "cache", "given", "compute"


@dataclass
class PseudoLabelPlan:
    """Where a run's pseudo-labels come from (:func:`plan_pseudo_labels`)."""

    method: str
    spec: PseudoLabelSpec
    source: str  # CACHE, GIVEN or COMPUTE
    path: Path | None  # the file read (CACHE, GIVEN)
    clip: ClipChoice  # the CLIP model of a CLIP pass (the configured one for a file, checked against it)
    prompt: str
    clip_given: bool  # --clip / --clip-prompt set explicitly: a file must match them
    prompt_given: bool


@dataclass
class PseudoLabels:
    """A run's pseudo-``positives`` (N_train, C) and the file content they were selected from."""

    positives: np.ndarray
    file: PseudoLabelFile
    origin: str

    def record(self) -> dict[str, Any]:
        """What config.json keeps of them."""
        return {"origin": self.origin, "file": FILE_NAME, **self.file.settings, **self.file.extra}


def plan_pseudo_labels(method: type[Method], hparams: MethodHparams, cfg: TrainConfig, run_dir: Path,
                       resume: bool) -> PseudoLabelPlan:
    """Decide where the pseudo-labels come from and check CLIP's weights can be had (``ValueError``)."""
    spec = method.pseudo_label_spec(hparams)
    clip = parse_clip(cfg.clip or spec.clip)
    prompt = cfg.clip_prompt or spec.prompt
    if "{}" not in prompt:
        raise ValueError(f"--clip-prompt must hold {{}} where the class name goes, got {prompt!r}")
    cached = run_dir / FILE_NAME
    if resume and cached.is_file():
        source, path = CACHE, cached
    elif cfg.pseudo_labels:
        source, path = GIVEN, Path(cfg.pseudo_labels)
        if not path.is_file():
            raise ValueError(f"--pseudo-labels {path}: no such file")
    else:
        source, path = COMPUTE, None
        error = None
        if current_world().is_main:
            try:
                check_available(clip, method.name)
            except ValueError as exc:
                error = str(exc)
        error = broadcast_object(error)
        if error:
            raise ValueError(error)
    return PseudoLabelPlan(method.name, spec, source, path, clip, prompt, bool(cfg.clip), bool(cfg.clip_prompt))


def select_positives(spec: PseudoLabelSpec, scores: dict[str, np.ndarray], readable: np.ndarray,
                     observed: np.ndarray) -> np.ndarray:
    """The pseudo-positives ``(N, C)`` of ``spec`` from the scores (none for an unreadable image)."""
    if spec.kind == WHOLE_IMAGE:
        mask = (torch.from_numpy(np.asarray(scores["global"], dtype=np.float32)) > spec.threshold).numpy()
    else:
        mask = select_aevlp(scores, np.asarray(observed) == 1, spec.top_k, spec.threshold, spec.eta,
                            spec.negative_ratio)
    return mask & np.asarray(readable, dtype=bool)[:, None]


def _check_file(plan: PseudoLabelPlan, content: PseudoLabelFile, classes: list[str]) -> None:
    """Whether a file's scores serve this run: classes, kind, scoring settings, explicit model and prompt."""
    where = content.source
    if content.classes != classes:
        raise PseudoLabelFileError(f"{where}: its {len(content.classes)} classes ({', '.join(content.classes[:3])}, "
                                   f"...) are not this run's {len(classes)} ({', '.join(classes[:3])}, ...)")
    settings = content.settings
    if settings.get("kind") != plan.spec.kind:
        raise PseudoLabelFileError(f"{where} holds {settings.get('kind')} pseudo-label scores; {plan.method} needs "
                                   f"{plan.spec.kind} scores")
    differ = [f"{key} {settings.get(key)} there, {value} here" for key, value in plan.spec.scoring().items()
              if settings.get(key) != value]
    if plan.clip_given and settings.get("clip") != str(plan.clip):
        differ.append(f"CLIP {settings.get('clip')} there, --clip {plan.clip} here")
    if plan.prompt_given and settings.get("prompt") != plan.prompt:
        differ.append(f"prompt {settings.get('prompt')!r} there, --clip-prompt {plan.prompt!r} here")
    if differ:
        raise PseudoLabelFileError(f"{where} was scored with other settings ({'; '.join(differ)}); compute the "
                                   "pseudo-labels again (without --pseudo-labels) or match its settings")


def _compute(plan: PseudoLabelPlan, splits: ProtocolSplits, paths: list[str], cfg: TrainConfig,
             device: torch.device) -> PseudoLabelFile:
    """Score every training image with CLIP (each rank a share under torchrun, gathered on every rank)."""
    world = current_world()
    images = splits.train.paths
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if world.distributed and not world.is_main:
            barrier()  # rank 0 downloads the weights first
        clip = load_clip(plan.clip, device)
        if world.distributed and world.is_main:
            barrier()
        prompts = class_prompts(splits.classes, plan.prompt)
        text = text_features(clip, prompts, device)
        rows = list(range(world.rank, len(images), world.size))
        scores, readable = score_images(clip, text, plan.spec, images, rows, device, cfg.clip_batch_size,
                                        cfg.workers, cfg.progress and world.is_main)
        size = list(clip.size)
        del clip, text
        if device.type == "cuda":
            torch.cuda.empty_cache()
    parts = gather_objects((rows, scores, readable))
    n, c = len(images), len(splits.classes)
    full = {name: np.zeros((n, c), dtype=np.float32) for name in scores}
    ok = np.zeros(n, dtype=bool)
    for part_rows, part_scores, part_readable in parts:
        for name in full:
            full[name][part_rows] = part_scores[name]
        ok[part_rows] = part_readable
    settings = {"kind": plan.spec.kind, "clip": str(plan.clip), "prompt": plan.prompt, **plan.spec.scoring(),
                "clip_image_size": size, "images_sha256": images_digest(paths)}
    return PseudoLabelFile(settings, list(splits.classes), prompts, paths, full, ok, np.zeros((n, c), dtype=bool))


def prepare_pseudo_labels(plan: PseudoLabelPlan, splits: ProtocolSplits, dataset: DatasetSplits, cfg: TrainConfig,
                          run_dir: Path, device: torch.device) -> PseudoLabels:
    """Read or compute the run's pseudo-labels, write ``run_dir/pseudo_labels.npz`` and report them."""
    # the training images relative to the dataset's image root (the names observed.npz uses too)
    root = image_root([part for part in (dataset.train, dataset.val, dataset.test) if part is not None])
    paths = relative_paths(splits.train, root)
    classes = list(splits.classes)
    if plan.source == COMPUTE:
        log(f"pseudo-labels: scoring {len(paths):,} training images ({view_count(plan.spec)} view(s) each) with "
            f"CLIP {plan.clip}")
        content = _compute(plan, splits, paths, cfg, device)
        origin = "computed"
    else:
        assert plan.path is not None
        loaded = read(plan.path)
        _check_file(plan, loaded, classes)
        content = loaded.subset(loaded.rows_for(paths, "this run's training images"))
        origin = "reused from the run folder" if plan.source == CACHE else f"read from {plan.path}"
    observed = np.asarray(splits.train_observed)
    positives = select_positives(plan.spec, content.scores, content.readable, observed)
    content = dataclasses.replace(content, positives=positives, settings={
        **content.settings, **plan.spec.selection(), "observed_sha256": matrix_digest(observed)})
    content.extra = statistics(positives, observed, content.readable,
                               splits.train.labels if splits.train_has_full_labels else None)
    if current_world().is_main and plan.source != CACHE:
        write(run_dir / FILE_NAME, content)
    barrier()
    return PseudoLabels(positives, content, origin)


def statistics(positives: np.ndarray, observed: np.ndarray, readable: np.ndarray,
               full_labels: np.ndarray | None) -> dict[str, Any]:
    """Counts of the new pseudo-positives, the share of observed ones CLIP picks, and their precision."""
    new = positives & (observed != 1)
    n = max(len(positives), 1)
    picked = positives[observed == 1]
    stats: dict[str, Any] = {
        "pseudo_positives": int(new.sum()), "per_image": float(new.sum() / n),
        "images_without": int((new.sum(1) == 0).sum()), "unreadable": int((~readable).sum()),
        "observed_positives_picked": float(picked.mean()) if picked.size else None}
    if full_labels is not None:
        stats["precision"] = float((np.asarray(full_labels)[new] == 1).mean()) if new.any() else None
    return stats


def describe(labels: PseudoLabels) -> list[str]:
    """The report lines of a run's pseudo-labels."""
    s, stats = labels.file.settings, labels.file.extra
    lines = [f"pseudo-labels ({s['kind']}, {labels.origin}: CLIP {s['clip']}, prompt {s['prompt']!r}): "
             f"{stats['pseudo_positives']:,} pseudo-positives beyond the observed labels, {stats['per_image']:.2f} "
             f"per image ({stats['images_without']:,} images without any)"
             + (f", {stats['unreadable']:,} unreadable images without scores" if stats["unreadable"] else "")]
    if stats["observed_positives_picked"] is not None:
        lines.append(f"pseudo-labels: CLIP also picks {stats['observed_positives_picked']:.0%} of the observed "
                     "positives")
    if "precision" in stats:
        value = "n/a (none)" if stats["precision"] is None else f"{stats['precision']:.3f}"
        lines.append(f"pseudo-labels: precision {value} against the full training labels (reported only; the "
                     "method never sees them)")
    return lines
