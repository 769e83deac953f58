"""The schema of the model metadata inside exported ONNX files: ModelMeta <-> ``metadata_props``, both ways.

Keys written into an exported ONNX model's ``metadata_props``:

- ``spml_meta``: the full :class:`~models.checkpoint.ModelMeta` as JSON (the authoritative copy);
- convenience copies for other tools: ``classes`` (JSON list), ``image_size`` (decimal string),
  ``mean`` / ``std`` (JSON lists, for pixel values scaled to 0..1), ``interpolation`` (``bilinear`` /
  ``bicubic``), ``crop`` (the share kept around the centre, ``1.0`` = the whole image, squashed to a square) and
  ``output`` (``"logits"``).

ONNX Runtime exposes the same map as ``session.get_modelmeta().custom_metadata_map``. Plain string mappings
only: this module needs neither onnx nor onnxruntime.
"""

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
