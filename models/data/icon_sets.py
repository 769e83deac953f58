"""Icon sets from the npm registry, their keyword tags as labels: ``--data icons:DIR``.

Icon sets on npm ship every icon as an SVG with the search keywords their designers and contributors gave it
(``cat``: ``pet``, ``animal``, ``kitten``): a real, human-tagged multi-label set of drawings. Two layouts are read
(:data:`LAYOUTS`, detected from the files in ``DIR``, the unpacked package):

* Tabler (``@tabler/icons``): ``icons.json`` (``{name: {"tags": [...], "styles": {"outline": ...}}}``), the outline
  style's ``icons/outline/<name>.svg``;
* Lucide (``lucide-static``): ``tags.json`` (``{name: [...]}``), ``icons/<name>.svg``.

Offline, from the registry: ``npm pack @tabler/icons && tar xzf tabler-icons-*.tgz`` gives ``package/``:
``--data icons:package``.

**The cleaning rule** (module constants and the layout's ``min_count``, all in the cache digest):

1. A keyword is NFKC-normalised, lower-cased and stripped, runs of spaces and underscores as ``-``.
2. Synonyms are one label: keywords are taken by how many icons carry them (most first, then by name), and a
   keyword whose icons overlap those of an earlier kept keyword by a Jaccard index of at least
   :data:`SYNONYM_JACCARD` is merged into it (Tabler: ``off`` into ``disabled``, ``logo`` into ``brand``).
3. A label on at least ``min-count`` icons is a class (sorted by name); an icon with none is left out.
4. Identical rasters (one drawing under two names) are ONE image, with the union of the labels.

**Splits.** Grouped, 60/20/20: an icon's group is its name without trailing ``-off`` / ``-<number>`` parts
(``a-b``, ``a-b-2`` and ``a-b-off`` are one group, so variants of one drawing never straddle two splits), groups
filled by a hash of their name (:func:`models.data.drawing_cache.grouped_splits`). Every split carries the full
labels; the package's protocol draws one positive per training image.

**Cache.** ``<cache>/icons/<digest>/``: rasters (:mod:`models.data.drawings`, 256 px on white) and ``manifest.json``,
as the other drawing sets. ``python -m models.data.icon_sets DIR`` builds it and prints the rule's counts.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from models.data.csv_format import emit_note
from models.data.drawing_cache import (
    MANIFEST_FORMAT,
    cache_parent,
    cached_manifest,
    class_lines,
    command_line_parser,
    grouped_splits,
    labelled,
    pixels_digest,
    view_splits,
)
from models.data.drawings import RASTER_SIZE, cairosvg_svg2png, raster_of_svg
from models.data.spec_options import split_spec_options
from models.data.types import DataError, DatasetSplits
from models.files.atomic_writes import atomic_path
from models.registry import Row, Table

__all__ = ["LAYOUTS", "SYNONYM_JACCARD", "IconLayout", "ensure_icon_set", "icon_group", "load_icon_set",
           "load_icon_set_spec", "merge_synonyms", "normalise_keyword"]

RULE_VERSION = 1
#: A keyword merges into an earlier kept one when their icon sets overlap at least this much (Jaccard index).
SYNONYM_JACCARD = 0.6
SPLIT_FRACTIONS = (("train", 0.6), ("val", 0.2), ("test", 0.2))
_VARIANT_SUFFIX = re.compile(r"(-off|-\d+)+$")
_SPACES = re.compile(r"[\s_]+")


@dataclass(frozen=True)
class IconLayout:
    """How one icon set lays out its catalogue: the catalogue file, its reader (catalogue JSON -> keywords per icon
    name), where an icon's SVG is, and the least number of icons a label needs to be a class by default."""

    catalogue: str
    keywords: Callable[[Any], dict[str, list[str]]]
    svg: str  # relative path with {name}
    min_count: int
    package: str  # the npm package


def _tabler_keywords(catalogue: Any) -> dict[str, list[str]]:
    return {str(name): [str(t) for t in entry.get("tags", [])] for name, entry in catalogue.items()
            if "outline" in entry.get("styles", {"outline": 1})}


def _lucide_keywords(catalogue: Any) -> dict[str, list[str]]:
    return {str(name): [str(t) for t in tags] for name, tags in catalogue.items()}


#: The layouts read, detected in this order by their catalogue file.
LAYOUTS: Table[IconLayout] = Table("icon set layout", [
    Row("tabler", "@tabler/icons: icons.json, icons/outline/<name>.svg",
        IconLayout("icons.json", _tabler_keywords, "icons/outline/{name}.svg", 100, "@tabler/icons")),
    Row("lucide", "lucide-static: tags.json, icons/<name>.svg",
        IconLayout("tags.json", _lucide_keywords, "icons/{name}.svg", 20, "lucide-static")),
])


def _layout_name(layout: IconLayout) -> str:
    return next(name for name, row in LAYOUTS.items() if row is layout)


def normalise_keyword(text: str) -> str:
    """Rule 1: NFKC, lower case, stripped, runs of spaces and underscores as ``-``."""
    return _SPACES.sub("-", unicodedata.normalize("NFKC", text).strip().lower())


