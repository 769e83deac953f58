"""bench.gpu: the CPU path (no GPU: a message, exit 0) and the pure helpers behind its tables."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import build_parser, gpu_counts, main, scaling_rows, to_markdown


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path only runs without a GPU")
def test_without_gpu_it_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-write"]) == 0
    assert "no CUDA GPU visible" in capsys.readouterr().out


def test_bad_option_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "0"])
    assert exc.value.code == 2


def test_gpu_counts_and_scaling() -> None:
    assert gpu_counts(0) == [] and gpu_counts(1) == [1] and gpu_counts(4) == [1, 2, 4]
    assert gpu_counts(6) == [1, 2, 4, 6] and gpu_counts(8) == [1, 2, 4, 8]
    rows = scaling_rows({2: 180.0, 1: 100.0, 4: 320.0})
    assert [(n, eff) for n, _, eff in rows] == [(1, 1.0), (2, 0.9), (4, 0.8)]


def test_markdown_tables() -> None:
    args = build_parser().parse_args(["--steps", "5"])
    args.argv = ["--steps", "5"]
    text = to_markdown(args, [("fp32", 100.0), ("bf16 autocast + channels_last", 250.0)], {1: 250.0, 2: 475.0},
                       [("fp32", 400.0), ("fp16", 900.0)], "Machine: test.")
    assert "Command: `python -m bench.gpu --steps 5`" in text
    assert "| bf16 autocast + channels_last | 250.0 | 2.50x |" in text
    assert "| 2 | 475.0 | 95% |" in text and "| fp16 | 900.0 |" in text
    skipped = to_markdown(args, [], {}, "ONNX Runtime has no CUDAExecutionProvider here", "Machine: test.")
    assert "no CUDAExecutionProvider" in skipped
