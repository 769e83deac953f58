"""Shared fixtures. Every test session gets its own dataset cache (``SPML_CACHE``) and runs folder
(``SPML_RUNS``), so tests never read or write the user's ``~/.cache/spml`` or ``./runs``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per test worker: torch's and OpenMP's default of one thread per core in each worker oversubscribes
    # the cores, and their spinning threads then run many times slower
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core and one more, since many tests wait on processes they start (a torchrun group,
    a Ray instance, a served app), so one extra worker keeps the cores busy (docs/layout.md)."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) + 1


#: The longest test files (minutes each with three workers on 2 cores; the durations CI prints), in the order they
#: go out: ``--dist loadfile`` hands whole files to the workers in collection order (``--no-loadscope-reorder`` in
#: pyproject.toml), so these start first and no long file starts last while the other workers sit idle. The Ray
#: tests come fourth, not first: beside three CPU-bound files at the start their instance's processes starve and
#: the file takes several times as long as alone.
LONGEST_FILES = ("test_train.py", "test_export_pipeline.py", "test_resume.py", "test_tag_ray.py", "test_lac.py",
                 "test_end_to_end.py", "test_lgconv.py", "test_distributed.py", "test_bench_sections.py", "test_tag.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FILES` first, in its order; the others after them in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("spml-cache")
    old = {k: os.environ.get(k) for k in ("SPML_CACHE", "SPML_RUNS")}
    os.environ["SPML_CACHE"] = str(cache)
    os.environ["SPML_RUNS"] = str(tmp_path_factory.mktemp("spml-runs"))
    yield cache
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def builtin_cache(_isolated_cache: Path) -> Path:
    """The session cache folder, with the tiny built-in dataset generated in it (once)."""
    from models.sources.builtin import ensure_builtin

    ensure_builtin("tiny", seed=0, cache_dir=_isolated_cache, progress=False)
    return _isolated_cache


SQUARE_COLOURS = {"red": (230, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 230), "yellow": (230, 230, 30)}


@pytest.fixture(scope="session")
def squares_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CSV dataset (``labels.csv``) a small network learns within two epochs: 96 train and 48 test images of
    32 px, each with 1 or 2 coloured squares on dark noise, one class per colour (4 classes)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("squares")
    rng = np.random.default_rng(0)
    rows = ["image,labels,split"]
    side, square = 32, 10
    for split, count in (("train", 96), ("test", 48)):
        for i in range(count):
            names = sorted(rng.choice(list(SQUARE_COLOURS), size=int(rng.integers(1, 3)), replace=False))
            pixels = rng.integers(0, 60, size=(side, side, 3), dtype=np.uint8)
            for name in names:
                x, y = rng.integers(0, side - square, size=2)
                pixels[y:y + square, x:x + square] = SQUARE_COLOURS[name]
            Image.fromarray(pixels).save(root / f"{split}{i}.png")
            rows.append(f"{split}{i}.png,{';'.join(names)},{split}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root / "labels.csv"