def icon_group(name: str) -> str:
    """An icon's split group: its name without trailing ``-off`` / ``-<number>`` parts (``a-b-2-off`` -> ``a-b``)."""
    return _VARIANT_SUFFIX.sub("", name) or name


def merge_synonyms(keywords: dict[str, set[str]], least: int) -> dict[str, str]:
    """Rule 2 over the keywords on at least ``least`` icons: keyword -> the label it merges into (itself when
    kept)."""
    icons: dict[str, set[str]] = {}
    for name, words in keywords.items():
        for word in words:
            icons.setdefault(word, set()).add(name)
    order = sorted((w for w, s in icons.items() if len(s) >= least), key=lambda w: (-len(icons[w]), w))
    kept: list[str] = []
    into: dict[str, str] = {}
    for word in order:
        target = next((k for k in kept if len(icons[k] & icons[word]) / len(icons[k] | icons[word])
                       >= SYNONYM_JACCARD), None)
        into[word] = target or word
        if target is None:
            kept.append(word)
    return into


def resolve_layout(root: Path | str) -> tuple[Path, IconLayout]:
    """The package folder (``DIR`` or its ``package/``) and its layout; a :class:`DataError` saying how to get one."""
    path = Path(str(root).strip()).expanduser().absolute()
    if (path / "package").is_dir():
        path = path / "package"
    for layout in LAYOUTS.values():
        if (path / layout.catalogue).is_file():
            return path, layout
    known = "; ".join(f"{row.name}: {row.help}" for row in LAYOUTS.rows())
    raise DataError(f"icons: {path}: no icon catalogue here ({known}). Get one from the npm registry, e.g. "
                    "`npm pack @tabler/icons && tar xzf tabler-icons-*.tgz`, then --data icons:package")


def rule_description(layout: IconLayout, min_count: int) -> dict[str, Any]:
    """The rule and raster settings as JSON data (the cache digest covers them)."""
    return {"rule_version": RULE_VERSION, "layout": layout.catalogue, "synonym_jaccard": SYNONYM_JACCARD,
            "min_count": int(min_count), "splits": [list(p) for p in SPLIT_FRACTIONS], "raster_size": RASTER_SIZE}


def _raster_name(name: str) -> str:
    identity = hashlib.blake2b(name.encode(), digest_size=6).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[:60]}-{identity}.png"


