"""``python -m bench.backbones`` end to end on the tiny built-in data: runs reused, the section written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import backbones
from bench.results_page import read_section


def test_backbones_benchmark_compares_configurations(builtin_cache: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    page, runs = tmp_path / "page.md", tmp_path / "runs"
    argv = ["--data", "builtin:tiny", "--seeds", "0", "--configs", "resnet18-scratch,lite0-fixed", "--runs-dir",
            str(runs), "--page", str(page), "--train-args", "--epochs 1 --image-size 32 --batch-size 16 --workers 0"]
    assert backbones.main(argv) == 0
    text = read_section("backbones-builtin", page)
    assert text is not None and "python -m bench.backbones --data builtin:tiny" in text
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ResNet-18") or
            line.startswith("| EfficientNet-Lite0")]
    assert len(rows) == 2
    scratch, fixed = rows
    assert 0 < float(scratch[1]) <= 100 and 0 < float(scratch[2]) <= 100 and float(scratch[3]) > 0  # img/s logged
    assert fixed[3] == "cached features"
    capsys.readouterr()
    assert backbones.main(argv) == 0
    assert capsys.readouterr().out.count("done already") == 4
    # --finished-only trains nothing: a configuration without runs is listed as not run
    assert backbones.main([*argv[:5], "resnet18-scratch,lite0-imagenet", *argv[6:], "--finished-only"]) == 0
    assert not (runs / "lite0-imagenet").exists()
    text = read_section("backbones-builtin", page)
    assert text is not None and "Not run yet (`--finished-only`), so not in the table (2): lite0-imagenet/bce-seed0, " \
        "lite0-imagenet/an-seed0." in text
