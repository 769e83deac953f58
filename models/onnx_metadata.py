"""The model metadata inside exported ONNX files: ``spml_meta`` (the full :class:`~models.checkpoint.ModelMeta` as JSON)
and copies for other tools. Plain string maps: needs neither onnx nor onnxruntime."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from models.checkpoint import ModelMeta

META_KEY = "spml_meta"


def meta_to_props(meta: ModelMeta) -> dict[str, str]:
    """ModelMeta -> the string key/value pairs stored in an ONNX model's ``metadata_props``."""
    return {
        META_KEY: meta.to_json(),
        "classes": json.dumps(list(meta.classes)),
        "image_size": str(int(meta.image_size)),
        "mean": json.dumps([float(v) for v in meta.mean]),
        "std": json.dumps([float(v) for v in meta.std]),
        "interpolation": meta.interpolation,
        "crop": str(float(meta.crop)),
        "output": meta.output}


def meta_from_props(props: Mapping[str, str], source: str | Path = "model") -> ModelMeta:
    """``metadata_props`` -> ModelMeta; ``ValueError`` naming ``source`` without valid ``spml_meta``."""
    text = props.get(META_KEY)
    if text is None:
        raise ValueError(f"{source}: no '{META_KEY}' metadata; was it exported with `python -m export`?")
    try:
        return ModelMeta.from_json(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{source}: invalid '{META_KEY}' metadata ({exc})") from exc
