"""The tagging pipeline of ``python -m serve tag`` and of Python callers: plan -> scoring (by an engine) -> journal ->
outputs, put together in :mod:`~serve.tagging.run` (docs/tagging-at-scale.md). Names load lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.registry import lazy_exports

_EXPORTS = {
    "TagJob": "serve.tagging.job",
    "TagPlan": "serve.tagging.plan",
    "plan_tagging": "serve.tagging.plan",
    "TagSummary": "serve.tagging.run",
    "run_plan": "serve.tagging.run",
    "tag": "serve.tagging.run",
    "tag_folder": "serve.tagging.run"}

if TYPE_CHECKING:
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan, plan_tagging
    from serve.tagging.run import TagSummary, run_plan, tag, tag_folder

__all__ = ["TagJob", "TagPlan", "TagSummary", "plan_tagging", "run_plan", "tag", "tag_folder"]


__getattr__ = lazy_exports("serve.tagging", _EXPORTS)
