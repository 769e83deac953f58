"""Observation processes: which labels of a full matrix training may see (int8: 1, -1, 0), drawn consuming random
numbers exactly as the reference does, so a seed gives the same matrix bit for bit."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["observe_partial", "observe_uniform", "observe_weighted"]


def _first_shuffled(indices: np.ndarray, count: int, rng: np.random.RandomState) -> np.ndarray:
    """Shuffle ``indices`` in place with ``rng`` and return the first ``count`` (all for -1)."""
    rng.shuffle(indices)
    return indices if count == -1 else indices[:count]


def observe_uniform(labels: np.ndarray, num_pos: int = 1, num_neg: int = 0, seed: int = 1200) -> np.ndarray:
    """Up to ``num_pos`` positives and ``num_neg`` negatives per image (-1: all), drawn as the reference does."""
    if num_pos < -1 or num_neg < -1:
        raise ValueError("num_pos and num_neg must be >= 0, or -1 for all")
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    observed = np.zeros(labels.shape, dtype=np.int8)
    for i, row in enumerate(labels):
        observed[i, _first_shuffled(np.flatnonzero(row == 1), num_pos, rng)] = 1
        observed[i, _first_shuffled(np.flatnonzero(row != 1), num_neg, rng)] = -1
    return observed


def observe_weighted(labels: np.ndarray, weights_of: Callable[[int], Sequence[float]], seed: int,
                     uniform_if_equal: bool = False) -> np.ndarray:
    """One positive per image drawn in proportion to ``weights_of(i)`` with one ``random.Random(seed)`` in row order."""
    labels = np.asarray(labels)
    rng = random.Random(seed)
    observed = np.zeros(labels.shape, dtype=np.int8)
    columns = range(labels.shape[1])
    for i, row in enumerate(labels):
        positives = np.flatnonzero(row == 1).tolist()
        if not positives:
            continue
        weights = list(weights_of(i))
        if uniform_if_equal and len(set(weights)) == 1:  # the reference's np.unique(weights) test
            kept = rng.choice(positives)
        elif sum(weights) > 0:
            kept = rng.choices(columns, weights=weights)[0]
        else:
            raise ValueError(f"image {i} of the training pool has no positive weight to draw its positive from")
        if row[kept] != 1:
            raise ValueError(f"image {i} of the training pool: weight on class column {kept}, not a positive")
        observed[i, kept] = 1
    return observed


def observe_partial(labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Each positive kept independently with probability ``rate`` (one ``RandomState(seed)`` draw per entry)."""
    keep = np.random.RandomState(seed).random_sample(np.shape(labels)) < rate
    return (np.asarray(labels).astype(bool) & keep).astype(np.int8)
