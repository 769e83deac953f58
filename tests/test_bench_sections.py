"""The benchmarks write their results as sections of one page (``--page``), run end to end on tiny inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import decode, export_speed, train_speed
from bench.results_page import read_section, write_section


def test_write_section_replaces_its_own_section_and_keeps_the_rest(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Results\n\nintro\n")
    write_section("b", "other", page)
    write_section("a", "old", page)
    write_section("a", "new", page)
    text = page.read_text()
    assert text.startswith("# Results\n\nintro\n")
    assert read_section("a", page) == "new" and read_section("b", page) == "other"
    assert text.count("<!-- bench:a -->") == 1 and "old" not in text
    with pytest.raises(ValueError, match="section name"):
        write_section("Bad Name", "x", page)


def test_decode_benchmark_writes_the_decode_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    threads = torch.get_num_threads()
    try:
        assert decode.main(["--sizes", "16", "--seconds", "0", "--page", str(page)]) == 0
    finally:
        torch.set_num_threads(threads)
    text = read_section("decode-cpu", page)
    assert text is not None and "Command: `python -m bench.decode --sizes 16 --seconds 0 --page" in text
    assert "Machine: " in text and "PyTorch 1 thread" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " px | " in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 448 x 448", "| 1024 x 768", "| 4000 x 3000"]


def test_export_benchmark_writes_one_row_per_precision(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    assert export_speed.main(["--arch", "resnet18", "--sizes", "32", "--batches", "1", "--budget", "0",
                              "--page", str(page), "--section", "export-tiny"]) == 0
    text = read_section("export-tiny", page)
    assert text is not None and read_section("export-cpu", page) is None
    rows = [line for line in text.splitlines() if line.startswith("| resnet18 + LgConv @32px")]
    assert [row.split(" | ")[1:3] for row in rows] == [["PyTorch eager", "fp32"], ["ONNX Runtime", "fp32"],
                                                       ["ONNX Runtime", "fp16"], ["ONNX Runtime", "int8 (cpu)"]]


def test_training_benchmark_writes_the_train_cpu_section(builtin_cache: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    assert train_speed.main(["--archs", "resnet18", "--data", "builtin:tiny", "--input", "synthetic",
                             "--image-sizes", "32", "--batch-size", "4", "--steps", "1", "--warmup", "0",
                             "--workers", "0", "--device", "cpu", "--page", str(page)]) == 0
    text = read_section("train-cpu", page)
    assert text is not None and "python -m bench.train_speed --archs resnet18" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| resnet18 |")]
    assert row.startswith("| resnet18 | none | 32 | 4 | fp32 | synthetic | 0 |") and float(row.split(" | ")[7]) > 0


def test_review_benchmark_report_gives_the_gap_closed(tmp_path: Path) -> None:
    """``python -m bench.review report``: per dev set and strategy, found / precision, the val and test gap closed
    ((mAP - an) / (full - an), mean over seeds, the smallest in brackets) and the gap closed per 100 reviews."""
    import json

    from bench import review

    for seed, (an, full, got) in enumerate([(50.0, 60.0, 53.0), (52.0, 60.0, 54.0)]):
        rows = [{"reviews": 500, "found": 300 + seed * 10, "val_mAP_full": an + 1.0, "test_mAP": got}]
        record = {"dev_set": "openclipart", "seed": seed, "train_images": 2117, "true_positives_unobserved": 2000,
                  "given": an, "full": full, "given_val": an, "full_val": an + 10.0, "seconds": 60.0,
                  "strategies": {"balanced": rows}}
        (tmp_path / f"openclipart-seed{seed}.json").write_text(json.dumps(record))
    page = tmp_path / "page.md"
    assert review.main(["report", "--out", str(tmp_path), "--page", str(page)]) == 0
    text = read_section("review-simulated", page)
    assert text is not None and "python -m bench.review measure" in text
    row = next(line for line in text.splitlines() if line.startswith("| balanced | 500 |"))
    # test gaps 30% and 25%: mean 27.5%, smallest 25.0%, 5.50% per 100 reviews; val 10% on both
    assert row == "| balanced | 500 | 305 (0.61) | 10.0% | 53.50 ± 0.71 | 27.5% (25.0%) | 5.50% |"
