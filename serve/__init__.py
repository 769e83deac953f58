"""Serving trained models: batch tagging (``python -m serve tag``: the pipeline in :mod:`serve.tag`, engines in
:mod:`serve.engines`, sources in :mod:`serve.sources`, the journal in :mod:`serve.journal`, outputs in
:mod:`serve.outputs`) and the web demo (``python -m serve demo``), over pluggable runtimes.

Runtimes live in :mod:`models.runtimes` (ONNX Runtime for ``.onnx``, PyTorch for ``.pt``); optional
dependencies such as onnxruntime are imported only when a model of that kind is loaded. This module only
holds the CLI defaults, so ``python -m serve --help`` and usage errors answer without loading torch.

Layering: ``serve`` may import ``train`` and ``models``; ``export`` and ``bench`` may import it.
"""

from pathlib import Path

DEFAULT_BATCH_SIZE = 16
DEFAULT_THRESHOLD = 0.5
DEFAULT_OUTPUT = Path("tags.jsonl")

#: The decompression-bomb limit of every entry point (``serve tag``, ``serve demo``, :class:`serve.tag.TagJob`,
#: :func:`serve.tag.tag_folder`, :class:`serve.predictor.Predictor`): the largest image accepted, width x height,
#: checked from the file header before decoding (Pillow's own limit). Turning it off is explicit: ``max_pixels=None``
#: in Python, ``--max-pixels 0`` on the command line (Pillow still refuses images over twice its limit).
DEFAULT_MAX_PIXELS = 89_478_485

#: ``--device`` help shared by ``tag`` and ``demo``.
DEVICE_HELP = ("cpu, cuda, cuda:N, tensorrt or tensorrt:N (default: PyTorch uses CUDA when available, ONNX Runtime "
               "uses the CPU); a GPU that cannot be used is an error, never a silent CPU fallback")

#: Exit status of ``python -m serve``: all done; some images (or the model) failed; usage error.
EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2
