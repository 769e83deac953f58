"""``python -m torch.distributed.run ... tests/ddp_rank_states.py ARGS``: ``python -m train ARGS`` on every rank;
before the final evaluation each rank writes ``rank{R}.pt`` into the run folder: its model and EMA state dicts
and whether its training step ran inside DistributedDataParallel."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from train.__main__ import main
from train.trainer import Trainer


def dump_rank_state_before_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make :meth:`Trainer.finish` first save this rank's model and EMA state (``rank{R}.pt`` in the run)."""
    original = Trainer.finish

    def dump_then_finish(self: Trainer) -> dict[str, object]:
        torch.save({"model": self.run.model.state_dict(), "ema": self.ema.state_dict() if self.ema else {},
                    "ddp": isinstance(self.step_module, DistributedDataParallel)},
                   self.run.run_dir / f"rank{self.run.world.rank}.pt")
        return original(self)

    monkeypatch.setattr(Trainer, "finish", dump_then_finish)


if __name__ == "__main__":
    with pytest.MonkeyPatch.context() as patch:
        dump_rank_state_before_finish(patch)
        sys.exit(main(sys.argv[1:]))
