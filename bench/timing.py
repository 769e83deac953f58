"""Timing helpers shared by the benchmarks: several functions timed in interleaved rounds so that ratios between
them are paired measurements, with the spread of the rounds (min / median / max) kept, not only the median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """A measurement repeated in rounds: its ``min``, ``median`` and ``max`` over ``rounds`` values."""

    min: float
    median: float
    max: float
    rounds: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        if not values:
            raise ValueError("a spread needs at least one value")
        return cls(min(values), statistics.median(values), max(values), len(values))

    def per_second(self, items: float = 1.0) -> Spread:
        """Seconds per call -> ``items`` per second (the fastest call gives the largest rate)."""
        return Spread(items / self.max, items / self.median, items / self.min, self.rounds)

    def scaled(self, factor: float) -> Spread:
        """Every value times ``factor`` (a positive factor: the order is kept)."""
        return Spread(self.min * factor, self.median * factor, self.max * factor, self.rounds)

    def text(self, spec: str = ".1f", unit: str = "") -> str:
        """``median (min-max)``, e.g. ``152.4 (140.1-158.0)`` (``unit`` after the median: ``0.95x (0.90-1.01)``);
        the median alone when every round gave the same value (to ``spec``)."""
        low, mid, high = (f"{v:{spec}}" for v in (self.min, self.median, self.max))
        return f"{mid}{unit}" if low == high else f"{mid}{unit} ({low}-{high})"


def interleaved_order(names: list[str], round_: int) -> list[str]:
    """The order in which round ``round_`` runs ``names``: as given on even rounds, reversed on odd ones, so no
    name always runs first (or always right after the same neighbour)."""
    return names if round_ % 2 == 0 else names[::-1]


def time_interleaved_spread(fns: dict[str, Callable[[], Any]], budget_s: float, min_rounds: int = 3,
                            max_rounds: int = 50) -> dict[str, Spread]:
    """Seconds per call of each function of ``fns`` (name -> function), timed in interleaved rounds: the min,
    median and max over the rounds.

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
    return {name: Spread.of(ts) for name, ts in times.items()}


def time_interleaved(fns: dict[str, Callable[[], Any]], budget_s: float, min_rounds: int = 3,
                     max_rounds: int = 50) -> dict[str, float]:
    """Median seconds per call of each function of ``fns``: :func:`time_interleaved_spread`'s medians."""
    return {name: s.median for name, s in time_interleaved_spread(fns, budget_s, min_rounds, max_rounds).items()}


def time_call(fn: Callable[[], Any], budget_s: float, min_repeats: int = 3) -> float:
    """Median seconds per call of ``fn`` after one warm-up, over at least ``min_repeats`` calls or ``budget_s``."""
    return time_interleaved({"fn": fn}, budget_s, min_rounds=min_repeats)["fn"]
