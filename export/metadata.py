"""Model metadata inside ONNX files (``metadata_props``) and the ``model.json`` sidecar; atomic writes.

Keys written into an exported ONNX model's ``metadata_props``:

- ``spml_meta``: the full :class:`~models.checkpoint.ModelMeta` as JSON (the authoritative copy);
- convenience copies for other tools: ``classes`` (JSON list), ``image_size`` (decimal string),
  ``mean`` / ``std`` (JSON lists, for pixel values scaled to 0..1) and ``output`` (``"logits"``).

ONNX Runtime exposes the same map as ``session.get_modelmeta().custom_metadata_map``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx

from models.checkpoint import ModelMeta

META_KEY = "spml_meta"
SIDECAR_FORMAT = "spml-onnx-export"


def meta_to_props(meta: ModelMeta) -> dict[str, str]:
    """ModelMeta -> the string key/value pairs stored in an ONNX model's ``metadata_props``."""
    return {
        META_KEY: meta.to_json(),
        "classes": json.dumps(list(meta.classes)),
        "image_size": str(int(meta.image_size)),
        "mean": json.dumps([float(v) for v in meta.mean]),
        "std": json.dumps([float(v) for v in meta.std]),
        "output": meta.output,
    }


def meta_from_props(props: Mapping[str, str], source: str | Path = "model") -> ModelMeta:
    """``metadata_props`` mapping (or ORT's ``custom_metadata_map``) -> ModelMeta.

    Raises ``ValueError`` naming ``source`` when the ``spml_meta`` key is missing or not valid JSON.
    """
    text = props.get(META_KEY)
    if text is None:
        raise ValueError(f"{source}: no '{META_KEY}' metadata; was it exported with `python -m export`?")
    try:
        return ModelMeta.from_json(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{source}: invalid '{META_KEY}' metadata ({exc})") from exc


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


def sidecar_document(
    onnx_path: Path,
    meta: ModelMeta,
    export_info: Mapping[str, Any],
    verification: Mapping[str, Any],
    sha256: str | None = None,
) -> dict[str, Any]:
    """Build the sidecar dict: format marker, file name + sha256 + size, meta, export info, verification.

    ``sha256`` may be passed when already known (it must be the file's); otherwise it is computed.
    """
    onnx_path = Path(onnx_path)
    return {
        "format": SIDECAR_FORMAT,
        "onnx_file": onnx_path.name,
        "sha256": sha256 or file_sha256(onnx_path),
        "size_bytes": onnx_path.stat().st_size,
        "meta": asdict(meta),
        "export": dict(export_info),
        "verification": dict(verification),
    }


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """Load a sidecar written by :func:`sidecar_document` + :func:`atomic_write_text` (a plain dict)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def file_sha256(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on normal exit it is renamed onto ``path`` (``os.replace``),
    on an exception it is deleted and ``path`` is left untouched.

    ``suffix`` is the temp file's suffix (e.g. ``".onnx"`` for tools that look at it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; give the usual permissions
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
