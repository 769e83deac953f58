"""The tagging pipeline: one for every engine, for ``python -m serve tag`` and for Python callers.

1. **Plan** (:func:`plan_tagging`, once, before any model is loaded): the items of the SOURCE
   (:mod:`serve.sources`), which are already done under the ``existing`` policy (sidecars, the run file, the
   journal of an interrupted run), the model's metadata and thresholds, read from the model file without
   loading it (:func:`models.runtimes.read_model_meta`: no torch, no onnxruntime), and the sidecar paths.
2. **Score**: an engine (:mod:`serve.engines`: ``local``, ``ray``) turns the plan's to-do items into batches of
   scores or errors; that is all an engine does.
3. **Journal** (:mod:`serve.journal`): each batch's records are appended to ``<output>.partial`` and flushed as
   it arrives, so a run killed at any point (SIGKILL included) resumes with ``existing="skip"`` and re-tags at
   most the batches that were in flight.
4. **Outputs** (:mod:`serve.outputs`): a selection function turns scores into tags (a selection mode,
   :mod:`serve.tag_selection`, then the caption rules, :mod:`serve.caption_rules`), writers take the records:
   sidecars and tag-folder links as each batch finishes; the run file (sorted by path, from the journal) with
   its manifest, and the errors file at the end, atomically. The journal is then removed.
5. **Summary** (:mod:`serve.run_summary`): images per tag, tags per image and the classes never predicted,
   counted from the run file and written as reports beside it.

>>> summary = tag(TagJob("photos", "model.onnx", Path("tags.jsonl")))      # doctest: +SKIP
>>> summary = tag_folder("photos", "model.onnx", "tags.csv", threshold=0.3)  # doctest: +SKIP
>>> rules = make_rules(first=["sks"], exclude_re=["^rating_"], spaces=True)   # doctest: +SKIP
>>> summary = tag(TagJob("photos", "model.onnx", selection="mcut", max_tags=20, rules=rules,
...                      sidecar=SidecarSpec(formats=("txt", "json"))))        # doctest: +SKIP

Memory: the plan holds the keys (paths) of the source, never the records or the images; decoded images are
bounded by the engine's batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from models.checkpoint import ModelMeta
from models.files.digest import file_sha256
from models.runtimes import parse_device, read_model_meta
from serve import DEFAULT_BATCH_SIZE, DEFAULT_MAX_PIXELS, DEFAULT_OUTPUT, tag_selection
from serve.caption_rules import CaptionRules
from serve.engines import DEFAULT_ENGINE, engine_names, get_engine
from serve.journal import Journal, JournalContents, JournalHeader, journal_path, read_journal
from serve.outputs import ErrorsWriter, OutputStage, RunFileWriter, Selection, SidecarWriter, TagFolderWriter
from serve.records import DEFAULT_SEPARATOR, OutputConflictError, default_errors_path, iter_run_file
from serve.run_manifest import read_manifest
from serve.run_summary import RunSummary, summarize_run_file, write_summary_reports
from serve.sidecars import SidecarSpec, sidecar_paths
from serve.sources import Item, Partition, Source
from serve.tag_folders import TagFolders
from serve.thresholds import resolve_thresholds, thresholds_source

if TYPE_CHECKING:
    from models.runtimes import Runtime
    from serve.predictor import Predictor

#: What to do with images whose outputs exist already (see :class:`TagJob`).
EXISTING_POLICIES = ("skip", "overwrite", "append")
DEFAULT_EXISTING = "skip"
#: Records imported from an earlier run file into the journal per write.
_IMPORT_CHUNK = 1024


@dataclass
class TagJob:
    """A tagging run: what to read, the model, where to write and how to run; the one set of options of the
    command line and of Python callers. Invalid values raise ``ValueError`` naming the option.

    ``source``: a folder, a list file, ``.tar`` shards or a :class:`~serve.sources.Source`; ``model``: a model
    file, or an already loaded :class:`~serve.predictor.Predictor` (or runtime), which the local engine uses
    as is. ``selection``: ``"thresholds"`` (the per-class thresholds: ``threshold``, ``per_class``, else the
    model's), ``"mcut"``, ``"top-k:K"`` or a :class:`serve.tag_selection.Selection`; ``max_tags`` caps and
    ``min_score`` floors it (``top_k``: the deprecated name of ``max_tags``). ``rules``: the caption rules
    (:class:`~serve.caption_rules.CaptionRules`) of the tags written. ``sidecar``: sidecar files (formats,
    names, tag separator); ``tag_separator``: the CSV run file's tag separator without sidecars; ``sort_into``:
    tag folders (:class:`~serve.tag_folders.TagFolders`; folder sources). ``summary``:
    count the run file's tags at the end and write the reports beside it. ``existing``: ``skip`` resumes
    (images whose sidecars exist, with ``sidecar``, or whose record is in the run file or the journal, are not
    tagged again and their records are kept), ``overwrite`` redoes everything, ``append`` redoes everything
    and adds new tags to existing sidecars. ``max_pixels``: the
    decompression-bomb limit (on by default; ``None`` turns it off). ``workers``: decode threads (local
    engine) or model actors (ray). ``address``, ``gpus_per_worker``, ``cpus_per_worker``: the ray engine's
    cluster, GPUs and CPUs (decode threads and model threads) of each model actor.
    """

    source: str | Path | Source
    model: str | Path | Predictor | Runtime | None = None
    output: Path = DEFAULT_OUTPUT
    engine: str = DEFAULT_ENGINE
    backend: str | None = None
    device: str | None = None
    errors: Path | None = None
    threshold: float | None = None
    per_class: Mapping[str, float] | None = None
    selection: str | tag_selection.Selection = tag_selection.DEFAULT_MODE
    max_tags: int | None = None
    min_score: float | None = None
    top_k: int | None = None  # deprecated: max_tags
    rules: CaptionRules = field(default_factory=CaptionRules)
    sidecar: SidecarSpec | None = None
    tag_separator: str = DEFAULT_SEPARATOR  # of a CSV run file's tags column without sidecars
    sort_into: TagFolders | None = None
    summary: bool = True
    existing: str = DEFAULT_EXISTING
    batch_size: int = DEFAULT_BATCH_SIZE
    workers: int | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    progress: bool = True
    partition: Partition | None = None
    address: str | None = None
    gpus_per_worker: float = 0.0
    cpus_per_worker: int | None = None
    predictor: Predictor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.output = Path(self.output)
        self.errors = Path(self.errors) if self.errors is not None else None
        if self.existing not in EXISTING_POLICIES:
            choices = ", ".join(EXISTING_POLICIES)
            raise ValueError(f"existing (--existing) must be one of {choices}, got {self.existing!r}")
        if self.engine not in engine_names():
            raise ValueError(f"unknown engine {self.engine!r} (--engine); available: {', '.join(engine_names())}")
        for name in ("batch_size", "max_tags", "top_k", "workers", "max_pixels", "cpus_per_worker"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {value}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker (--gpus-per-worker) must be >= 0, got {self.gpus_per_worker}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold (--threshold) must be in [0, 1], got {self.threshold}")
        self.selection = self._selection()
        parse_device(self.device)  # ModelSpecError for unknown devices
        if self.model is not None and not isinstance(self.model, (str, Path)):
            self.predictor = as_predictor(self.model)
            self.model = self.predictor.path
        if self.model is None and self.predictor is None:
            raise ValueError("a model is needed: a model file or a loaded Predictor")
        if self.model is not None:
            self.model = Path(self.model)

    def _selection(self) -> tag_selection.Selection:
        """The selection mode with ``max_tags`` / ``min_score`` (and the deprecated ``top_k``) applied."""
        if self.top_k is not None:
            warnings.warn("top_k (--top-k) is deprecated: use max_tags (--max-tags)", DeprecationWarning, 4)
            if self.max_tags is not None and self.max_tags != self.top_k:
                raise ValueError("top_k (--top-k) is the old name of max_tags (--max-tags): give one of them")
            self.max_tags, self.top_k = self.top_k, None
        if self.min_score is not None and not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"min_score (--min-score) must be in [0, 1], got {self.min_score}")
        try:
            if isinstance(self.selection, str):
                return tag_selection.make_selection(self.selection, self.max_tags, self.min_score)
            limits: dict[str, Any] = {"max_tags": self.max_tags} if self.max_tags is not None else {}
            if self.min_score is not None:
                limits["min_score"] = float(self.min_score)
            return dataclasses.replace(self.selection, **limits)
        except ValueError as exc:
            raise ValueError(f"selection (--select): {exc}") from None

    @property
    def mode(self) -> tag_selection.Selection:
        """The selection mode (``selection`` as given, made a :class:`serve.tag_selection.Selection`)."""
        assert isinstance(self.selection, tag_selection.Selection)
        return self.selection

    @property
    def errors_file(self) -> Path:
        """Where failures are listed: ``errors``, else :func:`serve.records.default_errors_path` of the output."""
        return self.errors if self.errors is not None else default_errors_path(self.output)

    @property
    def separator(self) -> str:
        """The tag separator of the run file's CSV tags column and of the sidecars."""
        return self.sidecar.separator if self.sidecar is not None else self.tag_separator


def as_predictor(model: Predictor | Runtime) -> Predictor:
    """A :class:`~serve.predictor.Predictor` from a loaded one or a runtime (``ValueError`` unless it outputs
    logits)."""
    from serve.predictor import Predictor

    if isinstance(model, Predictor):
        return model
    if model.meta.output != "logits":
        raise ValueError(f"model output is {model.meta.output!r}; the tagger expects logits")
    return Predictor(model, path=getattr(model, "path", None))


# --------------------------------------------------------------------------------------------------------
# 1. The plan


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
    select: Selection | None = None  # how tags are chosen and written (None: a dry run)
    header: JournalHeader | None = None  # the model, as the journal records it, and the tag options
    scan_errors: list[tuple[str, str]] = field(default_factory=list)
    reselected: bool = False  # earlier records were tagged with other options: their tags are chosen again

    @property
    def ignored(self) -> int:
        """Files without an image extension (folder sources)."""
        return self.source.ignored


def model_header(job: TagJob, meta: ModelMeta, tagging: dict[str, Any] | None = None) -> JournalHeader:
    """The journal header of ``job``'s model: its file's SHA-256 (of its metadata for a model given in memory),
    with the ``tagging`` options."""
    if job.model is not None and Path(job.model).is_file():
        return JournalHeader(str(job.model), file_sha256(job.model), tuple(meta.classes), tagging)
    digest = hashlib.sha256(meta.to_json().encode("utf-8")).hexdigest()
    return JournalHeader("<model in memory>", digest, tuple(meta.classes), tagging)


def plan_tagging(job: TagJob, read_model: bool = True) -> TagPlan:
    """Plan ``job``: list the source, decide what is done, and (``read_model``) read the model's metadata,
    resolve its thresholds and check the caption rules against its classes. Reads, never writes. Raises
    ``FileNotFoundError`` (no source), ``ValueError`` (bad option, unknown class in ``per_class``,
    :class:`~serve.caption_rules.CaptionRuleError` for a rule naming an unknown class,
    :class:`~serve.records.OutputConflictError` for a run file or journal of another model, or for sidecars
    kept that were written with other tag options) and :class:`~models.runtimes.ModelLoadError` (model metadata
    unreadable).

    Without ``read_model`` (a dry run) the model file is not opened and a journal is not checked against it.
    """
    src = job.source if isinstance(job.source, Source) else Source.open(job.source, job.partition)
    if job.sidecar is not None and src.kind != "folder":
        raise ValueError(f"sidecars need a folder SOURCE; {src.spec} is a {src.kind} source")
    if job.sort_into is not None and src.kind != "folder":
        raise ValueError(f"--sort-into needs a folder SOURCE (it links the image files); {src.spec} is a "
                         f"{src.kind} source")
    if job.sort_into is not None and src.folder is not None and \
            job.sort_into.root.resolve().is_relative_to(src.folder.resolve()):
        raise ValueError(f"--sort-into {job.sort_into.root} is inside SOURCE {src.spec}: its images would be tagged "
                         "again by the next run; choose a folder outside it")
    plan = TagPlan(job, src, [], None, set(), set(), set(), {}, JournalContents(None, {}, {}))
    if read_model:
        plan.meta = job.predictor.meta if job.predictor is not None else read_model_meta(job.model, job.backend)
        try:
            plan.thresholds = resolve_thresholds(plan.meta, job.threshold, job.per_class)
        except ValueError as exc:
            raise ValueError(f"thresholds: {exc}") from None
        job.rules.check_classes(plan.meta.classes)
        plan.select = Selection(list(plan.meta.classes), plan.thresholds, job.mode, job.rules)
        plan.header = model_header(job, plan.meta, plan.select.to_dict())
    run_keys: set[str] = set()
    run_classes: list[str] | None = None
    if job.existing == "skip":
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
        if job.sidecar is not None:
            found = sidecar_paths(src.folder, paths, job.sidecar)
            plan.sidecars = {p.relative_to(src.folder).as_posix(): s for p, s in found.items()}
        items = [Item(p.relative_to(src.folder).as_posix(), str(p)) for p in paths]

        def is_done(key: str) -> bool:
            if job.existing != "skip":
                return False
            return all(f.is_file() for f in plan.sidecars[key].values()) if job.sidecar else key in recorded

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
            f"{job.output} was written by a model with other classes; use --existing overwrite or another --output"
        )
    if plan.header is not None and job.existing == "skip":
        _check_earlier_options(plan, bool(run_keys))
    plan.scan_errors = list(src.scan_errors)
    return plan


