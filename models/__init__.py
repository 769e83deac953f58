"""The bottom layer, shared by every stage (train, export, serve): the data, the model, its files and how it runs.

- ``data/``: the datasets every stage reads: types, the single-positive protocol, the loaders of the standard
  formats (csv, folder, voc, coco, cub, nus, formatted), the registry of dataset kinds (``data.registry``), label
  regimes and review files, the read side of the built datasets' caches and where they live (``data.cache_folders``);
- ``sources/``: the dataset builders that generate or render images into the cache (the built-in procedural set,
  the Open Clip Art Library, the Tux Paint stamps, npm icon sets); imported by ``train``, ``bench``, the tests and,
  lazily, by the registry's loader of their kind; never by ``export`` or ``serve``;
- ``evaluation/``: metrics, the label-free selection criteria, expected positives;
- the network: ``backbones/`` (torchvision ResNets and timm models, a registry of families), ``network`` (backbone
  + head), ``lgconv``, ``label_embedding``, ``weight_files`` (``--weights FILE``);
- its metadata and files: ``checkpoint`` (:class:`~models.checkpoint.ModelMeta`, the checkpoint format),
  ``onnx_metadata`` (the metadata inside ONNX files), ``logits`` (what the network outputs);
- ``preprocess``: the one image preprocessing used everywhere;
- ``runtimes/``: the registry of inference runtimes (ONNX Runtime, PyTorch, TensorRT) and device names;
- ``files/``: atomic writes, SHA-256 digests, image extensions, the one folder walk, the run folder layout;
- ``registry`` (tables of named rows, registries by decorator), ``command_line`` (errors, exit codes).

Layering: ``models`` imports no other package of this project; every other package may import it.

Importing the package is free: the names below load their module (and torch) on first use, so light modules
(:mod:`models.files`, :class:`~models.checkpoint.ModelMeta`) serve command lines and drivers without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module defining it, imported on first access.
_EXPORTS = {
    "ModelMeta": "models.checkpoint",
    "load_checkpoint": "models.checkpoint",
    "save_checkpoint": "models.checkpoint",
    "MultiLabelNet": "models.network",
    "build_model": "models.network",
    "model_from_meta": "models.network",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
