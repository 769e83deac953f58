"""The own-data benchmark (``python -m bench.own_data``) end to end on the tiny built-in data, one epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import own_data
from bench.results_page import read_section


def test_own_data_benchmark_trains_on_single_positive_labels_and_writes_its_tables(
        builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, runs = tmp_path / "page.md", tmp_path / "runs"
    argv = ["--datasets", "builtin:tiny", "--seeds", "0", "--backbone", "none", "--audit-size", "10",
            "--runs-dir", str(runs), "--page", str(page), "--",
            "--epochs", "1", "--no-lgconv", "--batch-size", "16", "--image-size", "32", "--workers", "0"]
    assert own_data.main(argv) == 0
    text = read_section("own-data", page)
    assert text is not None and "python -m bench.own_data --datasets builtin:tiny" in text and "Machine: " in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| builtin:tiny | 0 |")]
    runs_rows, k_rows = rows[:3], rows[3:]
    assert [row[2] for row in runs_rows] == ["an", "epr-k-estimated", "epr-k-true"]
    assert all(len(row) == 11 and row[4].startswith("1: ") and row[5].startswith("1: ") for row in runs_rows)
    assert len(k_rows) == 1 and len(k_rows[0]) == 6
    assert sum(line.startswith("| **mean** |") for line in text.splitlines()) == 1

    # every run saw the data as a user has it: one label per training and validation image, full test labels
    for name, source in (("an-seed0", None), ("epr-k-estimated-seed0", "estimated"), ("epr-k-true-seed0", "given")):
        resolved = json.loads((runs / "builtin-tiny" / name / "config.json").read_text())["resolved"]
        assert {split: r["kind"] for split, r in resolved["labels"].items()} == {
            "train": "single-positive", "val": "single-positive", "test": "full"}
        assert resolved["selection"]["criterion"] == "an-loss"
        assert (resolved["expected_positives"] or {}).get("source") == source

    capsys.readouterr()
    assert own_data.main(argv) == 0  # finished runs are reused, not trained again
    assert capsys.readouterr().err.count("done already") == 3
    assert read_section("own-data", page) is not None