def _check_earlier_options(plan: TagPlan, has_run_file: bool) -> None:
    """Compare this run's tag options with those of the outputs it keeps (the journal's header, the run file's
    manifest). Records kept from a run with other options are re-selected (``plan.reselected``); sidecars kept
    from one are refused, as they would not match the new ones."""
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
        if plan.job.sidecar is not None and plan.done:
            differ = ", ".join(k.replace("_", " ") for k in ("selection", "thresholds", "caption_rules")
                               if options.get(k) != now.get(k))
            raise OutputConflictError(
                f"{where} was written with other tag options ({differ} differ): the sidecars of the "
                f"{len(plan.done)} images already done (--existing skip) would not match this run's; rerun with "
                "the same options to resume, or use --existing overwrite to tag every image again"
            )


def _partition_name(source: Source, key: str) -> str:
    """The name a key is partitioned by: its shard file for shard sources, else the key itself."""
    return key.split("/", 1)[0] if source.kind == "shards" else key


# --------------------------------------------------------------------------------------------------------
# 2-4. Scoring, journal, outputs


@dataclass
class TagSummary:
    """Result of a run (:func:`run_plan`)."""

    source: str
    output: Path
    tagged: int
    failed: list[tuple[str, str]] = field(default_factory=list)  # (key, reason)
    ignored: int = 0  # files without an image extension
    seconds: float = 0.0
    skipped: int = 0  # already done under --existing skip
    errors_file: Path | None = None  # where the failures were listed
    counts: RunSummary | None = None  # the run file's tags counted (with ``summary``)
    reports: list[Path] = field(default_factory=list)  # the summary reports written

    @property
    def ok(self) -> bool:
        """True when every image file was tagged (now or, under ``skip``, before)."""
        return not self.failed and self.tagged + self.skipped > 0

    def line(self) -> str:
        """One-line human summary."""
        rate = self.tagged / self.seconds if self.seconds > 0 else 0.0
        parts = [f"tagged {self.tagged} images in {self.seconds:.1f} s ({rate:.1f} img/s) -> {self.output}"]
        if self.skipped:
            parts.append(f"{self.skipped} already done (skipped; --existing overwrite redoes them)")
        if self.failed:
            parts.append(f"{len(self.failed)} failed (listed in {self.errors_file})")
        if self.ignored:
            parts.append(f"{self.ignored} non-image files ignored")
        return "; ".join(parts)


