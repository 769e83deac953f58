"""The tagging pipeline, one for every engine: plan -> score -> journal -> outputs -> summary
(docs/tagging-at-scale.md).

>>> summary = tag(TagJob("photos", "model.onnx", Path("tags.jsonl")))      # doctest: +SKIP
>>> summary = tag_folder("photos", "model.onnx", "tags.csv", threshold=0.3)  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from serve import DEFAULT_OUTPUT
from serve.outputs.records import iter_run_file
from serve.outputs.run_summary import RunSummary, summarize_run_file, write_summary_reports
from serve.outputs.stage import ErrorsWriter, OutputStage, RunFileWriter, SidecarWriter, TagFolderWriter, TagSelector
from serve.outputs.thresholds import thresholds_source
from serve.tagging.engines import get_engine
from serve.tagging.job import TagJob
from serve.tagging.journal import Journal, journal_path
from serve.tagging.plan import TagPlan, plan_tagging
from serve.tagging.sources import Source

if TYPE_CHECKING:
    from models.runtimes import Runtime
    from serve.predictor import Predictor

#: Records imported from an earlier run file into the journal per write.
_IMPORT_CHUNK = 1024


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
    """The outputs of a run: the plan's selector, sidecars and tag folders, the run file, the errors file."""
    job = plan.job
    assert plan.meta is not None and plan.select is not None and plan.header is not None
    writers: list[Any] = []
    files = job.outputs
    if files.sidecar is not None:
        writers.append(SidecarWriter(files.sidecar, plan.sidecars, plan.select, append=files.existing == "append"))
    if files.sort_into is not None:
        writers.append(TagFolderWriter(files.sort_into, plan.source.folder, plan.select, journal, plan.kept))
    writers.append(RunFileWriter(job.output, journal, plan.select, job.separator, plan.kept, run_manifest(plan)))
    writers.append(ErrorsWriter(job.errors_file, plan.scan_errors))
    return OutputStage(plan.select, writers)


def run_manifest(plan: TagPlan) -> dict[str, Any]:
    """What the run file's manifest records: the model, the tag options, the sidecars and tag folders."""
    job = plan.job
    assert plan.meta is not None and plan.select is not None and plan.header is not None
    sidecar, sort_into = job.outputs.sidecar, job.outputs.sort_into
    return {
        "model": {"path": plan.header.model, "sha256": plan.header.sha256, "classes": list(plan.header.classes)},
        "tagging": plan.select.to_dict(),
        "selection": job.mode.describe(),
        "thresholds_source": thresholds_source(plan.meta, job.choice.threshold, job.choice.per_class),
        "separator": job.separator,
        "sidecars": None if sidecar is None else {
            "formats": list(sidecar.formats), "ext": sidecar.ext, "folder": str(sidecar.folder or "") or None},
        "sort_into": None if sort_into is None else {
            "folder": str(sort_into.root), "mode": sort_into.how, "untagged": sort_into.untagged}}


def run_plan(plan: TagPlan, *, outputs: Callable[[TagPlan, Journal], OutputStage] = default_outputs,
             warn: Callable[[str], None] | None = None, engine: Any = None) -> TagSummary:
    """Run a plan: ``engine`` scores the to-do items, each batch journaled then given to ``outputs``; the writers finish
    and the journal is removed at the end. Raises what the engine raises and ``OSError``."""
    job = plan.job
    if plan.meta is None or plan.header is None:
        raise ValueError("this plan was made without the model (a dry run): plan again with read_model=True")
    start = time.perf_counter()
    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    engine = engine or get_engine(job.run.engine)
    summary = TagSummary(plan.source.spec, job.output, 0, list(plan.scan_errors), plan.source.ignored,
                         skipped=len(plan.done), errors_file=job.errors_file)
    for key, reason in plan.scan_errors:
        report(f"skipped {key}: {reason}")
    journal = Journal(journal_path(job.output), plan.header, plan.journal if job.outputs.existing == "skip" else None)
    completed = False
    try:
        _import_run_file(plan, journal)
        stage = outputs(plan, journal)
        bar = tqdm(total=plan.total, unit="img", file=sys.stderr, disable=not job.run.progress, dynamic_ncols=True)
        with bar:
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
    if job.outputs.summary and job.output.is_file():
        select = stage.select if isinstance(stage.select, TagSelector) else None
        summary.counts = summarize_run_file(job.output, job.separator, select)
        summary.reports = write_summary_reports(summary.counts, job.output)
    summary.seconds = time.perf_counter() - start
    return summary


def _import_run_file(plan: TagPlan, journal: Journal) -> None:
    """Copy the kept records found only in the existing run file into the journal."""
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


def tag_folder(folder: str | Path | Source, model: Predictor | Runtime | str | Path,
               output: str | Path = DEFAULT_OUTPUT, *, warn: Callable[[str], None] | None = None,
               **options: Any) -> TagSummary:
    """:func:`tag` of ``TagJob(folder, model, output, **options)``; without image files nothing is written."""
    return tag(TagJob(folder, model, Path(output), **options), warn=warn)
