"""Multi-label metrics: per-class AP (scikit-learn's step-wise AP), mAP, OF1 and CF1. A class without positives has AP
NaN: excluded from the mean by default, counted as 0 with ``empty="zero"`` (the papers' code)."""

from __future__ import annotations

from typing import Any

import numpy as np


def per_class_ap(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """AP for each column of ``scores``/``labels`` (N, C), NaN without positives: each run of tied scores is one
    threshold at its last row, AP the sum of recall gained times precision there."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 2:
        raise ValueError(f"scores and labels must both be (N, C); got {scores.shape} and {labels.shape}")
    if not scores.size:
        return np.full(scores.shape[1], np.nan)
    s = -np.ascontiguousarray(scores.T)  # (C, N): one row per class, sorted along the rows
    order = np.argsort(s, axis=1)  # the order within a run of ties does not matter: only its last row counts
    s = np.take_along_axis(s, order, 1)
    tp = np.take_along_axis(np.ascontiguousarray(labels.T) > 0, order, 1).cumsum(1, dtype=np.int32).astype(np.float64)
    last = np.ones_like(s, dtype=bool)
    last[:, :-1] = s[:, 1:] != s[:, :-1]  # the last of each run of tied scores
    at_last = np.where(last, tp, 0.0)
    before = np.zeros_like(tp)
    before[:, 1:] = np.maximum.accumulate(at_last, axis=1)[:, :-1]
    gained = np.where(last, tp - before, 0.0)  # positives passed since the previous threshold
    n_pos = tp[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pos > 0, (gained * tp / np.arange(1, s.shape[1] + 1)).sum(1) / n_pos, np.nan)


def mean_average_precision(scores: np.ndarray, labels: np.ndarray, empty: str = "exclude") -> float:
    """Macro mAP in percent. ``empty``: ``"exclude"`` classes without positives (default) or count them as
    ``"zero"`` (the papers' code). NaN when no class has a positive and ``empty="exclude"``."""
    ap = per_class_ap(scores, labels)
    if empty == "zero":
        return float(100.0 * np.nan_to_num(ap, nan=0.0).mean())
    if empty != "exclude":
        raise ValueError("empty must be 'exclude' or 'zero'")
    valid = ~np.isnan(ap)
    return float(100.0 * ap[valid].mean()) if valid.any() else float("nan")


def f1_scores(probs: np.ndarray, labels: np.ndarray, thresholds: float | np.ndarray = 0.5) -> dict[str, float]:
    """Overall (micro) and per-class (macro) precision/recall/F1 in percent at ``thresholds`` (a scalar or one per
    class); CF1 is ML-GCN's (harmonic mean of the averaged P and R)."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    pred = probs >= np.asarray(thresholds, dtype=np.float64)
    tp = (pred & labels).sum(0).astype(np.float64)
    n_pred = pred.sum(0).astype(np.float64)
    n_pos = labels.sum(0).astype(np.float64)

    def ratio(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        return np.divide(a, b, out=np.zeros_like(a), where=b > 0)

    def hmean(p: float, r: float) -> float:
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    op = float(ratio(tp.sum(), n_pred.sum()))
    orec = float(ratio(tp.sum(), n_pos.sum()))
    cp = float(ratio(tp, n_pred).mean())
    cr = float(ratio(tp, n_pos).mean())
    return {
        "OP": 100 * op, "OR": 100 * orec, "OF1": 100 * hmean(op, orec),
        "CP": 100 * cp, "CR": 100 * cr, "CF1": 100 * hmean(cp, cr)}


def evaluate(
    logits: np.ndarray, labels: np.ndarray, classes: list[str] | None = None, threshold: float = 0.5
) -> dict[str, Any]:
    """All metrics for logits (N, C) against 0/1 labels: mAP (both conventions), OF1/CF1 at ``threshold``
    on sigmoid probabilities, per-class AP (None for classes without positives) and their count."""
    logits = np.asarray(logits, dtype=np.float64)
    probs = 1.0 / (1.0 + np.exp(-np.clip(logits, -60, 60)))
    ap = per_class_ap(logits, labels)  # ranking on logits: no ties from sigmoid saturating at 1.0
    names = classes if classes is not None else [str(i) for i in range(len(ap))]
    valid = ~np.isnan(ap)
    return {
        "mAP": float(100 * ap[valid].mean()) if valid.any() else float("nan"),
        "mAP_zero_empty": float(100 * np.nan_to_num(ap, nan=0.0).mean()),
        "classes_without_positives": int((~valid).sum()),
        **f1_scores(probs, labels, threshold),
        "per_class_AP": {
            n: (None if np.isnan(a) else round(100 * float(a), 4)) for n, a in zip(names, ap, strict=True)},
        "num_images": len(logits)}
