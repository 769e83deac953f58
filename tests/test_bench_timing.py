"""The benchmarks' timer: interleaved rounds, so ratios between the timed functions are paired."""

from __future__ import annotations

import time
from collections.abc import Callable

from models.bench import time_call, time_interleaved


def test_interleaved_rounds_alternate_order_and_time_each_function() -> None:
    calls: list[str] = []

    def record(name: str, seconds: float) -> Callable[[], None]:
        def fn() -> None:
            calls.append(name)
            time.sleep(seconds)
        return fn

    medians = time_interleaved({"a": record("a", 0.0), "b": record("b", 0.004), "c": record("c", 0.0)},
                               budget_s=0.0, min_rounds=4)
    # one warm-up call each, then 4 rounds: forward, reversed, forward, reversed
    assert calls == ["a", "b", "c"] + ["a", "b", "c", "c", "b", "a"] * 2
    assert set(medians) == {"a", "b", "c"}
    assert medians["b"] >= 0.004 > medians["a"]


def test_interleaved_rounds_stop_at_the_budget_or_the_round_cap() -> None:
    count = {"n": 0}

    def fn() -> None:
        count["n"] += 1

    time_interleaved({"f": fn}, budget_s=10.0, min_rounds=1, max_rounds=7)
    assert count["n"] == 1 + 7  # warm-up + the round cap, long before the 10 s budget
    count["n"] = 0
    assert time_call(fn, budget_s=0.0, min_repeats=3) >= 0.0
    assert count["n"] == 1 + 3
