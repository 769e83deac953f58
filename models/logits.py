"""A model outputs one logit per class; its probability is the sigmoid here, the one of export and serving."""

from __future__ import annotations

import numpy as np


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))
