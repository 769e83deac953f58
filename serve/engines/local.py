"""The ``local`` engine: this machine, decode threads working ahead of one model (:func:`serve.tag.tag_folder`)."""

from __future__ import annotations

from collections.abc import Callable

from serve.engines import TagJob
from serve.predictor import Predictor
from serve.tag import TagSummary, tag_folder


def run(job: TagJob, predictor: Predictor, warn: Callable[[str], None] | None = None) -> TagSummary:
    """Tag ``job`` on this machine with ``predictor``; the run file is sorted by path."""
    return tag_folder(
        job.source,
        predictor,
        job.output,
        threshold=job.threshold,
        per_class=job.per_class,
        top_k=job.top_k,
        batch_size=job.batch_size,
        workers=job.workers,
        progress=job.progress,
        warn=warn,
        existing=job.existing,
        sidecar=job.sidecar,
        errors=job.errors,
        max_pixels=job.max_pixels,
        partition=job.partition,
    )