def default_outputs(plan: TagPlan, journal: Journal) -> OutputStage:
    """The outputs of a run: the plan's :class:`~serve.outputs.Selection` (mode, thresholds, caption rules),
    then sidecars and tag folders (when asked), the run file with its manifest, and the errors file."""
    job = plan.job
    assert plan.meta is not None and plan.select is not None and plan.header is not None
    writers: list[Any] = []
    if job.sidecar is not None:
        writers.append(SidecarWriter(job.sidecar, plan.sidecars, plan.select, append=job.existing == "append"))
    if job.sort_into is not None:
        assert plan.source.folder is not None
        writers.append(TagFolderWriter(job.sort_into, plan.source.folder, plan.select, journal, plan.kept))
    writers.append(RunFileWriter(job.output, journal, plan.select, job.separator, plan.kept, run_manifest(plan)))
    writers.append(ErrorsWriter(job.errors_file, plan.scan_errors))
    return OutputStage(plan.select, writers)


def run_manifest(plan: TagPlan) -> dict[str, Any]:
    """What the run file's manifest records (:mod:`serve.run_manifest`): the model, the tag options (selection,
    thresholds and where they come from, caption rules), the sidecars and tag folders."""
    job = plan.job
    assert plan.meta is not None and plan.select is not None and plan.header is not None
    sidecar = job.sidecar
    return {
        "model": {"path": plan.header.model, "sha256": plan.header.sha256, "classes": list(plan.header.classes)},
        "tagging": plan.select.to_dict(),
        "selection": job.mode.describe(),
        "thresholds_source": thresholds_source(plan.meta, job.threshold, job.per_class),
        "separator": job.separator,
        "sidecars": None if sidecar is None else {
            "formats": list(sidecar.formats), "ext": sidecar.ext, "folder": str(sidecar.folder or "") or None},
        "sort_into": None if job.sort_into is None else {
            "folder": str(job.sort_into.root), "mode": job.sort_into.how, "untagged": job.sort_into.untagged},
    }


