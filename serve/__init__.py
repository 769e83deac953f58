"""Serving trained models (``python -m serve``): ``commands/``, ``tagging/``, ``outputs/``, ``demo/``, ``api/``,
:mod:`serve.predictor`, :mod:`serve.images`, :mod:`serve.model_files`. Public API (``__all__``, lazy: ``import serve``
loads neither torch nor onnxruntime): the CLI defaults below, :class:`Predictor`, the tagging pipeline,
:func:`get_engine`, :class:`TaggingService` and :class:`ApiSettings`; ``serve`` imports ``models`` only."""

from __future__ import annotations

from pathlib import Path

from models.registry import lazy_exports

DEFAULT_BATCH_SIZE = 16
DEFAULT_THRESHOLD = 0.5
DEFAULT_OUTPUT = Path("tags.jsonl")

#: The decompression-bomb limit of every entry point (``serve tag``, ``serve demo``,
#: :class:`serve.tagging.job.TagJob`, :func:`serve.tagging.run.tag_folder`, :class:`serve.predictor.Predictor`): the
#: largest image accepted, width x height, checked from the file header before decoding (Pillow's own limit).
#: Turning it off is explicit: ``max_pixels=None`` in Python, ``--max-pixels 0`` on the command line (Pillow still
#: refuses images over twice its limit).
DEFAULT_MAX_PIXELS = 89_478_485

#: ``--backend`` help shared by ``tag``, ``demo`` and ``api``: the rows of :data:`models.runtimes.RUNTIMES` (kept here
#: as text so that ``--help`` imports no runtime; a test checks they agree).
BACKEND_NAMES = "onnxruntime, torch, tensorrt, openvino or openvino-bf16"
#: ``--backend`` help's default, shared likewise.
BACKEND_HELP = (f"runtime to use: {BACKEND_NAMES} (default: from the model file's suffix; an .onnx file on the CPU "
                "runs with the faster runtime its export checked on this CPU model, if any)")

#: ``--device`` help shared by ``tag`` and ``demo``.
DEVICE_HELP = ("cpu, cuda, cuda:N, tensorrt or tensorrt:N (default: PyTorch uses CUDA when available, ONNX Runtime "
               "uses the CPU); a GPU that cannot be used is an error, never a silent CPU fallback")

_LAZY = {
    "Predictor": "serve.predictor",
    "TagJob": "serve.tagging.job",
    "TagPlan": "serve.tagging.plan",
    "plan_tagging": "serve.tagging.plan",
    "TagSummary": "serve.tagging.run",
    "run_plan": "serve.tagging.run",
    "tag": "serve.tagging.run",
    "tag_folder": "serve.tagging.run",
    "get_engine": "serve.tagging.engines",
    "ApiSettings": "serve.api.service",
    "TaggingService": "serve.api.service"}

__getattr__ = lazy_exports("serve", _LAZY)


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_OUTPUT",
    "DEFAULT_THRESHOLD",
    "DEVICE_HELP",
    "ApiSettings",
    "Predictor",
    "TagJob",
    "TagPlan",
    "TagSummary",
    "TaggingService",
    "get_engine",
    "plan_tagging",
    "run_plan",
    "tag",
    "tag_folder"]
