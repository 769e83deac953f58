"""The one results page, ``bench/README.md``: each benchmark owns one section between two markers.

A section starts with ``<!-- bench:NAME -->`` and ends with ``<!-- /bench:NAME -->``; :func:`write_section`
replaces what lies between them (or appends a new section at the end of the page), so re-running a benchmark
replaces its old numbers instead of adding a file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "README.md"


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"section name {name!r}: use lower-case letters, digits and '-'")
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def read_section(name: str, page: Path = PAGE) -> str | None:
    """The markdown of section NAME on the page (without its markers), or None when the page has none."""
    start, end = _markers(name)
    text = page.read_text() if page.exists() else ""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        return None
    return text[i + len(start):j].strip("\n")


def write_section(name: str, markdown: str, page: Path = PAGE) -> Path:
    """Replace section NAME of the page by MARKDOWN (appended at the end when the page has no such section).

    The page is rewritten atomically; everything outside the section is kept byte for byte."""
    start, end = _markers(name)
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = page.read_text() if page.exists() else "# Benchmark results\n"
    i, j = text.find(start), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + block + text[j + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, page)
    return page
