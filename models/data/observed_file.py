"""The protocol file of a run (``observed.npz``; docs/datasets.md), so a later run trains on exactly the same labels and
split. Its bytes depend only on the values, so its sha256 identifies the protocol."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.types import DataError, LabelledImages

__all__ = ["FORMAT", "OBSERVED_FILE", "ProtocolRecord", "image_root", "protocol_file_bytes", "read_protocol_file",
           "relative_paths", "sha256_of"]

OBSERVED_FILE = "observed.npz"
FORMAT = "spml-observed/2"
FORMAT_V1 = "spml-observed/1"
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass
class ProtocolRecord:
    """The content of a protocol file."""

    dataset: str
    fingerprint: str
    classes: list[str]
    train_paths: list[str]
    train_observed: np.ndarray
    val_paths: list[str]
    observed: str
    protocol_seed: int
    val_observed: np.ndarray | None = None  # None: unknown (a version-1 file; written as all-unobserved)

    def arrays(self) -> dict[str, np.ndarray]:
        """The archive members, in file order (version 2)."""
        val_observed = self.val_observed
        if val_observed is None:
            val_observed = np.zeros((len(self.val_paths), len(self.classes)))
        return {
            "format": np.array(FORMAT), "dataset": np.array(self.dataset), "fingerprint": np.array(self.fingerprint),
            "classes": np.array(self.classes, dtype=str), "train_paths": np.array(self.train_paths, dtype=str),
            "train_observed": np.ascontiguousarray(self.train_observed, dtype=np.int8),
            "val_paths": np.array(self.val_paths, dtype=str),
            "val_observed": np.ascontiguousarray(val_observed, dtype=np.int8), "observed": np.array(self.observed),
            "protocol_seed": np.array(self.protocol_seed, dtype=np.int64)}


def protocol_file_bytes(record: ProtocolRecord) -> bytes:
    """The ``.npz`` bytes of ``record``, identical for identical records."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in record.arrays().items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def _check_shape(path: Path, name: str, matrix: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """``matrix`` as int8 -1/0/1 of shape ``(rows, columns)``; anything else -> ``DataError``."""
    if matrix.ndim != 2 or matrix.shape != (rows, columns):
        raise DataError(f"{path}: {name} has shape {matrix.shape}, expected ({rows}, {columns})")
    if not np.isin(matrix, (-1, 0, 1)).all():
        raise DataError(f"{path}: {name} holds values other than -1, 0 and 1")
    return matrix.astype(np.int8)


def read_protocol_file(path: Path) -> ProtocolRecord:
    """Read a protocol file (version 2 or 1); anything else is a one-line ``DataError``."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable protocol file ({exc})") from exc
    expected = set(ProtocolRecord("", "", [], [], np.zeros((0, 0)), [], "", 0).arrays())
    version_1 = expected - {"val_observed"}
    found = str(arrays.get("format", ""))
    if not ((set(arrays) == expected and found == FORMAT) or (set(arrays) == version_1 and found == FORMAT_V1)):
        raise DataError(f"{path}: not an spml protocol file (expected the members {', '.join(sorted(expected))} "
                        f"and format {FORMAT!r}, as written to a run folder's {OBSERVED_FILE})")
    rows, columns = len(arrays["train_paths"]), len(arrays["classes"])
    train_observed = _check_shape(path, "train_observed", arrays["train_observed"], rows, columns)
    val_observed = None
    if "val_observed" in arrays:
        val_observed = _check_shape(path, "val_observed", arrays["val_observed"], len(arrays["val_paths"]), columns)
    return ProtocolRecord(
        dataset=str(arrays["dataset"]), fingerprint=str(arrays["fingerprint"]),
        classes=[str(c) for c in arrays["classes"]], train_paths=[str(p) for p in arrays["train_paths"]],
        train_observed=train_observed, val_paths=[str(p) for p in arrays["val_paths"]],
        observed=str(arrays["observed"]), protocol_seed=int(arrays["protocol_seed"]), val_observed=val_observed)


def image_root(parts: list[LabelledImages]) -> Path:
    """The deepest folder holding every image of ``parts``."""
    folders = {str(p.parent) for part in parts for p in part.paths}
    return Path(os.path.commonpath(sorted(folders))) if folders else Path("/")


def relative_paths(images: LabelledImages, root: Path) -> list[str]:
    """``images``' paths relative to ``root``, ``/``-separated."""
    return [path.relative_to(root).as_posix() for path in images.paths]


def sha256_of(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
