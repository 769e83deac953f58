"""Which model file a ``--model`` names, and the model files a run folder holds."""

from __future__ import annotations

from pathlib import Path

from models.files.run_folder import BEST, LAST, default_runs_dir, latest_run
from models.runtimes import ModelSpecError, runtime_named, supported_suffixes


def models_in_folder(folder: Path) -> list[Path]:
    """A run folder's loadable model files, ``best.pt`` first, then exports (``last.pt`` excluded)."""
    suffixes = set(supported_suffixes())
    found: list[Path] = []
    if (folder / BEST).is_file():
        found.append(folder / BEST)
    for sub in (folder / "export", folder):
        if sub.is_dir():
            for path in sorted(sub.iterdir()):
                if path.is_file() and path.suffix.lower() in suffixes and path.name not in (BEST, LAST):
                    found.append(path)
    return found


def resolve_model_path(target: str | Path | None, backend: str | None = None, runs_dir: Path | None = None) -> Path:
    """A model file from ``target``: a model file, a run folder or name under ``runs_dir``, or ``None`` for the latest
    run (its ``best.pt``, or the export ``backend`` reads). Raises :class:`ModelSpecError` when nothing fits."""
    runs = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    if target is None:
        try:
            folder = latest_run(runs)
        except FileNotFoundError as exc:
            raise ModelSpecError(str(exc)) from None
    else:
        path = Path(target).expanduser()
        if path.is_file():
            return path
        if path.is_dir():
            folder = path
        elif (runs / str(target)).is_dir():
            folder = runs / str(target)
        else:
            raise ModelSpecError(f"model not found: {target} (not a file, a run folder, or a run under {runs})")
    candidates = models_in_folder(folder)
    if backend is not None:
        candidates = [p for p in candidates if p.suffix.lower() in runtime_named(backend).suffixes]
    if not candidates:
        what = f" that backend {backend} reads" if backend else ""
        raise ModelSpecError(f"no model file{what} in {folder} (expected best.pt or export/model.onnx)")
    return candidates[0]
