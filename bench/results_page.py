"""The one results page, ``bench/README.md``: each benchmark owns one section between two markers.

A section starts with ``<!-- bench:NAME -->`` and ends with ``<!-- /bench:NAME -->``; :func:`write_section`
replaces what lies between them (or appends a new section at the end of the page), so re-running a benchmark
replaces its old numbers instead of adding a file. :func:`add_page_options` gives every benchmark the same
``--page`` / ``--section`` options and :func:`publish` writes its section.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from datetime import datetime
from pathlib import Path

import torch

from models.runtimes.devices import cpu_name

PAGE = Path(__file__).resolve().parent / "README.md"
SECTION_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def _markers(name: str) -> tuple[str, str]:
    if not SECTION_NAME.fullmatch(name):
        raise ValueError(f"section name {name!r}: use lower-case letters, digits and '-'")
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def read_section(name: str, page: Path = PAGE) -> str | None:
    """The markdown of section NAME on the page (without its markers), or None when the page has none."""
    start, end = _markers(name)
    text = page.read_text() if page.exists() else ""
    i, j = text.find(start), text.find(end)
    return None if i < 0 or j < i else text[i + len(start):j].strip("\n")


def write_section(name: str, markdown: str, page: Path = PAGE) -> Path:
    """Replace section NAME of the page by MARKDOWN (appended at the end when the page has no such section).

    The page is rewritten atomically; everything outside the section is kept byte for byte."""
    start, end = _markers(name)
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = page.read_text() if page.exists() else "# Benchmark results\n"
    i, j = text.find(start), text.find(end)
    replaced = i >= 0 and j > i
    text = text[:i] + block + text[j + len(end):] if replaced else text.rstrip("\n") + "\n\n" + block + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, page)
    return page


def section_name(text: str) -> str:
    """argparse type of ``--section``: a valid section name (lower-case letters, digits and '-')."""
    if not SECTION_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: use lower-case letters, digits and '-'")
    return text


def add_page_options(parser: argparse.ArgumentParser, default_section: str) -> None:
    """Add ``--page FILE`` (default: bench/README.md) and ``--section NAME`` (default: ``default_section``)."""
    parser.add_argument("--page", type=Path, default=PAGE, metavar="FILE",
                        help="results page whose section this run replaces (default: bench/README.md)")
    parser.add_argument("--section", type=section_name, default=None, metavar="NAME",
                        help=f"section of the page to replace (default: {default_section})")


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that reproduces a run: ``python -m MODULE ARGS`` (``argv`` None: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    return f"python -m {module} {shlex.join(args)}".strip()


def publish(name: str, markdown: str, page: Path = PAGE) -> Path:
    """Write section NAME of the page (:func:`write_section`) and say so on stderr."""
    write_section(name, markdown, page)
    print(f"wrote section {name} of {page}", file=sys.stderr)
    return page


# ------------------------------------------------------------------------------------------------------------------
# The machine line every section carries: processor or GPU, thread counts, library versions, the load, the date


def gpu_names() -> list[str]:
    """The names of the visible CUDA devices (empty without CUDA)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [torch.cuda.get_device_name(i) for i in range(count)]


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
