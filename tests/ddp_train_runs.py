"""``python -m torch.distributed.run ... tests/ddp_train_runs.py CODES.json -- ARGS -- ARGS ...``: several
``python -m train ARGS`` runs, one after the other, in one torchrun group (one start-up for all). A segment that
begins with ``interrupt`` is killed (KeyboardInterrupt on every rank) right after its first ``last.pt`` save, as an
interrupted multi-process run leaves its folder. Rank 0 writes every run's exit code to CODES.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from interrupt import interrupt_after_saves  # tests/ is this script's sys.path[0]

import train.distributed
from train.__main__ import main


def segments(argv: list[str]) -> list[list[str]]:
    """The argument lists between ``--`` separators."""
    runs: list[list[str]] = []
    for arg in argv:
        if arg == "--":
            runs.append([])
        else:
            runs[-1].append(arg)
    return runs


if __name__ == "__main__":
    codes = []
    leave = train.distributed.shutdown
    with pytest.MonkeyPatch.context() as keep_group:
        keep_group.setattr(train.distributed, "shutdown", lambda: None)  # one process group for every run
        for args in segments(sys.argv[2:]):
            with pytest.MonkeyPatch.context() as patch:
                if args[:1] == ["interrupt"]:
                    interrupt_after_saves(patch)
                    args = args[1:]
                codes.append(main(args))
    if train.distributed.current_world().rank == 0:
        Path(sys.argv[1]).write_text(json.dumps(codes))
    leave()
