"""The ``local`` engine: ``--workers`` threads decode images ahead of one model on this machine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import TYPE_CHECKING

from serve.outputs.records import Result
from serve.tagging.engines.base import ENGINES, Engine
from serve.tagging.scoring import default_workers, score_items

if TYPE_CHECKING:
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan


def score(job: TagJob, plan: TagPlan, report: Callable[[str], None]) -> Iterator[list[Result]]:
    """Score ``plan.todo`` with ``job.predictor``, else ``job.model`` loaded only if there is work."""
    from serve.images import ImagePreprocessor
    from serve.predictor import Predictor

    items = iter(plan.todo)
    first = next(items, None)
    if first is None:
        return
    run = job.run
    predictor = job.predictor or Predictor.load(job.model, run.backend, run.device, max_pixels=run.max_pixels)
    workers = job.run.workers or default_workers()
    report(f"engine local: {predictor.device_description}, {workers} decode threads")
    preprocess = ImagePreprocessor(predictor.transform, job.run.max_pixels)
    yield from score_items(chain([first], items), predictor.scores_from_inputs, preprocess, job.run.batch_size, workers)


@ENGINES.register
class LocalEngine(Engine):
    """The ``local`` engine (module docstring)."""

    name = "local"
    description = "this machine: threads decode images ahead of one model (default)"
    score = staticmethod(score)
