"""Tiny training runs shared by the training tests: the built-in 20-class miniature at 32 px on ResNet-18."""

from __future__ import annotations

from pathlib import Path

from train.config import TrainConfig

#: ``python -m train`` options of a tiny run: plain ResNet unless a test is about the default (LgConv) model, since at
#: 32 px the global branches halve training speed (test_run_folder_contents and the first resume case train it).
FAST = ["--data", "builtin:tiny", "--weights", "none", "--image-size", "32", "--batch-size", "16", "--no-progress",
        "--no-lgconv"]


def tiny_config(tmp_path: Path, **kw: object) -> TrainConfig:
    """The :class:`TrainConfig` of a tiny run in ``tmp_path`` (2 epochs, full labels), ``kw`` overriding."""
    base = {"data": "builtin:tiny", "arch": "resnet18", "weights": "none", "image_size": 32, "batch_size": 16,
            "epochs": 2, "workers": 0, "progress": False, "runs_dir": str(tmp_path), "lgconv": False,
            "labels": "full"}  # the fixtures are benchmarks: every label is known (squares_csv too)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]
