"""The tagging pipeline of ``python -m serve tag`` and of Python callers: plan -> score -> journal -> outputs.

- :mod:`~serve.tagging.job`: :class:`TagJob`, a run's options in small groups;
- :mod:`~serve.tagging.sources`: what a SOURCE holds (a folder, a list file, tar shards);
- :mod:`~serve.tagging.plan`: step 1, :func:`plan_tagging` (what to tag, what is done, the model's metadata);
- :mod:`~serve.tagging.scoring`: step 2, the one scoring loop the engines (:mod:`serve.tagging.engines`) run;
- :mod:`~serve.tagging.journal`: step 3, every result appended as its batch finishes (kill-safe resuming);
- :mod:`~serve.tagging.run`: the pipeline itself, :func:`run_plan`, :func:`tag`, :func:`tag_folder`; step 4, the
  outputs, lives in :mod:`serve.outputs`.

>>> from serve.tagging import TagJob, tag                                  # doctest: +SKIP
>>> tag(TagJob("photos", "model.onnx", "tags.jsonl", selection="mcut"))     # doctest: +SKIP

Importing the package is light: the names below load their module on first use (PEP 562).
"""

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
    "tag_folder": "serve.tagging.run",
}

if TYPE_CHECKING:
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan, plan_tagging
    from serve.tagging.run import TagSummary, run_plan, tag, tag_folder

__all__ = ["TagJob", "TagPlan", "TagSummary", "plan_tagging", "run_plan", "tag", "tag_folder"]


__getattr__ = lazy_exports("serve.tagging", _EXPORTS)
