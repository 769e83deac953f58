"""The benchmarks' timer: interleaved rounds, so ratios between the timed functions are paired."""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.timing import Spread, time_call, time_interleaved, time_interleaved_spread


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


def test_spread_keeps_min_median_max_of_the_interleaved_rounds() -> None:
    spread = time_interleaved_spread({"a": lambda: None, "b": lambda: time.sleep(0.002)}, budget_s=0.0, min_rounds=5)
    assert all(s.rounds == 5 and s.min <= s.median <= s.max for s in spread.values())
    assert spread["b"].min >= 0.002 > spread["a"].max
    rate = Spread.of([0.5, 1.0, 2.0]).per_second(10)
    assert (rate.min, rate.median, rate.max) == (5.0, 10.0, 20.0) and rate.text(".0f") == "10 (5-20)"
    assert Spread.of([1.0, 1.0]).text(".2f", "x") == "1.00x" and Spread.of([0.9, 1.1, 1.0]).text(".1f", "x") == \
        "1.0x (0.9-1.1)"
