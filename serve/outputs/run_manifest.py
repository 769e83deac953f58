"""The manifest of a run file (``tags.jsonl`` -> ``tags.manifest.json``): the model and tag options behind its tags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.files.atomic_writes import atomic_write_text

MANIFEST_FORMAT = "spml-tag-run"
MANIFEST_VERSION = 1


def manifest_path(run_file: str | Path) -> Path:
    """``out/tags.jsonl`` -> ``out/tags.manifest.json``."""
    run_file = Path(run_file)
    return run_file.with_name(f"{run_file.stem}.manifest.json")


def write_manifest(run_file: Path, doc: dict[str, Any]) -> Path:
    """Write the manifest of ``run_file`` (``doc`` plus the format fields) atomically; returns its path."""
    path = manifest_path(run_file)
    body = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "run_file": run_file.name, **doc}
    atomic_write_text(path, json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    return path


def read_manifest(run_file: str | Path) -> dict[str, Any] | None:
    """The manifest of ``run_file``, or ``None`` when there is none for it."""
    path = manifest_path(run_file)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or doc.get("run_file") != Path(run_file).name:
        return None
    return doc
