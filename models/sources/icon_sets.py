"""Icon sets from the npm registry (:data:`LAYOUTS`), their keyword tags as labels: ``--data icons:DIR[?min-count=N]``
(docs/datasets.md, "icons")."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.data.csv_format import emit_note
from models.data.drawing_cache import MANIFEST_FORMAT, split_parts, view_splits
from models.data.spec_options import split_spec_options
from models.data.types import DataError, DatasetSplits
from models.registry import Row, Table
from models.sources import drawing_sets as ds
from models.sources.drawings import RASTER_SIZE

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
    """How an icon set lays out its catalogue: file, reader, SVG location and default class size."""

    catalogue: str
    keywords: Callable[[Any], dict[str, list[str]]]
    svg: str  # relative path with {name}
    min_count: int
    package: str  # the npm package
    parse: Callable[[str], Any] = json.loads  # the catalogue's text -> what ``keywords`` reads


def _tabler_keywords(catalogue: Any) -> dict[str, list[str]]:
    return {str(name): [str(t) for t in entry.get("tags", [])] for name, entry in catalogue.items()
            if "outline" in entry.get("styles", {"outline": 1})}


def _lucide_keywords(catalogue: Any) -> dict[str, list[str]]:
    return {str(name): [str(t) for t in tags] for name, tags in catalogue.items()}


_PHOSPHOR_ENTRY = re.compile(r'\bname: "([^"]+)"')
_PHOSPHOR_TAGS = re.compile(r"tags: \[(.*?)\]", re.S)


def _phosphor_catalogue(text: str) -> dict[str, list[str]]:
    """Icon name -> tags from @phosphor-icons/core's ``dist/index.mjs`` (a JavaScript array of entries); the
    ``*new*``-style markers are not keywords."""
    parts = _PHOSPHOR_ENTRY.split(text)[1:]  # name, its entry's text, name, ...
    catalogue = {}
    for name, entry in zip(parts[::2], parts[1::2], strict=True):
        tags = _PHOSPHOR_TAGS.search(entry)
        words = re.findall(r'"([^"]*)"', tags.group(1)) if tags else []
        catalogue[name] = [w for w in words if not w.startswith("*")]
    if not catalogue:
        raise ValueError("no icon entries found")
    return catalogue


#: The layouts read, detected in this order by their catalogue file.
LAYOUTS: Table[IconLayout] = Table("icon set layout", [
    Row("tabler", "@tabler/icons: icons.json, icons/outline/<name>.svg",
        IconLayout("icons.json", _tabler_keywords, "icons/outline/{name}.svg", 100, "@tabler/icons")),
    Row("lucide", "lucide-static: tags.json, icons/<name>.svg",
        IconLayout("tags.json", _lucide_keywords, "icons/{name}.svg", 20, "lucide-static")),
    Row("phosphor", "@phosphor-icons/core: dist/index.mjs, assets/regular/<name>.svg",
        IconLayout("dist/index.mjs", _lucide_keywords, "assets/regular/{name}.svg", 10, "@phosphor-icons/core",
                   _phosphor_catalogue)),
])


def _layout_name(layout: IconLayout) -> str:
    return next(name for name, row in LAYOUTS.items() if row is layout)


def normalise_keyword(text: str) -> str:
    """Rule 1: NFKC, lower case, stripped, runs of spaces and underscores as ``-``."""
    return ds.fold(text, _SPACES, "-")


def icon_group(name: str) -> str:
    """An icon's split group: its name without trailing ``-off`` / ``-<number>`` parts (``a-b-2-off`` -> ``a-b``)."""
    return _VARIANT_SUFFIX.sub("", name) or name


def merge_synonyms(keywords: dict[str, set[str]], least: int) -> dict[str, str]:
    """Rule 2 over the keywords on at least ``least`` icons: keyword -> the label it merges into."""
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
    path = ds.source_folder(root, Path("."), "package")
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


