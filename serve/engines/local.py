"""The ``local`` engine: this machine; ``--workers`` threads decode images ahead of one model
(:func:`serve.scoring.score_items`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import TYPE_CHECKING

from serve.engines import Result
from serve.scoring import default_workers, score_items

if TYPE_CHECKING:
    from serve.tag import TagJob, TagPlan


def score(job: TagJob, plan: TagPlan, report: Callable[[str], None]) -> Iterator[list[Result]]:
    """Score ``plan.todo`` in batches of ``job.batch_size`` with ``job.predictor``, else ``job.model`` loaded on
    ``job.device`` (only when there is something to tag)."""
    from serve.predictor import ImagePreprocessor, Predictor

    items = iter(plan.todo)
    first = next(items, None)
    if first is None:
        return
    predictor = job.predictor or Predictor.load(job.model, job.backend, job.device, max_pixels=job.max_pixels)
    workers = job.workers or default_workers()
    report(f"engine local: {predictor.device_description}, {workers} decode threads")
    preprocess = ImagePreprocessor(predictor.transform, job.max_pixels)
    yield from score_items(chain([first], items), predictor.scores_from_inputs, preprocess, job.batch_size, workers)
