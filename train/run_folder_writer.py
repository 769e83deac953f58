"""The files of a run folder - config.json, metrics.jsonl, summary.json, scores.npz and the protocol file - each written
atomically (``models.files.atomic_writes``): a kill leaves a file's previous content or its new one, never half of it.

metrics.jsonl grows by one line per epoch; each append rewrites the (small) file into a temporary file and renames
it into place, so it is kill-safe like the others. Only rank 0 writes (:class:`RunFolderWriter` does nothing elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from models.data.observed_file import OBSERVED_FILE, sha256_of
from models.files.atomic_writes import atomic_path, atomic_write_text
from models.files.run_folder import CONFIG_FILE, METRICS_FILE, SCORES_FILE, SUMMARY_FILE


class RunFolderWriter:
    """Writes a run folder's text files; a no-op unless ``writer`` (rank 0)."""

    def __init__(self, run_dir: Path, writer: bool) -> None:
        self.run_dir = run_dir
        self.writer = writer

    def write_config(self, config: dict[str, Any]) -> None:
        """config.json."""
        self._write_json(CONFIG_FILE, config)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json."""
        self._write_json(SUMMARY_FILE, summary)

    def write_scores(self, arrays: dict[str, np.ndarray]) -> None:
        """scores.npz: the best checkpoint's logits and labels per split (``val_logits``, ``val_labels``, ...)."""
        if self.writer:
            with atomic_path(self.run_dir / SCORES_FILE, suffix=".npz") as tmp:
                np.savez_compressed(tmp, **arrays)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Add one epoch's line to metrics.jsonl."""
        if self.writer:
            atomic_write_text(self.run_dir / METRICS_FILE, self._metrics_text() + json.dumps(record) + "\n")

    def keep_metrics_before(self, epoch: int) -> None:
        """Drop the metrics lines of ``epoch`` and later (a resumed run trains them again)."""
        if not self.writer or not (self.run_dir / METRICS_FILE).exists():
            return
        lines = [line for line in self._metrics_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line).get("epoch", 0) < epoch]
        atomic_write_text(self.run_dir / METRICS_FILE, "".join(line + "\n" for line in kept))

    def write_protocol(self, content: bytes, resume: bool) -> None:
        """The protocol file (observed labels and split); a resumed run's existing file must hold the same
        protocol (``ValueError`` otherwise)."""
        if not self.writer:
            return
        path = self.run_dir / OBSERVED_FILE
        if resume and path.is_file():
            if sha256_of(path.read_bytes()) != sha256_of(content):
                raise ValueError(f"{path}: the observed labels or the split changed since this run started")
            return
        with atomic_path(path) as tmp:
            tmp.write_bytes(content)

    def _metrics_text(self) -> str:
        path = self.run_dir / METRICS_FILE
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def _write_json(self, name: str, content: dict[str, Any]) -> None:
        if self.writer:
            atomic_write_text(self.run_dir / name, json.dumps(content, indent=2) + "\n")
