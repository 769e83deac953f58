"""The ``local`` engine: this machine, decode threads working ahead of one model (:func:`serve.tag.tag_folder`)."""

from __future__ import annotations

from collections.abc import Callable

from serve.engines import TagJob
from serve.predictor import Predictor
from serve.tag import TagSummary, tag_folder

#: The :class:`TagJob` fields :func:`tag_folder` takes as keyword options, under the same names.
OPTIONS = (
    "threshold", "per_class", "top_k", "batch_size", "workers", "progress", "existing", "sidecar", "errors",
    "max_pixels", "partition",
)  # fmt: skip


def run(job: TagJob, predictor: Predictor, warn: Callable[[str], None] | None = None) -> TagSummary:
    """Tag ``job`` on this machine with ``predictor``; the run file is sorted by path."""
    return tag_folder(job.source, predictor, job.output, warn=warn, **{name: getattr(job, name) for name in OPTIONS})
