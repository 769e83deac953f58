"""Training methods, one file each, registered in :data:`METHODS` by their ``@register`` decorator; every module here is
imported, so adding a method is adding its file. Every list of methods is read from this registry."""

from __future__ import annotations

import importlib
import pkgutil

from train.methods.base import (
    METHODS,
    EpochEndContext,
    LabelEstimate,
    LossOutput,
    Method,
    MethodContext,
    make_hparams,
    register,
)

__all__ = ["BASELINE", "METHODS", "EpochEndContext", "LabelEstimate", "LossOutput", "Method", "MethodContext",
           "get_method", "make_hparams", "method_names", "methods_table", "register"]

#: Modules of this folder that are not methods.
NOT_METHODS = ("base",)


def import_method_modules() -> None:
    """Import every method module of this folder (each registers its methods), in name order."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_") and module.name not in NOT_METHODS:
            importlib.import_module(f"{__name__}.{module.name}")


import_method_modules()

BASELINE = METHODS["an"].name  # what comparisons measure every method against (Cole et al.'s AN, an.py)


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; ``ValueError`` listing the known names otherwise."""
    return METHODS[name]


def method_names() -> list[str]:
    """Every registered method in table order: the oracle bounds first, then the rest, each alphabetical."""
    return METHODS.names()


def methods_table() -> str:
    """The markdown table of the registered methods (name, paper, idea), as README.md and docs/methods.md show it."""
    rows = [f"| `{name}` | {METHODS[name].paper or '-'} | {METHODS[name].description} |" for name in method_names()]
    return "\n".join(["| method | paper | idea |", "|---|---|---|", *rows]) + "\n"
