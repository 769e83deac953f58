"""Full-label diagnostics of a method's label estimates; nothing of them reaches the method."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from models.evaluation.metrics import mean_average_precision
from train.methods.base import NEGATIVES, POSITIVES, SCORES, LabelEstimate, Method


def score_label_estimates(estimates: dict[str, LabelEstimate], full_labels: torch.Tensor) -> dict[str, float]:
    """Per estimate ``name``: ``<name>_recovery_mAP`` (scores) or ``<name>_precision`` (non-empty masks)."""
    logs: dict[str, float] = {}
    for name, estimate in estimates.items():
        values = estimate.values.detach().cpu()
        if estimate.kind == SCORES:
            logs[f"{name}_recovery_mAP"] = mean_average_precision(values.float().numpy(), full_labels.numpy())
        elif estimate.kind in (POSITIVES, NEGATIVES) and bool(values.any()):
            truth = full_labels[values.bool()] > 0.5
            logs[f"{name}_precision"] = float((truth if estimate.kind == POSITIVES else ~truth).float().mean())
    return logs


def run_diagnostics(method: Method, splits: Any, is_main: bool) -> dict[str, float]:
    """The method's label estimates scored against hidden full training labels (rank 0 only)."""
    estimates = method.label_estimates() if is_main and splits.train_has_full_labels else {}
    if not estimates:
        return {}
    return score_label_estimates(estimates, torch.from_numpy(splits.train.labels.astype(np.float32)))
