"""Step 1 of the tagging pipeline, :func:`plan_tagging`: what to tag, the model's metadata, sidecar paths."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.checkpoint import ModelMeta
from models.files.digest import file_sha256
from models.runtimes import read_model_meta
from serve.outputs.records import OutputConflictError, iter_run_file
from serve.outputs.run_manifest import read_manifest
from serve.outputs.sidecars import sidecar_paths
from serve.outputs.stage import TagSelector
from serve.outputs.thresholds import resolve_thresholds
from serve.tagging.job import TagJob
from serve.tagging.journal import JournalContents, JournalHeader, journal_path, read_journal
from serve.tagging.sources import Item, Source


@dataclass
class TagPlan:
    """What a run will do, decided once before any model is loaded (:func:`plan_tagging`)."""

    job: TagJob
    source: Source
    todo: Iterable[Item]  # the items to tag (a list, or streaming for list files and shards)
    total: int | None  # len(todo) when known
    done: set[str]  # keys skipped as already done
    kept: set[str]  # keys of earlier runs' records that the run file keeps (in the journal or the run file)
    imports: set[str]  # kept keys whose record is in the run file only (copied into the journal at the start)
    sidecars: dict[str, dict[str, Path]]  # key -> sidecar file per format ({} without sidecars)
    journal: JournalContents  # of an interrupted run (empty unless existing == "skip")
    meta: ModelMeta | None = None  # None: planned without the model (a dry run)
    thresholds: np.ndarray | None = None
    select: TagSelector | None = None  # how tags are chosen and written (None: a dry run)
    header: JournalHeader | None = None  # the model, as the journal records it, and the tag options
    scan_errors: list[tuple[str, str]] = field(default_factory=list)
    reselected: bool = False  # earlier records were tagged with other options: their tags are chosen again


def model_header(job: TagJob, meta: ModelMeta, tagging: dict[str, Any] | None = None) -> JournalHeader:
    """The journal header of ``job``'s model: its file's SHA-256, with the ``tagging`` options."""
    if job.model is not None and Path(job.model).is_file():
        return JournalHeader(str(job.model), file_sha256(job.model), tuple(meta.classes), tagging)
    digest = hashlib.sha256(meta.to_json().encode("utf-8")).hexdigest()
    return JournalHeader("<model in memory>", digest, tuple(meta.classes), tagging)


def plan_tagging(job: TagJob, read_model: bool = True) -> TagPlan:
    """Plan ``job``; reads, never writes. Raises ``FileNotFoundError`` (no source), ``ValueError`` (a bad option or
    rule; :class:`~serve.outputs.records.OutputConflictError`) or :class:`~models.runtimes.ModelLoadError`."""
    src = job.source if isinstance(job.source, Source) else Source.open(job.source, job.run.partition)
    if job.outputs.sidecar is not None and src.kind != "folder":
        raise ValueError(f"sidecars need a folder SOURCE; {src.spec} is a {src.kind} source")
    if job.outputs.sort_into is not None and src.kind != "folder":
        raise ValueError(f"--sort-into needs a folder SOURCE (it links the image files); {src.spec} is a "
                         f"{src.kind} source")
    if job.outputs.sort_into is not None and src.folder is not None and \
            job.outputs.sort_into.root.resolve().is_relative_to(src.folder.resolve()):
        raise ValueError(f"--sort-into {job.outputs.sort_into.root} is inside SOURCE {src.spec}: its images would be "
                         "tagged again by the next run; choose a folder outside it")
    plan = TagPlan(job, src, [], None, set(), set(), set(), {}, JournalContents(None, {}, {}))
    if read_model:
        plan.meta = job.predictor.meta if job.predictor is not None else read_model_meta(job.model, job.run.backend)
        try:
            plan.thresholds = resolve_thresholds(plan.meta, job.choice.threshold, job.choice.per_class)
        except ValueError as exc:
            raise ValueError(f"thresholds: {exc}") from None
        job.choice.rules.check_classes(plan.meta.classes)
        plan.select = TagSelector(list(plan.meta.classes), plan.thresholds, job.mode, job.choice.rules)
        plan.header = model_header(job, plan.meta, plan.select.to_dict())
    run_keys: set[str] = set()
    run_classes: list[str] | None = None
    if job.outputs.existing == "skip":
        plan.journal = read_journal(journal_path(job.output))
        if not plan.journal.offsets and not plan.journal.errors:
            plan.journal = JournalContents(None, {}, {})  # no result in it (a run that failed at once): start afresh
        elif plan.header is not None and plan.journal.header is not None:
            plan.header.refuse_other(plan.journal.header, journal_path(job.output))
        for rec in iter_run_file(job.output, job.separator):
            run_keys.add(rec["path"])
            run_classes = run_classes or list(rec["scores"])
    recorded = run_keys | set(plan.journal.offsets)
    if src.kind == "folder":
        paths = src.folder_images()
        if job.outputs.sidecar is not None:
            found = sidecar_paths(src.folder, paths, job.outputs.sidecar)
            plan.sidecars = {p.relative_to(src.folder).as_posix(): s for p, s in found.items()}
        items = [Item(p.relative_to(src.folder).as_posix(), str(p)) for p in paths]

        def is_done(key: str) -> bool:
            if job.outputs.existing != "skip":
                return False
            return all(f.is_file() for f in plan.sidecars[key].values()) if job.outputs.sidecar else key in recorded

        plan.done = {i.key for i in items if is_done(i.key)}
        plan.todo = [i for i in items if i.key not in plan.done]
        plan.total = len(plan.todo)
    else:
        plan.done = {k for k in recorded if src.partition.keeps(_partition_name(src, k))}
        plan.todo = (i for i in src.items() if i.key not in plan.done)
    plan.kept = plan.done & recorded
    plan.imports = plan.kept - set(plan.journal.offsets)
    if plan.meta is not None and run_classes is not None and run_classes != list(plan.meta.classes) and plan.imports:
        raise OutputConflictError(
            f"{job.output} was written by a model with other classes; use --existing overwrite or another --output")
    if plan.header is not None and job.outputs.existing == "skip":
        _check_earlier_options(plan, bool(run_keys))
    plan.scan_errors = list(src.scan_errors)
    return plan


def _check_earlier_options(plan: TagPlan, has_run_file: bool) -> None:
    """Compare this run's tag options with the kept outputs': kept records are re-selected, kept sidecars refused."""
    assert plan.header is not None
    earlier: list[tuple[str, dict[str, Any] | None]] = []
    if plan.journal.header is not None:
        earlier.append((f"the journal {journal_path(plan.job.output)}", plan.journal.header.tagging))
    manifest = read_manifest(plan.job.output) if has_run_file else None
    if manifest is not None:
        earlier.append((str(plan.job.output), manifest.get("tagging")))
    now = plan.header.tagging or {}
    for where, options in earlier:
        if options is None or options == now:
            continue
        plan.reselected = plan.reselected or bool(plan.kept)
        if plan.job.outputs.sidecar is not None and plan.done:
            differ = ", ".join(k.replace("_", " ") for k in ("selection", "thresholds", "caption_rules")
                               if options.get(k) != now.get(k))
            raise OutputConflictError(
                f"{where} was written with other tag options ({differ} differ): the sidecars of the "
                f"{len(plan.done)} images already done (--existing skip) would not match this run's; rerun with "
                "the same options to resume, or use --existing overwrite to tag every image again")


def _partition_name(source: Source, key: str) -> str:
    """The name a key is partitioned by: its shard file for shard sources, else the key itself."""
    return key.split("/", 1)[0] if source.kind == "shards" else key
