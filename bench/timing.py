"""Timing helpers shared by the benchmarks: median seconds per call, several functions timed in interleaved
rounds so that ratios between them are paired measurements."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved_order(names: list[str], round_: int) -> list[str]:
    """The order in which round ``round_`` runs ``names``: as given on even rounds, reversed on odd ones, so no
    name always runs first (or always right after the same neighbour)."""
    return names if round_ % 2 == 0 else names[::-1]


def time_interleaved(fns: dict[str, Callable[[], Any]], budget_s: float, min_rounds: int = 3,
                     max_rounds: int = 50) -> dict[str, float]:
    """Median seconds per call of each function of ``fns`` (name -> function), timed in interleaved rounds.

    After one warm-up call each, every round calls each function once (in reverse order every other round) until
    ``budget_s`` seconds per function have passed, with at least ``min_rounds`` and at most ``max_rounds`` rounds.
    A slow drift in the machine's speed then hits every function alike, so ratios between them are paired."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (rounds < max_rounds and time.perf_counter() - start < budget_s * len(names)):
        for name in interleaved_order(names, rounds):
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
        rounds += 1
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_call(fn: Callable[[], Any], budget_s: float, min_repeats: int = 3) -> float:
    """Median seconds per call of ``fn`` after one warm-up, over at least ``min_repeats`` calls or ``budget_s``."""
    return time_interleaved({"fn": fn}, budget_s, min_rounds=min_repeats)["fn"]
