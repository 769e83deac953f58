"""The benchmarks' timer (interleaved rounds, so ratios between the timed functions are paired) and the LgConv
cost benchmark run end to end on a tiny network."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.lgconv import VARIANTS, export_for_ort, make_variant, ort_node_count, ort_op_profiles, per_op_medians
from bench.lgconv import main as bench_main
from bench.results_page import read_section
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


def test_lgconv_benchmark_writes_every_variant_and_ratio_and_records_its_threads(tmp_path: Path) -> None:
    """One run of ``python -m bench.lgconv`` on one thread: every variant and ratio row, in the one-thread section
    (not the default one) with the thread counts on its machine line; a negative thread count is a usage error."""
    page = tmp_path / "results.md"
    threads = torch.get_num_threads()
    try:
        assert bench_main(["--arch", "resnet18", "--sizes", "32", "--batches", "1", "--budget", "0",
                           "--threads", "1", "--page", str(page)]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert read_section("lgconv-cpu", page) is None  # one thread: its own section
    text = read_section("lgconv-cpu-1-thread", page)
    assert text is not None and "PyTorch 1 thread, ONNX Runtime 1 thread, torch " in text
    assert "Command: `python -m bench.lgconv --arch resnet18 --sizes 32" in text
    for variant in VARIANTS:
        assert f"| {variant} | 32 px |" in text
    assert "| variant | input | params (M) | GFLOPs/img | ORT nodes | PyTorch b1 ms (img/s) |" in text
    ratio_rows = [line for line in text.splitlines() if line.startswith("| 32 px |")]
    assert [row.split(" | ")[1:3] for row in ratio_rows] == [["PyTorch", "1"], ["ORT", "1"]]
    for row in ratio_rows:  # folded vs plain, vs plain-folded, unfolded vs plain: positive finite ratios
        assert all(0.0 < float(cell) < 100.0 for cell in row.strip("| ").split(" | ")[3:])
    with pytest.raises(SystemExit) as exc:
        bench_main(["--threads", "-1", "--page", str(page)])
    assert exc.value.code == 2


def test_benchmark_sessions_do_not_spin_between_runs(tmp_path: Path) -> None:
    model = make_variant("lgconv-folded", "resnet18", 3)
    session, path = export_for_ort(model, 32, 3, "resnet18", tmp_path)
    assert path.exists()
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    logits = session.run(None, {"images": np.zeros((2, 3, 32, 32), dtype=np.float32)})[0]
    assert logits.shape == (2, 3)


def test_benchmark_sessions_take_the_thread_count(tmp_path: Path) -> None:
    session, _ = export_for_ort(make_variant("plain-folded", "resnet18", 3), 32, 3, "resnet18", tmp_path, threads=1)
    assert session.get_session_options().intra_op_num_threads == 1
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def _node(op: str, ts: int, dur: int) -> dict[str, object]:
    return {"cat": "Node", "name": f"{op}_1_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_profile_leaves_out_warmup_runs_and_takes_per_op_medians() -> None:
    events = [
        {"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50},
        # run 0 (warm-up, 100x slower) at 100..1200, then runs at 2000, 3000, 4000 (listed out of order)
        {"cat": "Session", "name": "model_run", "ts": 3000, "dur": 100},
        {"cat": "Session", "name": "model_run", "ts": 100, "dur": 1100},
        {"cat": "Session", "name": "model_run", "ts": 2000, "dur": 100},
        {"cat": "Session", "name": "model_run", "ts": 4000, "dur": 100},
        _node("Conv", 110, 1000), _node("Relu", 1150, 40),
        _node("Conv", 2010, 10), _node("Conv", 2030, 20), _node("Relu", 2060, 4),  # 2 Conv nodes in one run
        _node("Conv", 3010, 40), _node("Relu", 3060, 2),
        _node("Conv", 4010, 50),  # no Relu in this run: counts as 0
        {"cat": "Node", "name": "Conv_1_fence_before", "ts": 4005, "dur": 999, "args": {"op_name": "Conv"}},
    ]
    medians = per_op_medians(events, skip_runs=1)
    assert list(medians) == ["Conv", "Relu"]  # largest first
    assert medians["Conv"] == 0.040  # median of 30, 40, 50 us, in ms
    assert medians["Relu"] == 0.002  # median of 4, 2, 0 us


def test_profiles_of_interleaved_sessions_cover_the_real_graph(tmp_path: Path) -> None:
    paths = {}
    for name in ("plain", "plain-folded"):
        _, paths[name] = export_for_ort(make_variant(name, "resnet18", 3), 32, 3, "resnet18", tmp_path)
    profiles = ort_op_profiles(paths, 32, runs=3, warmup=1)
    assert set(profiles) == {"plain", "plain-folded"}
    for per_op in profiles.values():
        assert "Conv" in per_op and per_op["Conv"] > 0.0
        assert all(ms >= 0.0 for ms in per_op.values())
        assert list(per_op.values()) == sorted(per_op.values(), reverse=True)


def test_node_count_is_that_of_the_optimised_graph_and_grows_with_lgconv(tmp_path: Path) -> None:
    import onnx

    counts, exported = {}, {}
    for name in ("plain-folded", "lgconv-folded"):
        _, path = export_for_ort(make_variant(name, "resnet18", 3), 32, 3, "resnet18", tmp_path)
        counts[name] = ort_node_count(path)
        exported[name] = len(onnx.load(str(path)).graph.node)
    # ResNet-18 has 20 convolutions; ORT fuses each block's ReLU and residual Add into them, so the optimised
    # plain graph has fewer nodes than the exported one, but at least one per convolution
    assert 20 <= counts["plain-folded"] < exported["plain-folded"]
    # every one of ResNet-18's 16 folded LgConvs adds its own small ops (pooling, matrix products, softmax, gate)
    assert counts["lgconv-folded"] >= counts["plain-folded"] + 16 * 5
