"""Run folders: ``runs/<name>/`` with config.json, metrics.jsonl, best.pt, last.pt, summary.json."""

from __future__ import annotations

import os
from pathlib import Path


def default_runs_dir() -> Path:
    """``$SPML_RUNS`` if set (read at call time), else ``./runs``."""
    return Path(os.environ.get("SPML_RUNS", "runs"))


#: The files of a run folder, as the trainer writes them.
BEST = "best.pt"
LAST = "last.pt"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SCORES_FILE = "scores.npz"  # the best checkpoint's val and test logits with their labels (threshold studies)


def list_runs(runs_dir: Path | None = None) -> list[Path]:
    """Run folders under ``runs_dir`` holding a best checkpoint, oldest first."""
    runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    if not runs_dir.is_dir():
        return []
    runs = [p for p in runs_dir.iterdir() if (p / BEST).is_file()]
    return sorted(runs, key=lambda p: (p / BEST).stat().st_mtime)


def latest_run(runs_dir: Path | None = None) -> Path:
    """The run whose best checkpoint was written last; ``FileNotFoundError`` naming ``runs_dir`` if none."""
    runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    runs = list_runs(runs_dir)
    if not runs:
        raise FileNotFoundError(f"no trained run found under {runs_dir.resolve()} (train one with `python -m train`, "
                                "or pass a run folder or checkpoint path)")
    return runs[-1]


def resolve_checkpoint(target: str | Path | None, runs_dir: Path | None = None) -> Path:
    """Turn ``None`` (latest run), a run folder, or a checkpoint file into a checkpoint path."""
    if target is None:
        return latest_run(runs_dir) / BEST
    path = Path(target)
    if path.is_dir():
        if (path / BEST).is_file():
            return path / BEST
        raise FileNotFoundError(f"{path} is a folder without {BEST}; is it a run folder?")
    if path.is_file():
        return path
    candidate = (Path(runs_dir) if runs_dir is not None else default_runs_dir()) / str(target)
    if (candidate / BEST).is_file():
        return candidate / BEST
    raise FileNotFoundError(f"no run folder or checkpoint named {target}")