def run_plan(
    plan: TagPlan,
    *,
    outputs: Callable[[TagPlan, Journal], OutputStage] = default_outputs,
    warn: Callable[[str], None] | None = None,
    engine: Any = None,
) -> TagSummary:
    """Run a plan made with the model (:func:`plan_tagging`): the job's engine scores the to-do items, each batch
    is journaled then given to the output stage (``outputs(plan, journal)``); when every item is done the
    writers finish and the journal is removed. Failures and start-up lines go to ``warn`` (default: stderr).
    ``engine``: anything with an engine's ``score`` function (default: the module of ``job.engine``).

    An interruption (exception, Ctrl-C, kill) leaves the journal and the files written so far; the run file is
    not rewritten. Raises what the engine raises (``RuntimeError`` for a failed Ray job,
    :class:`~models.runtimes.ModelLoadError` when the model does not load) and ``OSError``.
    """
    job = plan.job
    if plan.meta is None or plan.header is None:
        raise ValueError("this plan was made without the model (a dry run): plan again with read_model=True")
    start = time.perf_counter()
    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    engine = engine or get_engine(job.engine)
    summary = TagSummary(plan.source.spec, job.output, 0, list(plan.scan_errors), plan.ignored, skipped=len(plan.done))
    summary.errors_file = job.errors_file
    for key, reason in plan.scan_errors:
        report(f"skipped {key}: {reason}")
    journal = Journal(journal_path(job.output), plan.header, plan.journal if job.existing == "skip" else None)
    completed = False
    try:
        _import_run_file(plan, journal)
        stage = outputs(plan, journal)
        with tqdm(total=plan.total, unit="img", file=sys.stderr, disable=not job.progress, dynamic_ncols=True) as bar:
            for results in engine.score(job, plan, report):
                records, failed = stage.records(results)
                journal.write(records, failed)
                stage.write(records, failed)
                for key, reason in failed:
                    report(f"skipped {key}: {reason}")
                summary.tagged += len(records)
                summary.failed += failed
                bar.update(len(results))
        if summary.tagged or summary.failed or summary.skipped:
            stage.finish()
        completed = True
    finally:
        journal.close(remove=completed)
    if job.summary and job.output.is_file():
        select = stage.select if isinstance(stage.select, Selection) else None
        summary.counts = summarize_run_file(job.output, job.separator, select.chosen if select else None,
                                            select.rules.labels if select else None)
        summary.reports = write_summary_reports(summary.counts, job.output)
    summary.seconds = time.perf_counter() - start
    return summary