def _build_manifest(root: Path, layout: IconLayout, folder: Path, digest: str, min_count: int,
                    progress: bool | None) -> dict[str, Any]:
    """Read the catalogue, label by the rule, rasterise (resumable) and return the manifest."""
    try:
        raw = json.loads((root / layout.catalogue).read_text(encoding="utf-8"))
        keywords = {name: {w for w in map(normalise_keyword, words) if w}
                    for name, words in sorted(layout.keywords(raw).items())}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise DataError(f"icons: {root / layout.catalogue}: not a readable {layout.package} catalogue ({exc})") from exc
    into = merge_synonyms(keywords, max(1, min_count // 2))
    labels = {name: sorted({into.get(w, w) for w in words}) for name, words in keywords.items()}
    counter = Counter(label for words in labels.values() for label in words)
    classes = sorted(label for label, n in counter.items() if n >= min_count)
    kept = set(classes)
    left_out: list[dict[str, str]] = []
    images_dir = folder / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    svg2png = None
    merged: dict[str, dict[str, Any]] = {}
    for name in tqdm(sorted(labels), desc="icons: rasterising (once)", unit="icon", file=sys.stderr,
                     disable=None if progress is None else not progress):
        own = [label for label in labels[name] if label in kept]
        if not own:
            left_out.append({"icon": name, "reason": "no frequent label"})
            continue
        raster = images_dir / _raster_name(name)
        if not raster.is_file():
            try:
                svg2png = svg2png or cairosvg_svg2png("icons")
                image = raster_of_svg(svg2png, root / layout.svg.format(name=name))
            except DataError:
                raise
            except Exception as exc:  # cairosvg and PIL raise many types on bad files
                left_out.append({"icon": name, "reason": "not rasterised", "detail": f"{type(exc).__name__}: {exc}"})
                continue
            with atomic_path(raster, suffix=".png") as tmp:
                image.save(tmp, format="PNG")
        key = pixels_digest(raster)
        if key in merged:
            merged[key]["labels"] = sorted(set(merged[key]["labels"]) | set(own))
            left_out.append({"icon": name, "reason": "merged duplicate", "detail": merged[key]["icon"]})
            continue
        merged[key] = {"icon": name, "file": f"images/{raster.name}", "labels": own}
    images = list(merged.values())
    for image, split in zip(images, grouped_splits([icon_group(i["icon"]) for i in images], "icons-split",
                                                   SPLIT_FRACTIONS), strict=True):
        image["split"] = split
    reasons = Counter(entry["reason"] for entry in left_out)
    return {"format": MANIFEST_FORMAT, "digest": digest, "source": str(root),
            "rule": rule_description(layout, min_count),
            "counts": {"icons": len(keywords), "images": len(images), "classes": len(classes),
                       "left_out": dict(sorted(reasons.items()))},
            "classes": classes, "merged_keywords": {w: t for w, t in sorted(into.items()) if w != t},
            "images": images, "left_out": left_out}


def ensure_icon_set(root: Path | str, min_count: int | None = None, cache_dir: Path | None = None,
                    progress: bool | None = None) -> tuple[Path, dict[str, Any]]:
    """``(cache folder, manifest)`` of the cleaned icon set in ``root``, built first when needed (``min_count``
    None: the layout's default)."""
    source, layout = resolve_layout(root)
    least = layout.min_count if min_count is None else int(min_count)
    if least < 1:
        raise DataError(f"icons: min-count must be a positive integer, got {min_count!r}")
    catalogue = source / layout.catalogue
    stat = catalogue.stat()
    payload = {"rule": rule_description(layout, least), "root": str(source),
               "catalogue": [stat.st_size, stat.st_mtime_ns]}
    digest = hashlib.blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=8).hexdigest()
    return cached_manifest("icons", source, cache_parent("icons", cache_dir), digest,
                           lambda folder: _build_manifest(source, layout, folder, digest, least, progress))


def load_icon_set(root: Path | str, min_count: int | None = None, cache_dir: Path | None = None,
                  progress: bool | None = None) -> DatasetSplits:
    """The cleaned icon set in ``root`` (module docstring) as :class:`DatasetSplits` named ``icons-<layout>``, every
    split with its full labels."""
    folder, manifest = ensure_icon_set(root, min_count, cache_dir, progress)
    classes = list(manifest["classes"])
    parts = {split: labelled([(folder / i["file"], i["labels"]) for i in manifest["images"] if i["split"] == split],
                             classes) for split, _ in SPLIT_FRACTIONS}
    layout = next(lay for lay in LAYOUTS.values() if lay.catalogue == manifest["rule"]["layout"])
    splits = view_splits("icons", manifest["source"], "labels", "labels", manifest["rule"]["min_count"],
                         layout.min_count, classes, parts)
    splits.name = f"icons-{_layout_name(layout)}"
    total = sum(len(p) for p in parts.values())
    labels = sum(int(p.labels.sum()) for p in parts.values())
    emit_note(splits.notes, f"{splits.name}: {total:,} icons (" + ", ".join(f"{s} {len(p):,}" for s, p in parts.items())
              + f"), {len(classes)} classes, {labels / max(1, total):.2f} labels per image")
    return splits


def _parse(argument: str) -> tuple[str, int | None]:
    """``DIR[?min-count=N]`` -> (DIR, N or None)."""
    path, options = split_spec_options(argument, ("min-count",), "icons")
    text = options.get("min-count", "")
    if text and (not text.isdigit() or int(text) < 1):
        raise DataError(f"icons:{argument}: min-count must be a positive integer, got {text!r}")
    return path.strip(), int(text) if text else None


def load_icon_set_spec(argument: str) -> DatasetSplits:
    """``icons:DIR[?min-count=N]`` (module docstring)."""
    path, min_count = _parse(argument)
    if not path:
        raise DataError("icons: give the unpacked npm package: --data icons:DIR (e.g. `npm pack @tabler/icons && "
                        "tar xzf tabler-icons-*.tgz`, then --data icons:package)")
    return load_icon_set(path, min_count)


def icon_set_dataset_name(argument: str) -> str:
    """``icons-<layout>`` without loading (``icons`` when the folder is not an icon set)."""
    try:
        _, layout = resolve_layout(_parse(argument)[0])
    except DataError:
        return "icons"
    return f"icons-{_layout_name(layout)}"


def main(argv: list[str] | None = None) -> int:
    """Build the cache if needed and print the counts and classes; exit status 2 on a data error."""
    parser = command_line_parser("python -m models.data.icon_sets", "An npm icon set (Tabler, Lucide) as a "
                                 "multi-label dataset: label its icons by the rule, rasterise them once, print the "
                                 "counts.", "the unpacked npm package", 0, "keyword", "also print the merged keywords")
    args = parser.parse_args(argv)
    try:
        started = time.perf_counter()
        folder, manifest = ensure_icon_set(args.root or ".", args.min_count or None, args.cache, not args.quiet)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    images = manifest["images"]
    by_split = Counter(i["split"] for i in images)
    print(f"ready in {time.perf_counter() - started:.1f} s\ncache: {folder}\nicons: {manifest['counts']['icons']:,}; "
          f"left out: {manifest['counts']['left_out']}\nimages: {len(images):,} (train {by_split['train']}, val "
          f"{by_split['val']}, test {by_split['test']}); classes: {len(manifest['classes'])} (min count "
          f"{manifest['rule']['min_count']}); labels per image: "
          f"{sum(len(i['labels']) for i in images) / max(1, len(images)):.2f}")
    if args.rule:
        print("merged: " + ", ".join(f"{w}->{t}" for w, t in manifest["merged_keywords"].items()))
    print("\n".join(class_lines(manifest, 18)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
