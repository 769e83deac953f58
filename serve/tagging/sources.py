"""What ``serve tag SOURCE`` reads: a folder, a list file (a path or URI per line) or WebDataset ``.tar`` shards;
:class:`Partition` (``--shard K/N``) keeps a deterministic subset by CRC-32."""

from __future__ import annotations

import glob
import os
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from models.files.folder_walk import walk_folder
from models.files.image_extensions import IMAGE_EXTENSIONS

_IMAGE_EXTS = {e.lstrip(".") for e in IMAGE_EXTENSIONS}


@dataclass(frozen=True)
class Item:
    """One image to tag: its ``key``, and its ``location`` or ``data``; ``error`` when known unusable."""

    key: str
    location: str = ""
    data: bytes | None = None
    error: str | None = None


@dataclass(frozen=True)
class Partition:
    """``--shard K/N``: part ``index`` (1-based) of ``count``; ``Partition(1, 1)`` keeps everything."""

    index: int = 1
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Partition:
        """``"K/N"`` -> Partition; raises ``ValueError`` unless 1 <= K <= N."""
        k, sep, n = text.partition("/")
        try:
            part = cls(int(k), int(n)) if sep else None
        except ValueError:
            part = None
        if part is None or not 1 <= part.index <= part.count:
            raise ValueError(f"--shard must be K/N with 1 <= K <= N, got {text!r}")
        return part

    def keeps(self, name: str) -> bool:
        """True when ``name`` (an item key or a shard file name) belongs to this part."""
        return self.count == 1 or zlib.crc32(name.encode("utf-8")) % self.count == self.index - 1


def expand_shards(pattern: str) -> list[str]:
    """Shard files of a ``.tar`` path, glob or brace pattern (``a/{000..009}.tar``), sorted; missing ones dropped."""
    from braceexpand import braceexpand  # a webdataset dependency

    names: set[str] = set()
    for part in braceexpand(pattern):
        names.update(glob.glob(part) if glob.has_magic(part) else [part] if os.path.isfile(part) else [])
    return sorted(n for n in names if n.lower().endswith(".tar"))


def source_kind(source: str) -> str:
    """``folder``, ``shards`` or ``list`` for a SOURCE argument; raises ``FileNotFoundError`` when it is none."""
    if os.path.isdir(source):
        return "folder"
    if source.lower().endswith(".tar") or glob.has_magic(source) or "{" in source:
        if expand_shards(source):
            return "shards"
        raise FileNotFoundError(f"no .tar shards match {source}")
    if os.path.isfile(source):
        return "list"
    raise FileNotFoundError(f"folder not found: {source} (SOURCE is a folder, a list file or .tar shards)")


@dataclass
class Source:
    """A parsed SOURCE with its :class:`Partition`; see the module docstring for the three kinds."""

    spec: str
    kind: str
    partition: Partition = field(default_factory=Partition)
    scan_errors: list[tuple[str, str]] = field(default_factory=list)  # folders that could not be listed
    ignored: int = 0  # files without an image extension (folders)

    @classmethod
    def open(cls, spec: str | Path, partition: Partition | None = None) -> Source:
        """Classify ``spec`` (see :func:`source_kind`); raises ``FileNotFoundError``."""
        spec = str(spec)
        return cls(spec, source_kind(spec), partition or Partition())

    @property
    def folder(self) -> Path:
        """The folder of a folder source (keys are relative to it)."""
        return Path(self.spec)

    def folder_images(self) -> list[Path]:
        """A folder source's images in this partition, sorted (``scan_errors``, ``ignored`` counted)."""
        listing = walk_folder(self.spec)
        self.scan_errors += [(listing.relative(where) + "/", f"folder cannot be listed ({reason})")
                             for where, reason in listing.unreadable]
        self.ignored = len(listing.ignored())
        return [p for p in listing.images() if self.partition.keeps(p.relative_to(self.spec).as_posix())]

    def shard_files(self) -> list[str]:
        """A shard source's ``.tar`` files in this partition."""
        return [s for s in expand_shards(self.spec) if self.partition.keeps(os.path.basename(s))]

    def listed_items(self) -> Iterator[Item]:
        """Items of the list file in this partition, in file order (each key once)."""
        base = Path(self.spec).parent
        seen: set[str] = set()
        with open(self.spec, encoding="utf-8") as fh:
            for line in fh:
                key = line.strip()
                if not key or key.startswith("#") or key in seen or not self.partition.keeps(key):
                    continue
                seen.add(key)
                yield Item(key, key if "://" in key or os.path.isabs(key) else str(base / key))

    def locations(self) -> Iterator[Item]:
        """The cheap units an engine distributes: items without bytes, or one item per shard file."""
        if self.kind == "folder":
            yield from (Item(p.relative_to(self.spec).as_posix(), str(p)) for p in self.folder_images())
        elif self.kind == "list":
            yield from self.listed_items()
        else:
            yield from (Item(os.path.basename(s), s) for s in self.shard_files())

    def items(self) -> Iterator[Item]:
        """Every image item of this partition, streaming (shards are read one sample at a time)."""
        for unit in self.locations():
            yield from (shard_items(unit.location) if self.kind == "shards" else [unit])


def shard_items(shard: str) -> Iterator[Item]:
    """The samples of one ``.tar`` shard as items with their bytes (an ``error`` when unusable)."""
    from webdataset import tariterators

    name = os.path.basename(shard)
    failures: list[Exception] = []

    def keep_going(exc: Exception) -> bool:
        failures.append(exc)
        return False  # stop this shard: the rest of a damaged tar cannot be trusted

    for sample in tariterators.tarfile_samples([{"url": shard}], handler=keep_going):
        key = f"{name}/{sample['__key__']}"
        ext = next((k for k in sample if not k.startswith("__") and k.rsplit(".", 1)[-1] in _IMAGE_EXTS), None)
        if ext is None:
            members = ", ".join(k for k in sample if not k.startswith("__")) or "none"
            yield Item(key, shard, error=f"sample has no image member (members: {members})")
        else:
            yield Item(f"{key}.{ext}", shard, data=bytes(sample[ext]))
    for exc in failures:
        yield Item(f"{name}/", shard, error=f"shard cannot be read: {type(exc).__name__}: {exc}")


def read_location(location: str) -> bytes:
    """The bytes at a list file's URI (``file://``, ``http(s)://``, else fsspec); raises ``OSError``."""
    if location.startswith(("http://", "https://", "file://")):
        with urllib.request.urlopen(location, timeout=60) as response:
            return response.read()
    try:
        import fsspec
    except ImportError:
        raise OSError(f"reading {location.split('://')[0]}:// URIs needs fsspec (pip install fsspec)") from None
    with fsspec.open(location, "rb") as fh:
        return fh.read()