def _build_manifest(root: Path, layout: IconLayout, folder: Path, digest: str, min_count: int,
                    progress: bool | None) -> dict[str, Any]:
    """Read the catalogue, label by the rule, rasterise (resumable) and return the manifest."""
    try:
        raw = layout.parse((root / layout.catalogue).read_text(encoding="utf-8"))
        keywords = {name: {w for w in map(normalise_keyword, words) if w}
                    for name, words in sorted(layout.keywords(raw).items())}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise DataError(f"icons: {root / layout.catalogue}: not a readable {layout.package} catalogue ({exc})") from exc
    into = merge_synonyms(keywords, max(1, min_count // 2))
    labels = {name: sorted({into.get(w, w) for w in words}) for name, words in keywords.items()}
    counter = Counter(label for words in labels.values() for label in words)
    classes, _ = ds.frequent(counter, min_count)
    kept = set(classes)
    left_out: list[dict[str, str]] = []
    images_dir = folder / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    merged: dict[str, dict[str, Any]] = {}
    for name in ds.progress_bar(sorted(labels), "icons: rasterising (once)", "icon", progress):
        own = [label for label in labels[name] if label in kept]
        if not own:
            left_out.append({"icon": name, "reason": "no frequent label"})
            continue
        raster = images_dir / ds.raster_name(name, name)
        reason = "" if raster.is_file() else ds.write_raster(raster, root / layout.svg.format(name=name), "icons")
        if reason:
            left_out.append({"icon": name, "reason": "not rasterised", "detail": reason})
            continue
        key = ds.pixels_digest(raster)
        if key in merged:
            merged[key]["labels"] = sorted(set(merged[key]["labels"]) | set(own))
            left_out.append({"icon": name, "reason": "merged duplicate", "detail": merged[key]["icon"]})
            continue
        merged[key] = {"icon": name, "file": f"images/{raster.name}", "labels": own}
    images = list(merged.values())
    for image, split in zip(images, ds.grouped_splits([icon_group(i["icon"]) for i in images], "icons-split",
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
    """``(cache folder, manifest)`` of the cleaned icon set in ``root``, built first when needed."""
    source, layout = resolve_layout(root)
    least = ds.check_min_count("icons", layout.min_count if min_count is None else min_count)
    catalogue = source / layout.catalogue
    stat = catalogue.stat()
    payload = {"rule": rule_description(layout, least), "root": str(source),
               "catalogue": [stat.st_size, stat.st_mtime_ns]}
    digest = ds.cache_key(payload)
    return ds.cached_manifest("icons", source, cache_dir, digest,
                           lambda folder: _build_manifest(source, layout, folder, digest, least, progress))


def load_icon_set(root: Path | str, min_count: int | None = None, cache_dir: Path | None = None,
                  progress: bool | None = None) -> DatasetSplits:
    """The cleaned icon set in ``root`` as :class:`DatasetSplits` named ``icons-<layout>``."""
    folder, manifest = ensure_icon_set(root, min_count, cache_dir, progress)
    classes = list(manifest["classes"])
    parts = split_parts(folder, manifest["images"], classes)
    layout = next(lay for lay in LAYOUTS.values() if lay.catalogue == manifest["rule"]["layout"])
    splits = view_splits("icons", manifest["source"], "labels", "labels", manifest["rule"]["min_count"],
                         layout.min_count, classes, parts)
    splits.name = f"icons-{_layout_name(layout)}"
    emit_note(splits.notes, f"{splits.name}: {ds.split_counts(parts, 'icons')}, {len(classes)} classes, "
              f"{ds.labels_per_image(parts)} labels per image")
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
    parser = ds.command_line_parser("python -m models.sources.icon_sets", "An npm icon set (Tabler, Lucide, "
                                 "Phosphor) as a multi-label dataset: label its icons by the rule, rasterise them "
                                 "once, print the counts.", "the unpacked npm package", 0, "keyword",
                                 "also print the merged keywords")
    args = parser.parse_args(argv)

    def show(folder: Path, manifest: dict[str, Any]) -> None:
        print(f"cache: {folder}\nicons: {manifest['counts']['icons']:,}; left out: {manifest['counts']['left_out']}\n"
              + ds.images_line(manifest))
        if args.rule:
            print("merged: " + ", ".join(f"{w}->{t}" for w, t in manifest["merged_keywords"].items()))
        print("\n".join(ds.class_lines(manifest, 18)))

    return ds.run_command(lambda: ensure_icon_set(args.root or ".", args.min_count or None, args.cache, not args.quiet),
                       show)


if __name__ == "__main__":
    sys.exit(main())