def _import_run_file(plan: TagPlan, journal: Journal) -> None:
    """Copy the kept records found only in the existing run file into the journal, which then holds every
    record the new run file needs."""
    if not plan.imports:
        return
    chunk: list[dict[str, Any]] = []
    for rec in iter_run_file(plan.job.output, plan.job.separator):
        if rec["path"] in plan.imports and rec["path"] not in journal.offsets:
            chunk.append(rec)
            if len(chunk) == _IMPORT_CHUNK:
                journal.write(chunk)
                chunk = []
    journal.write(chunk)


def tag(job: TagJob, *, warn: Callable[[str], None] | None = None) -> TagSummary:
    """Plan and run ``job`` (:func:`plan_tagging`, :func:`run_plan`)."""
    return run_plan(plan_tagging(job), warn=warn)


def tag_folder(
    folder: str | Path | Source,
    model: Predictor | Runtime | str | Path,
    output: str | Path = DEFAULT_OUTPUT,
    *,
    warn: Callable[[str], None] | None = None,
    **options: Any,
) -> TagSummary:
    """Tag every image of ``folder`` (a folder, list file, shard pattern or :class:`~serve.sources.Source`) with
    ``model`` (a model file, a loaded Predictor or runtime) into the run file ``output``: :func:`tag` of
    ``TagJob(folder, model, output, **options)`` (see :class:`TagJob` for the options and their defaults).

    Raises ``FileNotFoundError`` (no source), ``ValueError`` (bad option, model output not logits,
    :class:`~serve.records.OutputConflictError`) and whatever the engine raises. Without image files nothing
    is written.
    """
    return tag(TagJob(folder, model, Path(output), **options), warn=warn)
