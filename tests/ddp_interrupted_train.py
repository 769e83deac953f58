"""``python -m torch.distributed.run ... tests/ddp_interrupted_train.py ARGS``: ``python -m train ARGS`` on every
rank, killed (KeyboardInterrupt on every rank) right after the first ``last.pt`` save, as an interrupted
multi-process run leaves its folder."""

from __future__ import annotations

import sys

import pytest
from interrupt import interrupt_after_saves  # tests/ is this script's sys.path[0]

from train.__main__ import main

if __name__ == "__main__":
    with pytest.MonkeyPatch.context() as patch:
        interrupt_after_saves(patch)
        sys.exit(main(sys.argv[1:]))
