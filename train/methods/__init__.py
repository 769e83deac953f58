"""Training methods, one file each, registered in :data:`METHODS` (name -> class)."""

from train.methods import (  # noqa: F401  (imports register)
    an,
    an_ls,
    bce,
    em,
    epr,
    iun,
    lac,
    large_loss,
    opml,
    pu_mlc,
    role,
    wan,
)
from train.methods.base import (
    METHODS,
    EpochEndContext,
    LossOutput,
    Method,
    MethodContext,
    make_hparams,
    register,
)

__all__ = ["METHODS", "EpochEndContext", "LossOutput", "Method", "MethodContext", "make_hparams", "register"]


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(sorted(METHODS))}") from None
