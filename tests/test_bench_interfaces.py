"""bench/ stands on the stages' public interfaces only, and stays small.

A benchmark imports a stage (``train``, ``export``, ``serve``) as ``from <stage> import <name>`` with ``<name>`` in
the stage's ``__all__`` (its package root's lazy public API), never a stage's sub-module: the stages' internals stay
free to move. The shared layer ``models`` is open to it. Decided studies keep their tables on bench/README.md and
their code in git history, so bench/ is at most :data:`MAX_LINES` lines."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layering import ROOT, STAGES

BENCH = sorted((ROOT / "bench").glob("*.py"))
MAX_LINES = 3500


def stage_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) of every import of a stage in ``path`` (functions' imports too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] in STAGES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in STAGES:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
    return found


def test_bench_imports_only_the_stages_public_names() -> None:
    wrong = []
    for path in BENCH:
        for line, module, names in stage_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if module not in STAGES or not names:
                wrong.append(f"{where} imports {module} (use: from {module.split('.')[0]} import NAME)")
                continue
            public = importlib.import_module(module).__all__
            wrong += [f"{where} imports {module}.{n}, not in {module}.__all__" for n in names if n not in public]
    assert wrong == [], "bench/ reaches into a stage:\n" + "\n".join(wrong)


def test_the_scan_sees_a_submodule_import(tmp_path: Path) -> None:
    source = tmp_path / "b.py"
    source.write_text("import train.choose\n\ndef f():\n    from serve.tagging import tag\n")
    assert stage_imports(source) == [(1, "train.choose", []), (4, "serve.tagging", ["tag"])]


def defines(module: str, name: str) -> bool:
    """Whether ``module``'s source binds ``name`` at its top level (a def, class, assignment or import)."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    bound = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return name in bound


@pytest.mark.parametrize("stage", STAGES)
def test_every_public_name_is_defined_where_the_lazy_table_says(stage: str) -> None:
    module = importlib.import_module(stage)
    assert len(module.__all__) == len(set(module.__all__))
    lazy = getattr(module, "_LAZY", {})
    missing = [n for n in module.__all__ if not (defines(lazy[n], n) if n in lazy else defines(stage, n))]
    assert missing == [], f"{stage}.__all__ names nothing behind: {missing}"


@pytest.mark.parametrize("stage", STAGES)
def test_importing_a_stage_stays_cheap(stage: str) -> None:
    heavy = ("torch", "onnxruntime", "gradio")
    probe = f"import sys, {stage}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]", f"import {stage} loads {done.stdout.strip()}"


def test_bench_is_at_most_3500_lines() -> None:
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in BENCH)
    assert lines <= MAX_LINES, f"bench/*.py is {lines} lines (at most {MAX_LINES})"
