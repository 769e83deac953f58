"""The own-data benchmark (``python -m bench.own_data``) end to end on the tiny built-in data, two epochs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import own_data
from bench.results_page import read_section
from models.evaluation.criteria import LABEL_FREE_CRITERIA, validation_map


def test_own_data_benchmark_records_every_epoch_and_scores_every_criterion(
        builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, runs = tmp_path / "page.md", tmp_path / "runs"
    argv = ["--datasets", "builtin:tiny", "--backbones", "scratch", "--methods", "an,epr", "--seeds", "0",
            "--runs-dir", str(runs), "--page", str(page),
            "--train-args", "--epochs 2 --image-size 32 --batch-size 16 --workers 0"]
    assert own_data.main(argv) == 0
    text = read_section("own-data", page)
    assert text is not None and "python -m bench.own_data --datasets builtin:tiny" in text and "Machine: " in text
    rows = {line.split(" | ")[0].removesuffix(" (default)"): line for line in text.splitlines()
            if line.startswith("| `")}
    assert set(rows) == {f"| `{name}`" for name in [*LABEL_FREE_CRITERIA, *own_data.EXTRA_RULES]}
    assert all(line.split(" | ")[1] == "2" for line in rows.values())  # two runs scored per criterion
    assert sum(line.startswith("| builtin:tiny | scratch |") for line in text.splitlines()) == 1  # k row of an

    for method in ("an", "epr"):  # every run saw the data as a user has it, full test labels declared
        run = runs / "builtin-tiny" / "scratch" / f"{method}-seed0"
        resolved = json.loads((run / "config.json").read_text())["resolved"]
        assert {split: r["kind"] for split, r in resolved["labels"].items()} == {
            "train": "single-positive", "val": "single-positive", "test": "full"}
        record = own_data.RunRecord.load(run / own_data.RECORD)
        assert record.val_logits.shape[0] == record.test_logits.shape[0] == 2  # every epoch recorded
        assert record.val_full.shape == record.val_observed.shape and record.val_full.sum() > record.val_observed.sum()
        maps = [validation_map(v, record.val_full) for v in record.val_logits]
        assert record.full_pick == int(np.argmax(maps)) + 1  # the papers' pick: best val mAP on the hidden labels
        assert 1 <= record.selected_epoch <= 2

    capsys.readouterr()
    assert own_data.main(argv) == 0  # finished runs are reused, not trained again
    assert capsys.readouterr().err.count("done already") == 2

    # --finished-only trains nothing: a method without a run is listed as not run, the tables keep the others
    assert own_data.main([*argv, "--methods", "an,epr,wan", "--finished-only"]) == 0
    assert not (runs / "builtin-tiny" / "scratch" / "wan-seed0").exists()
    text = read_section("own-data", page)
    assert text is not None and "Not run yet (`--finished-only`), so not in the tables (1): builtin:tiny scratch " \
        "wan-seed0." in text
    assert all(line.split(" | ")[1] == "2" for line in text.splitlines() if line.startswith("| `"))
