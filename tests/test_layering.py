"""The package layering, read from the source with ``ast``: ``models`` below, the stages ``train``, ``export`` and
``serve`` above it, as peers.

``models`` is the shared layer (the network, its metadata and checkpoint files, preprocessing, runtimes, file
helpers, the datasets and their protocol, the metrics, criteria and k): what several stages share. A stage imports
``models`` and itself, never another stage; ``models`` imports no stage; no product package imports ``bench`` or
``tests``; the product modules' module-level imports form no cycle, and neither do a package's sub-packages (each
sub-package, or top-level module, as one node; every import counts)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = "models"
STAGES = ["train", "export", "serve"]  # peers: each imports the shared layer only
LAYERS = [SHARED, *STAGES]
FORBIDDEN = {"bench", "tests"}
BUILDERS = "models.sources"  # the dataset builders: never reached by export or serve
#: Sub-package edges that count at module level only: the dataset registry reaches a builder inside its kind's loader.
LAZY_EDGES = {("models.data", BUILDERS)}


def module_name(path: Path) -> str:
    """Dotted module name of a file below ROOT (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PRODUCT = {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def imports_of(path: Path, module_level_only: bool) -> list[tuple[str, int]]:
    """(imported module, line) of every import in ``path``, relative imports resolved; ``from X import Y`` also
    counts ``X.Y`` when that is a product module. ``module_level_only`` skips imports inside functions."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                target = ".".join([*base, *([child.module] if child.module else [])])
                found.append((target, child.lineno))
                found.extend((f"{target}.{a.name}", child.lineno) for a in child.names
                             if f"{target}.{a.name}" in PRODUCT)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (node -> nodes it imports) as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_scan_sees_every_product_package_and_resolves_relative_imports(tmp_path: Path) -> None:
    assert {name.split(".")[0] for name in PRODUCT} == set(LAYERS)
    assert any(target == "models.checkpoint" for target, _ in imports_of(PRODUCT["models.onnx_metadata"], True))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_stages_import_only_the_shared_layer() -> None:
    wrong = []
    for name, path in PRODUCT.items():
        own = name.split(".")[0]
        for target, line in imports_of(path, module_level_only=False):
            top = target.split(".")[0]
            if top in STAGES and top != own:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == [], "a stage imports another (they share models/ only):\n" + "\n".join(wrong)


def sub_package(name: str) -> str:
    """The node of ``name`` in the sub-package graph: its package and first sub-package or module
    (``train.methods.an`` -> ``train.methods``, ``train.trainer`` -> ``train.trainer``)."""
    return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("layer", LAYERS)
def test_no_circle_among_the_sub_packages(layer: str) -> None:
    graph: dict[str, set[str]] = {}
    for name, path in PRODUCT.items():
        if name.split(".")[0] != layer:
            continue
        node = sub_package(name)
        targets = {sub_package(t) for t, _ in imports_of(path, module_level_only=False) if t in PRODUCT}
        targets -= {t for t in targets if (node, t) in LAZY_EDGES}
        targets |= {sub_package(t) for t, _ in imports_of(path, module_level_only=True) if t in PRODUCT}
        graph.setdefault(node, set()).update(t for t in targets if t != node and t.split(".")[0] == layer)
    graph = {node: targets & graph.keys() for node, targets in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "sub-packages import each other: " + " -> ".join(cycle or [])


def test_no_product_module_imports_bench_or_tests() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}" for path in PRODUCT.values()
             for target, line in imports_of(path, module_level_only=False) if target.split(".")[0] in FORBIDDEN]
    assert wrong == []


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_cycle_among_the_product_modules(layer: str) -> None:
    graph = {name: {t for t, _ in imports_of(path, module_level_only=True) if t in PRODUCT and t != name}
             for name, path in PRODUCT.items() if name.split(".")[0] == layer}
    graph = {name: targets & graph.keys() for name, targets in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def is_builders(target: str) -> bool:
    return target == BUILDERS or target.startswith(f"{BUILDERS}.")


def test_dataset_builders_stay_out_of_export_serve_and_the_data_layer() -> None:
    """``export`` and ``serve`` never import :mod:`models.sources` (not even inside a function); ``models.data``
    reaches a builder only lazily (the registry's loader of its kind), never at module level."""
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}" for name, path in PRODUCT.items()
             if name.split(".")[0] in ("export", "serve")
             for target, line in imports_of(path, module_level_only=False) if is_builders(target)]
    wrong += [f"{path.relative_to(ROOT)}:{line} imports {target} at module level" for name, path in PRODUCT.items()
              if name.startswith("models.data.") for target, line in imports_of(path, module_level_only=True)
              if is_builders(target)]
    assert wrong == []
    assert (ROOT / "export" / "__main__.py").is_file() and (ROOT / "serve" / "__main__.py").is_file()
    code = ("import export.__main__, serve.__main__, models.data.registry; import sys; "
            f"loaded = [m for m in sys.modules if m.startswith({BUILDERS!r})]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
