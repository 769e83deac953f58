"""The machine line every results section carries: processor or GPU, thread counts, library versions, the machine's
load when it was written, date."""

from __future__ import annotations

import os
import platform
from datetime import datetime
from pathlib import Path

import torch


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def gpu_names() -> list[str]:
    """The names of the visible CUDA devices (empty without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def threads_text(n: int) -> str:
    """'1 thread' / 'N threads'."""
    return f"{n} thread" if n == 1 else f"{n} threads"


def load_text() -> str:
    """The machine's load average now, e.g. ``load average 1.1 / 1.5 / 2.0 (1 / 5 / 15 min) on 2 CPUs``: above the
    CPU count, other work shared the CPUs with the benchmark and its timings are not to be trusted."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) on {os.cpu_count()} CPUs"


def machine_line(extra: str = "", gpu: bool = False) -> str:
    """One line naming the machine a result was measured on, with torch's version, the machine's load (when the
    line is written, at the end of the run) and today's date.

    ``gpu=True`` names the visible CUDA devices (or says there are none) instead of the CPU's thread count;
    ``extra`` is appended as is (e.g. ONNX Runtime's thread setting)."""
    parts = [cpu_name()]
    if gpu:
        gpus = gpu_names()
        parts.append(f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU")
    else:
        parts.append(f"PyTorch {threads_text(torch.get_num_threads())}")
    if extra:
        parts.append(extra)
    parts.append(f"torch {torch.__version__}")
    return f"Machine: {', '.join(parts)}; {load_text()}; {datetime.now().strftime('%Y-%m-%d')}."
