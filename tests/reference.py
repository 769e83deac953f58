"""Reference computations shared by tests: results computed without the export or serve packages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models import load_checkpoint, model_from_meta
from models.preprocess import EvalTransform


def reference_logits(checkpoint: Path, paths: list[Path]) -> np.ndarray:
    """PyTorch logits of ``checkpoint`` on ``paths``: checkpoint -> network + EvalTransform, in eval mode."""
    ckpt = load_checkpoint(checkpoint)
    model = model_from_meta(ckpt.meta)
    model.load_state_dict(ckpt.model)
    model.eval()
    tf = EvalTransform.for_meta(ckpt.meta)
    with torch.no_grad():
        return model(torch.stack([tf(p) for p in paths])).numpy()
