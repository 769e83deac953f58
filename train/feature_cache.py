"""Backbone features computed once per image and kept on disk (``$SPML_CACHE/features``) for training heads on fixed
features; a file's name digests everything they depend on (:func:`feature_key`), so any change computes new ones.
Written atomically; deleting the folder is always safe."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.data.cache_folders import cache_root
from models.files.atomic_writes import atomic_path
from train.distributed import broadcast_object, current_world
from train.selection import Rows

FEATURE_FORMAT = 1


def features_folder() -> Path:
    """Where feature files go: ``$SPML_CACHE/features``."""
    return cache_root() / "features"


def weights_digest(module: nn.Module) -> str:
    """sha256 of a module's state (names, dtypes, shapes and values of every parameter and buffer)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def images_digest(paths: list[Path]) -> str:
    """sha256 of the image list: every path in order with its size and modification time."""
    h = hashlib.sha256()
    for path in paths:
        try:
            st = os.stat(path)
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}|missing\n".encode())
    return h.hexdigest()


def feature_key(paths: list[Path], arch: str, backbone_digest: str, preprocessing: dict[str, Any],
                precision: str) -> dict[str, Any]:
    """The description a cache entry is named after (and stored with)."""
    return {"format": FEATURE_FORMAT, "images": images_digest(paths), "count": len(paths), "arch": arch,
            "backbone": backbone_digest, "preprocessing": preprocessing, "precision": precision}


def split_feature_key(arch: str, model: nn.Module, transform: Any, precision: str) -> Callable[[Any], dict[str, Any]]:
    """``images -> key`` of a split's features for ``model``'s backbone, preprocessing and ``precision``."""
    backbone = weights_digest(model.backbone)
    preprocessing = {"image_size": transform.image_size, "mean": list(transform.mean), "std": list(transform.std),
                     "interpolation": transform.interpolation, "crop": transform.crop}

    def key(images: Any) -> dict[str, Any]:
        return feature_key(list(images.paths), arch, backbone, preprocessing, precision)

    return key


class FeatureCache:
    """A folder of feature files; under torchrun rank 0 reads and writes it for every rank."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else features_folder()

    def path(self, key: dict[str, Any]) -> Path:
        """The file of ``key``, named by its digest."""
        return self.folder / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".pt")

    def load(self, key: dict[str, Any]) -> Rows | None:
        """The rows stored under ``key``, or None (no file, another key inside, or an unreadable file)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # truncated or foreign file: compute again
            return None
        if not isinstance(payload, dict) or payload.get("key") != json.dumps(key, sort_keys=True):
            return None
        return Rows(payload["features"], payload["present"])

    def save(self, key: dict[str, Any], rows: Rows) -> Path:
        """Store ``rows`` under ``key`` (atomically); returns the file."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save({"key": json.dumps(key, sort_keys=True), "features": rows.values.contiguous(),
                        "present": rows.present}, tmp)
        return path

    def get(self, key: dict[str, Any], compute: Callable[[], Rows]) -> tuple[Rows, bool]:
        """The rows of ``key``, cached or computed and stored; and whether they came from the cache."""
        main = current_world().is_main
        cached = broadcast_object(self.load(key) if main else None)
        if cached is not None:
            return cached, True
        rows = compute()
        if main:
            self.save(key, rows)
        return rows, False
