"""Simulate a kill during training: the trainer raises KeyboardInterrupt right after a ``last.pt`` save."""

from __future__ import annotations

import pytest

from train.trainer import Trainer


def interrupt_after_saves(monkeypatch: pytest.MonkeyPatch, saves: int = 1) -> None:
    """Make the trainer raise KeyboardInterrupt right after it saved last.pt for the ``saves``-th time (the
    end of epoch ``saves``), as a kill at that point would leave the run."""
    calls = {"n": 0}
    original = Trainer.save_last

    def save_then_die(self: Trainer, epoch: int) -> None:
        original(self, epoch)
        calls["n"] += 1
        if calls["n"] == saves:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save_last", save_then_die)
