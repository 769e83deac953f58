"""Status lines of a run: printed once (rank 0 under torchrun), without breaking an active progress bar."""

from __future__ import annotations

import sys

from tqdm import tqdm

from train.distributed import current_world


def log(message: str) -> None:
    """Print a status line (through tqdm so it does not break an active progress bar); rank 0 only."""
    if current_world().is_main:
        tqdm.write(message, file=sys.stderr)
