"""The benchmarks' timer (interleaved rounds, so ratios between the timed functions are paired) and the LgConv
cost benchmark run end to end on a tiny network."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models.bench import VARIANTS, export_for_ort, make_variant, time_call, time_interleaved
from models.bench import main as bench_main


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


def test_lgconv_benchmark_writes_every_variant_and_ratio(tmp_path: Path) -> None:
    out = tmp_path / "lgconv.md"
    assert bench_main(["--arch", "resnet18", "--sizes", "32", "--batches", "1", "--budget", "0",
                       "--output", str(out)]) == 0
    text = out.read_text()
    assert "Command: `python -m models.bench --arch resnet18 --sizes 32" in text
    for variant in VARIANTS:
        assert f"| {variant} | 32 px |" in text
    ratio_rows = [line for line in text.splitlines() if line.startswith("| 32 px |")]
    assert [row.split(" | ")[1:3] for row in ratio_rows] == [["PyTorch", "1"], ["ORT", "1"]]
    for row in ratio_rows:  # folded vs plain, vs plain-folded, unfolded vs plain: positive finite ratios
        assert all(0.0 < float(cell) < 100.0 for cell in row.strip("| ").split(" | ")[3:])


def test_benchmark_sessions_do_not_spin_between_runs(tmp_path: Path) -> None:
    model = make_variant("lgconv-folded", "resnet18", 3)
    session, path = export_for_ort(model, 32, 3, "resnet18", tmp_path)
    assert path.exists()
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    logits = session.run(None, {"images": np.zeros((2, 3, 32, 32), dtype=np.float32)})[0]
    assert logits.shape == (2, 3)
