"""File digests: the SHA-256 every layer records, and the short BLAKE2b the dataset loaders compare with."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

CHUNK_SIZE = 1 << 20


def _file_digest(path: str | Path, digest: Any, chunk_size: int) -> str:
    with open(path, "rb") as fh:
        while block := fh.read(chunk_size):
            digest.update(block)
    return str(digest.hexdigest())


def file_sha256(path: str | Path, chunk_size: int = CHUNK_SIZE) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    return _file_digest(path, hashlib.sha256(), chunk_size)


def file_blake2b(path: str | Path, digest_size: int) -> str:
    """Hex BLAKE2b of ``digest_size`` bytes of a file's bytes, read in chunks (raises ``OSError`` when unreadable)."""
    return _file_digest(path, hashlib.blake2b(digest_size=digest_size), CHUNK_SIZE)
