"""Model metadata inside loaded ONNX files and the ``model.json`` sidecar (encoding: :mod:`models.onnx_metadata`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx

from models.checkpoint import ModelMeta
from models.files.digest import file_sha256
from models.onnx_metadata import meta_from_props, meta_to_props

SIDECAR_FORMAT = "spml-onnx-export"


def set_onnx_meta(model: onnx.ModelProto, meta: ModelMeta) -> None:
    """Write ``meta`` into ``model.metadata_props`` in place (existing keys replaced, others kept)."""
    props = {p.key: p.value for p in model.metadata_props}
    props.update(meta_to_props(meta))
    onnx.helper.set_model_props(model, props)


def load_onnx_file(path: str | Path) -> onnx.ModelProto:
    """Load an ``.onnx`` file without external data (``FileNotFoundError`` / ``ValueError`` if unreadable)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ValueError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc


def onnx_meta(model: onnx.ModelProto, source: str | Path = "model") -> ModelMeta:
    """The ModelMeta in a loaded model's ``metadata_props`` (``ValueError`` naming ``source`` if absent)."""
    return meta_from_props({p.key: p.value for p in model.metadata_props}, source)


def read_onnx_meta(path: str | Path) -> ModelMeta:
    """Read the ModelMeta stored in an exported ``.onnx`` file (``FileNotFoundError`` / ``ValueError``)."""
    return onnx_meta(load_onnx_file(path), path)


def sidecar_path(onnx_path: str | Path) -> Path:
    """Where the JSON sidecar of ``onnx_path`` lives: same folder and stem, ``.json`` suffix."""
    return Path(onnx_path).with_suffix(".json")


def sidecar_document(onnx_path: Path, meta: ModelMeta, export_info: Mapping[str, Any],
                     verification: Mapping[str, Any], sha256: str | None = None) -> dict[str, Any]:
    """The sidecar dict: format, file name, sha256 (computed unless given), size, meta, export info, verification."""
    onnx_path = Path(onnx_path)
    return {
        "format": SIDECAR_FORMAT,
        "onnx_file": onnx_path.name,
        "sha256": sha256 or file_sha256(onnx_path),
        "size_bytes": onnx_path.stat().st_size,
        "meta": asdict(meta),
        "export": dict(export_info), "verification": dict(verification)}


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """Load a sidecar written by :func:`sidecar_document` + :func:`atomic_write_text` (a plain dict)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))

