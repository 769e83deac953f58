"""The Open Clip Art Library 0.18 as a human-tagged multi-label dataset, ``--data
openclipart[:DIR][?view=folders][&min-count=N]`` (docs/datasets.md, "openclipart")."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import sys
import time
import unicodedata
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from PIL import Image

from models.data.csv_format import emit_note
from models.data.drawing_cache import (
    MANIFEST_FORMAT,
    SPEC_OPTIONS,
    folder_view_parts,
    parse_spec,
    split_parts,
    view_splits,
)
from models.data.types import DataError, DatasetSplits, LabelledImages
from models.files.atomic_writes import atomic_write_text
from models.files.digest import file_blake2b
from models.sources import drawing_sets as ds
from models.sources.drawings import (
    BACKGROUND_TOLERANCE,
    CROP_MARGIN,
    MAX_RENDER_SIZE,
    RASTER_SIZE,
    RENDER_SIZE,
    BlankDrawing,
    cairosvg_svg2png,
    content_box,
    raster_of_bitmap,
    raster_of_svg,
)

__all__ = [
    "ARTIFACT_PATTERNS", "AUTHOR_KEYWORDS", "BATCH_KEYWORDS", "DEFAULT_ROOT", "DROPPED_FOLDERS", "DROPPED_KEYWORDS",
    "MERGED_KEYWORDS", "MIN_CLASS_COUNT", "OPENCLIPART_OPTIONS", "RASTER_SIZE", "canonical_keyword", "content_box",
    "ensure_openclipart", "export_folder_view", "folder_class", "load_openclipart", "load_openclipart_spec",
    "normalise_keyword", "rasterise_drawing", "read_svg_metadata"]

DEFAULT_ROOT = Path("/usr/share/openclipart/svg")
DEBIAN_PACKAGE = "openclipart-svg"
#: Bumped when the code (not only the constants) changes what a build produces; part of the cache digest.
RULE_VERSION = 1
OPENCLIPART_OPTIONS = SPEC_OPTIONS
VIEWS = ("keywords", "folders")

#: A keyword on fewer images than this is not a class (the spec's ``min-count`` overrides it).
MIN_CLASS_COUNT = 25
#: Fractions of the images in train, val and test (by hash rank).
SPLIT_FRACTIONS = (("train", 0.6), ("val", 0.2), ("test", 0.2))

_DC = "{http://purl.org/dc/elements/1.1/}"
_RDF = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}"

# ----------------------------------------------------------------------------------------------------------------
# The cleaning rule, as data. Measured on the Debian package 0.18 (counts are distinct drawings).

#: Folders (relative to DIR, POSIX) whose drawings are left out when they are filed nowhere else.
DROPPED_FOLDERS: dict[str, str] = {
    "special/gradients": "118 colour-gradient swatches (gradient-americana.svg, ...), tagged only 'gradients "
                         "special': fills for other drawings, no subject",
    "special/patterns": "96 tiling patterns (pattern-arches-intersecting-1.svg, ...): fills, no subject"}

#: A drawing carrying one of these keywords is part of a machine-made batch and is left out.
BATCH_KEYWORDS: dict[str, str] = {
    "magick": "shapes/stars: 1,375 star polygons generated with ImageMagick (star_49pt05step.svg, ...), every one "
              "tagged 'stars shapes magick geometry'; near-identical images with identical labels",
    "theme": "computer/icons/{flat,lemon,etiquette}-theme: about 1,420 icons of three desktop themes, tagged with "
             "the theme's words (computer icons theme action application filesystem mimetypes), not their picture",
    "lemon_theme_icon": "the lemon theme's marker (416 icons, some also filed under computer/); they carry "
                        "'theme' too, listed so that a copy without it is caught as well"}

#: Whole keywords removed from every drawing: artifacts of the library's import script.
ARTIFACT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r""), "an empty <rdf:li> (3,364 files)"),
    (re.compile(r"hash|hash\(0x[0-9a-f]+\)"), "'HASH(0x8a07724)' / 'hash': a Perl reference printed by the import "
                                              "script instead of a keyword (1,795 files)"),
    (re.compile(r"\d+"), "a bare number ('11' on 28 unrelated drawings)"))

#: Keywords removed from every drawing, with the reason.
DROPPED_KEYWORDS: dict[str, str] = {
    "signs_and_symbols": "the library's folder name, added by its import script (229)",
    "unsorted": "the library's 'not yet sorted' folder name (133)",
    "special": "the library's folder name of the gradients and patterns (121)",
    "gradients": "the gradient swatches' batch keyword (their folder is dropped)",
    "openclipart": "the library's own name",
    "united_nations_member": "labels the whole batch of national flags (175): a political fact, not visible",
    "subnational": "labels the batch of French regional flags (40): a political fact, not visible",
    "menu": "labels one author's whole batch of food and party drawings (130) by their purpose; they are also "
            "tagged food, dessert, beverage, ...",
    "webpage": "labels one author's batch of web buttons and arrows (72) by their purpose; they are also tagged "
               "button, arrow",
    "white": "the name of one 54-card deck (recreation/games/cards/white); the cards are tagged 'card'",
    "ornamental": "the name of one 54-card deck (recreation/games/cards/ornamental)",
    "simple": "the name of one 54-card deck (recreation/games/cards/simple)",
    "bordered": "the name of one 54-card deck (recreation/games/cards/bordered)"}

#: Author names typed as keywords (the name is in <dc:creator>, kept in the manifest as ``author``).
AUTHOR_KEYWORDS: dict[str, str] = {
    "architetto_francesco_rollandin": "Architetto Francesco Rollandin tagged 58 of his drawings with his name"}

#: Plurals, spelling variants and synonyms -> one keyword (applied to folder names too, for the folder view).
MERGED_KEYWORDS: dict[str, str] = {
    # plurals (and the plural folder names: animals/, birds/, flags/, ...)
    "activities": "activity", "animals": "animal", "arrows": "arrow", "beverages": "beverage", "birds": "bird",
    "books": "book", "buildings": "building", "buttons": "button", "callouts": "callout", "cards": "card",
    "clocks": "clock", "containers": "container", "decorations": "decoration", "desserts": "dessert",
    "dinosaurs": "dinosaur", "dogs": "dog", "flags": "flag", "flowers": "flower", "fruits": "fruit",
    "games": "game", "hats": "hat", "holidays": "holiday", "horses": "horse", "houses": "house",
    "icons": "icon", "ideas": "idea", "logos": "logo", "mammals": "mammal", "maps": "map", "plants": "plant",
    "roadsigns": "roadsign", "shapes": "shape", "signs": "sign", "smilies": "smiley", "sports": "sport",
    "stars": "star", "states": "state", "symbols": "symbol", "tools": "tool", "toys": "toy", "trees": "tree",
    "valentines": "valentine", "vegetables": "vegetable", "vehicles": "vehicle", "weapons": "weapon",
    # spelling variants
    "vegitable": "vegetable", "xmass": "christmas", "unitedstates": "united_states",
    "northamerica": "north_america", "latinamerica": "latin_america", "mime_types": "mimetypes",
    "stickman": "stickmen", "map_symbols": "map_symbol", "mapsym": "map_symbol",
    # synonyms
    "transportation": "transport", "xmas": "christmas", "appicon": "icon", "arrowshape": "arrow",
    "caution": "warning", "bug": "insect", "bugs": "insect", "boating": "boat", "home": "house", "homes": "house"}

_SEPARATORS = re.compile(r"[\s\-/.]+")
_ITEM_SPLIT = re.compile(r"[,;]")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

LEFT_OUT_REASONS = ("unreadable", "dropped folder", "batch drawing", "no keyword", "not rasterised",
                    "merged duplicate", "no frequent keyword")


# ----------------------------------------------------------------------------------------------------------------
# Keywords


def normalise_keyword(text: str) -> list[str]:
    """Split a keyword text on ``,`` and ``;`` and normalise each part (empty parts kept as ``""``)."""
    return [ds.fold(part, _SEPARATORS, "_", "\"'").strip("_")
            for part in _ITEM_SPLIT.split(unicodedata.normalize("NFKC", text or ""))]


def drop_reason(keyword: str) -> str | None:
    """Why the rule removes the normalised ``keyword`` (an artifact, a dropped or author keyword), or None."""
    for pattern, reason in ARTIFACT_PATTERNS:
        if pattern.fullmatch(keyword):
            return f"artifact: {reason}"
    if keyword in DROPPED_KEYWORDS:
        return DROPPED_KEYWORDS[keyword]
    if keyword in AUTHOR_KEYWORDS:
        return f"author name: {AUTHOR_KEYWORDS[keyword]}"
    return None


def canonical_keyword(keyword: str) -> str | None:
    """The class name of a normalised keyword under the rule: None when it is removed, else its merged form."""
    if drop_reason(keyword) is not None:
        return None
    merged = MERGED_KEYWORDS.get(keyword, keyword)
    return None if drop_reason(merged) is not None else merged


def canonical_keywords(texts: list[str]) -> list[str]:
    """The sorted canonical keywords of raw keyword texts (each split, normalised, dropped or merged)."""
    found = {canonical_keyword(word) for text in texts for word in normalise_keyword(text)}
    return sorted(word for word in found if word)


@dataclass
class SvgMetadata:
    """What an SVG's metadata says: its raw keyword texts and its author (``<dc:creator>``'s title)."""

    keywords: list[str]
    author: str = ""


def read_svg_metadata(path: Path) -> SvgMetadata:
    """The keywords and author of the SVG ``path`` (``ET.ParseError`` or ``OSError``)."""
    tree = ET.parse(path)
    keywords: list[str] = []
    for subject in tree.iter(f"{_DC}subject"):
        items = list(subject.iter(f"{_RDF}li"))
        keywords += [item.text or "" for item in items] if items else [subject.text or ""]
    author = ""
    for creator in tree.iter(f"{_DC}creator"):
        titles = [(title.text or "").strip() for title in creator.iter(f"{_DC}title")]
        author = next((t for t in titles if t), (creator.text or "").strip())
        if author:
            break
    return SvgMetadata(keywords, author)


def folder_class(sources: list[str], classes: set[str] | frozenset[str]) -> str | None:
    """The folder-view class of an image: the deepest class-named folder of its sorted ``sources``, or None."""
    for source in sorted(sources):
        for folder in reversed(PurePosixPath(source).parent.parts):
            for word in normalise_keyword(folder):
                name = canonical_keyword(word)
                if name is not None and name in classes:
                    return name
    return None


# ----------------------------------------------------------------------------------------------------------------
# Rasters


def _cairosvg_svg2png() -> Callable[..., bytes]:
    """cairosvg's ``svg2png``, imported on first use; a clear :class:`DataError` when it cannot be."""
    return cairosvg_svg2png("openclipart")


def rasterise_drawing(svg: Path, fallbacks: list[Path],
                      svg2png: Callable[..., bytes] | None = None) -> tuple[Image.Image | None, str, str]:
    """Rasterise one drawing from its SVG, else a PNG render of ``fallbacks``: ``(image, kind, why)``."""
    renderer = svg2png if svg2png is not None else _cairosvg_svg2png()
    try:
        return raster_of_svg(renderer, svg), "svg", ""
    except BlankDrawing as exc:
        return None, "", f"svg: {exc}"
    except Exception as exc:  # cairosvg raises many types on bad SVGs
        reason = f"svg: {ds.failure(exc)}"
    for png in fallbacks:
        if not png.is_file():
            continue
        try:
            return raster_of_bitmap(png), "png", reason
        except Exception as exc:  # PIL raises many types; DecompressionBombError/Warning included
            return None, "", f"{reason}; png render {png.name}: {ds.failure(exc)}"
    return None, "", f"{reason}; no png render"


# ----------------------------------------------------------------------------------------------------------------
# Scanning the source tree


@dataclass
class _Drawing:
    """One distinct SVG (identical bytes): every path below the root that holds it, and what its metadata says."""

    digest: str  # BLAKE2b of the bytes: the drawing's identity
    real: Path  # the file read
    sources: list[str] = field(default_factory=list)  # relative POSIX paths (files and symlinks), sorted
    keywords: list[str] = field(default_factory=list)  # canonical
    batch: list[str] = field(default_factory=list)  # batch keywords found
    author: str = ""
    problem: str = ""  # a LEFT_OUT_REASONS entry, "" while kept
    detail: str = ""


@dataclass
class _Source:
    """The folders a build reads."""

    svg: Path
    png: Path | None


def resolve_source(root: Path | str | None) -> _Source:
    """The SVG folder and the PNG renders' folder beside it; a :class:`DataError` when missing."""
    path = ds.source_folder(root, DEFAULT_ROOT, "svg")
    if not path.is_dir():
        raise DataError(
            f"openclipart: {path}: no such folder. The Open Clip Art Library 0.18 is the Debian/Ubuntu package "
            f"{DEBIAN_PACKAGE}: `sudo apt-get install {DEBIAN_PACKAGE}` (openclipart-png adds the PNG renders used "
            "where an SVG does not render); or give another copy of the same layout with "
            "--data openclipart:DIR (DIR: its svg folder, or the folder holding svg/ and png/)")
    png = path.parent / "png"
    return _Source(path, png if path.name == "svg" and png.is_dir() else None)


def _svg_entries(root: Path) -> list[tuple[str, os.stat_result, str]]:
    """``(relative path, lstat, link target or "")`` of every ``*.svg`` below ``root``, sorted."""
    return [(rel, info, target) for rel, (info, target) in ds.files_below(root, (".svg",), _lstat_and_link)]


def _lstat_and_link(path: str) -> tuple[os.stat_result, str]:
    return os.lstat(path), os.readlink(path) if os.path.islink(path) else ""


def source_fingerprint(source: _Source) -> str:
    """A digest of the SVG folder's listing, one ``lstat`` per entry: a changed source is another cache."""
    return ds.listing_digest((rel, info.st_size, info.st_mtime_ns, target)
                          for rel, info, target in _svg_entries(source.svg))


def _scan(source: _Source, left_out: list[dict[str, Any]]) -> tuple[list[_Drawing], dict[str, int]]:
    """Read every SVG once, grouping identical files into drawings; returns the drawings and counts."""
    entries = _svg_entries(source.svg)
    if not entries:
        raise DataError(f"openclipart: {source.svg}: no .svg file below this folder (expected the layout of the "
                        f"{DEBIAN_PACKAGE} package: <category>/[<sub-folder>/]<drawing>.svg)")
    by_inode: dict[tuple[int, int], list[str]] = defaultdict(list)
    real_of: dict[tuple[int, int], Path] = {}
    for rel, _info, _target in entries:
        path = source.svg / rel
        try:
            info = os.stat(path)
        except OSError as exc:  # a dangling symlink
            left_out.append({"sources": [rel], "reason": "unreadable", "detail": exc.strerror or str(exc)})
            continue
        key = (info.st_dev, info.st_ino)
        by_inode[key].append(rel)
        real_of.setdefault(key, Path(os.path.realpath(path)))
    drawings: dict[str, _Drawing] = {}
    for key, rels in by_inode.items():
        try:
            digest = file_blake2b(real_of[key], 16)
        except OSError as exc:
            left_out.append({"sources": sorted(rels), "reason": "unreadable", "detail": exc.strerror or str(exc)})
            continue
        drawing = drawings.setdefault(digest, _Drawing(digest, real_of[key]))
        drawing.sources += rels
    for drawing in drawings.values():
        drawing.sources.sort()
    ordered = sorted(drawings.values(), key=lambda d: d.sources[0])
    for drawing in ordered:
        drawing.real = source.svg / drawing.sources[0]
        try:
            meta = read_svg_metadata(drawing.real)
        except (ET.ParseError, OSError, UnicodeError) as exc:
            drawing.problem, drawing.detail = "unreadable", f"{type(exc).__name__}: {exc}"
            continue
        drawing.author = meta.author
        words = {word for text in meta.keywords for word in normalise_keyword(text)}
        drawing.batch = sorted(words & set(BATCH_KEYWORDS))
        drawing.keywords = canonical_keywords(meta.keywords)
    counts = {"svg_paths": len(entries), "symlinks": sum(1 for _, _, target in entries if target),
              "drawings": len(ordered)}
    return ordered, counts


def _in_dropped_folder(sources: list[str]) -> bool:
    """True when every source path lies below one of :data:`DROPPED_FOLDERS`."""
    return all(any(PurePosixPath(s).is_relative_to(folder) for folder in DROPPED_FOLDERS) for s in sources)


# ----------------------------------------------------------------------------------------------------------------
# The cache


def rule_description(min_count: int) -> dict[str, Any]:
    """The rule and raster settings as JSON data (what the cache digest covers, besides the source)."""
    return {
        "rule_version": RULE_VERSION,
        "dropped_folders": sorted(DROPPED_FOLDERS),
        "batch_keywords": sorted(BATCH_KEYWORDS),
        "artifact_patterns": [pattern.pattern for pattern, _ in ARTIFACT_PATTERNS],
        "dropped_keywords": sorted(DROPPED_KEYWORDS),
        "author_keywords": sorted(AUTHOR_KEYWORDS),
        "merged_keywords": [list(pair) for pair in sorted(MERGED_KEYWORDS.items())],
        "min_count": int(min_count),
        "splits": [list(pair) for pair in SPLIT_FRACTIONS],
        "raster": {"size": RASTER_SIZE, "render": RENDER_SIZE, "max_render": MAX_RENDER_SIZE,
                   "margin": CROP_MARGIN, "tolerance": BACKGROUND_TOLERANCE, "format": "png", "background": "white"}}


def cache_digest(source: _Source, min_count: int) -> str:
    """The cache folder's name: a digest of :func:`rule_description`, the source folders and their listing."""
    payload = {"rule": rule_description(min_count), "svg": str(source.svg),
               "png": str(source.png) if source.png else None, "listing": source_fingerprint(source)}
    return ds.cache_key(payload)


def _raster_name(drawing: _Drawing) -> str:
    stem = _NAME_UNSAFE.sub("_", PurePosixPath(drawing.sources[0]).stem)[:60].strip("._") or "drawing"
    return f"{stem}-{drawing.digest[:12]}"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _rasterise_all(drawings: list[_Drawing], source: _Source, images: Path, progress: bool | None) -> None:
    """Render every drawing without a record yet (resumable), each file written atomically."""
    todo = []
    for drawing in drawings:
        name = _raster_name(drawing)
        record = _read_record(images / f"{name}.json")
        if record is None or (record.get("status") == "ok" and not (images / f"{name}.png").is_file()):
            todo.append(drawing)
    if not todo:
        return
    svg2png = _cairosvg_svg2png()
    images.mkdir(parents=True, exist_ok=True)
    for drawing in ds.progress_bar(todo, "openclipart: rendering (once)", "drawing", progress):
        name = _raster_name(drawing)
        fallbacks = [source.png / PurePosixPath(s).with_suffix(".png") for s in drawing.sources] if source.png else []
        started = time.perf_counter()
        image, origin, reason = rasterise_drawing(drawing.real, fallbacks, svg2png)
        record: dict[str, Any] = {"svg": drawing.sources[0]}
        if image is None:
            record.update(status="failed", reason=reason)
        else:
            ds.save_png(image, images / f"{name}.png")
            pixels = hashlib.blake2b(np.asarray(image).tobytes(), digest_size=16)
            pixels.update(f"{image.width}x{image.height}".encode())
            record.update(status="ok", raster=origin, svg_error=reason, pixels=pixels.hexdigest(),
                          size=[image.width, image.height])
        record["seconds"] = round(time.perf_counter() - started, 4)
        atomic_write_text(images / f"{name}.json", json.dumps(record, sort_keys=True))


def _split_key(identity: str) -> str:
    return hashlib.blake2b(f"openclipart-split:{identity}".encode(), digest_size=16).hexdigest()


def _assign_splits(identities: list[str]) -> list[str]:
    """Split names for ``identities`` by hash rank (:data:`SPLIT_FRACTIONS`)."""
    order = sorted(range(len(identities)), key=lambda i: _split_key(identities[i]))
    splits = [""] * len(identities)
    start = 0
    for position, (name, fraction) in enumerate(SPLIT_FRACTIONS):
        stop = len(order) if position == len(SPLIT_FRACTIONS) - 1 else start + round(fraction * len(order))
        for i in order[start:stop]:
            splits[i] = name
        start = stop
    return splits


def _build_manifest(source: _Source, folder: Path, digest: str, min_count: int,
                    progress: bool | None) -> dict[str, Any]:
    """Scan, clean, rasterise (resumable) and return the manifest of one cache folder."""
    left_out: list[dict[str, Any]] = []
    drawings, counts = _scan(source, left_out)
    candidates: list[_Drawing] = []
    for drawing in drawings:
        if not drawing.problem:
            if _in_dropped_folder(drawing.sources):
                drawing.problem = "dropped folder"
            elif drawing.batch:
                drawing.problem, drawing.detail = "batch drawing", ", ".join(drawing.batch)
            elif not drawing.keywords:
                drawing.problem = "no keyword"
        if drawing.problem:
            left_out.append({"sources": drawing.sources, "reason": drawing.problem, "detail": drawing.detail})
        else:
            candidates.append(drawing)
    images_dir = folder / "images"
    _rasterise_all(candidates, source, images_dir, progress)

    groups: dict[str, list[tuple[_Drawing, dict[str, Any]]]] = {}
    render_seconds = 0.0
    fallbacks = 0
    for drawing in candidates:
        record = _read_record(images_dir / f"{_raster_name(drawing)}.json") or {}
        render_seconds += float(record.get("seconds", 0.0))
        if record.get("status") != "ok":
            left_out.append({"sources": drawing.sources, "reason": "not rasterised",
                             "detail": str(record.get("reason", "no record"))})
            continue
        fallbacks += record.get("raster") == "png"
        groups.setdefault(str(record["pixels"]), []).append((drawing, record))

    merged: list[dict[str, Any]] = []
    for members in groups.values():  # candidates are in sorted path order, so members[0] is the first
        first, record = members[0]
        for other, _ in members[1:]:
            left_out.append({"sources": other.sources, "reason": "merged duplicate",
                             "detail": f"identical raster: merged into {first.sources[0]}"})
        merged.append({
            "id": first.digest,
            "file": f"images/{_raster_name(first)}.png",
            "keywords": sorted({k for member, _ in members for k in member.keywords}),
            "sources": sorted({s for member, _ in members for s in member.sources}),
            "author": first.author,
            "raster": record.get("raster", "svg"),
            "size": record.get("size"),
        })
    counter = Counter(k for image in merged for k in image["keywords"])
    classes, keyword_counts = ds.frequent(counter, min_count)
    kept_classes = set(classes)
    images = []
    for image in merged:
        labels = [k for k in image["keywords"] if k in kept_classes]
        if not labels:
            left_out.append({"sources": image["sources"], "reason": "no frequent keyword",
                             "detail": " ".join(image["keywords"])})
            continue
        image["labels"] = labels
        image["folder_class"] = folder_class(image["sources"], set(labels))
        images.append(image)
    images.sort(key=lambda image: image["sources"][0])
    for image, split in zip(images, _assign_splits([image["id"] for image in images]), strict=True):
        image["split"] = split
    left_out.sort(key=lambda entry: (LEFT_OUT_REASONS.index(entry["reason"]), entry["sources"][0]))
    counts.update({
        "left_out": ds.reason_counts(left_out, LEFT_OUT_REASONS),
        "png_fallbacks": fallbacks,
        "render_seconds": round(render_seconds, 1),
        "images": len(images),
        "classes": len(classes),
    })
    return {
        "format": MANIFEST_FORMAT,
        "digest": digest,
        "source": {"svg": str(source.svg), "png": str(source.png) if source.png else None},
        "rule": rule_description(min_count),
        "counts": counts,
        "classes": classes,
        "keyword_counts": keyword_counts,
        "images": images,
        "left_out": left_out}


def ensure_openclipart(root: Path | str | None = None, min_count: int = MIN_CLASS_COUNT,
                       cache_dir: Path | None = None, progress: bool | None = None) -> tuple[Path, dict[str, Any]]:
    """``(cache folder, manifest)`` of the cleaned dataset, built (or resumed) first when needed."""
    least = ds.check_min_count("openclipart", min_count)
    source = resolve_source(root)
    digest = cache_digest(source, least)
    return ds.cached_manifest("openclipart", source.svg, cache_dir, digest,
                           lambda folder: _build_manifest(source, folder, digest, least, progress))


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _format_left_out(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {reason}" for reason, n in counts.items() if n)


def _keyword_view(folder: Path, manifest: dict[str, Any]) -> tuple[list[str], dict[str, LabelledImages], list[str]]:
    classes = list(manifest["classes"])
    parts = split_parts(folder, manifest["images"], classes)
    counts = manifest["counts"]
    notes = [
        f"openclipart: {ds.split_counts(parts)}, {len(classes)} classes (keywords on >= "
        f"{manifest['rule']['min_count']} images), {ds.labels_per_image(parts)} labels per image, from "
        f"{counts['drawings']:,} distinct drawings ({counts['svg_paths']:,} SVG paths)",
        f"openclipart: left out: {_format_left_out(counts['left_out'])} "
        f"(python -m models.sources.openclipart prints the rule and the counts)"]
    return classes, parts, notes


def _folder_view(folder: Path, manifest: dict[str, Any]) -> tuple[list[str], dict[str, LabelledImages], list[str]]:
    classes, parts, no_folder = folder_view_parts(folder, manifest["images"])
    unseen_val = no_folder["unseen"]
    notes = [
        f"openclipart folders: one positive per train/val image, its category folder's class: "
        f"{len(parts['train']):,} train, {len(parts['val']):,} val images, {len(classes)} classes; test "
        f"{len(parts['test']):,} images with their full keyword labels",
        f"openclipart folders: left out {no_folder['train'] + no_folder['val']:,} train/val images whose folders "
        f"name none of their classes" + (f", {unseen_val} val images of a class with no training image"
                                         if unseen_val else "")
        + f", {no_folder['test']:,} test images with none of the view's classes"]
    return classes, parts, notes


def load_openclipart(root: Path | str | None = None, view: str = "keywords", min_count: int = MIN_CLASS_COUNT,
                     cache_dir: Path | None = None, progress: bool | None = None) -> DatasetSplits:
    """The cleaned Open Clip Art Library as :class:`DatasetSplits`, ``view`` ``keywords`` or ``folders``."""
    if view not in VIEWS:
        raise DataError(f"openclipart: unknown view {view!r} (use {' or '.join(VIEWS)})")
    folder, manifest = ensure_openclipart(root, min_count, cache_dir, progress)
    build = _folder_view if view == "folders" else _keyword_view
    classes, parts, notes = build(folder, manifest)
    splits = view_splits("openclipart", manifest["source"]["svg"], view, VIEWS[0], min_count, MIN_CLASS_COUNT,
                         classes, parts)
    for note in notes:
        emit_note(splits.notes, note)
    return splits


def load_openclipart_spec(argument: str) -> DatasetSplits:
    """``openclipart[:DIR][?view=folders][&min-count=N]``; an empty ``DIR`` is the Debian folder."""
    path, view, min_count = parse_spec("openclipart", argument, VIEWS, MIN_CLASS_COUNT)
    return load_openclipart(path or None, view=view, min_count=min_count)


# ----------------------------------------------------------------------------------------------------------------
# The folder view as a real folder tree


def _place(target: Path, link: Path, how: str) -> None:
    if how == "symlink":
        link.symlink_to(target)
    elif how == "hardlink":
        os.link(target, link)
    else:
        shutil.copyfile(target, link)


def export_folder_view(out: Path, root: Path | str | None = None, min_count: int = MIN_CLASS_COUNT,
                       link: str = "symlink", cache_dir: Path | None = None,
                       progress: bool | None = None) -> dict[str, int]:
    """Write the folder view as a ``folder:`` tree with ``out/test_labels.csv``; ``out`` must be new or empty. Returns
    the images written per split."""
    if link not in ("symlink", "hardlink", "copy"):
        raise DataError(f"openclipart: unknown link kind {link!r} (use symlink, hardlink or copy)")
    out = Path(out).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"openclipart: {out}: exists and is not an empty folder; give a new folder")
    splits = load_openclipart(root, view="folders", min_count=min_count, cache_dir=cache_dir, progress=progress)
    written = {}
    for split in ("train", "val"):
        part = getattr(splits, split)
        if part is None:
            continue
        for path, row in zip(part.paths, part.labels, strict=True):
            (name,) = [splits.classes[j] for j in np.flatnonzero(row)]
            target = out / split / name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            _place(path, target, link)
        written[split] = len(part)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["image", "labels"])
    test = splits.test
    for path, row in zip(test.paths if test else [], test.labels if test else [], strict=True):
        writer.writerow([str(path), ";".join(splits.classes[j] for j in np.flatnonzero(row))])
    atomic_write_text(out / "test_labels.csv", buffer.getvalue())
    written["test"] = len(test) if test is not None else 0
    return written


# ----------------------------------------------------------------------------------------------------------------
# Command line


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def report(folder: Path, manifest: dict[str, Any]) -> str:
    """The cleaning report of a built cache folder: reasons, classes, labels per image, the folder view."""
    counts, images = manifest["counts"], manifest["images"]
    lines = [
        f"cache: {folder} ({_folder_size(folder) / 1e6:.1f} MB)",
        f"source: {manifest['source']['svg']} (PNG renders: {manifest['source']['png'] or 'none'})",
        f"SVG paths: {counts['svg_paths']:,} ({counts['symlinks']:,} symlinks); distinct drawings: "
        f"{counts['drawings']:,}",
        "left out / merged, by reason (in the order the rule applies them):",
        *(f"  {reason:<20} {n:>6,}" for reason, n in counts["left_out"].items()),
        f"rasterised from the PNG render (SVG failed): {counts['png_fallbacks']}; rendering time (sum over "
        f"drawings): {counts['render_seconds']:.0f} s"]
    lines += [ds.images_line(manifest), *ds.class_lines(manifest, 22)]
    train_val = [image for image in images if image["split"] != "test"]
    placed = Counter(image["split"] for image in train_val if image["folder_class"] is not None)
    folder_classes = Counter(image["folder_class"] for image in train_val
                             if image["split"] == "train" and image["folder_class"] is not None)
    lines.append(f"folder view: {sum(placed.values()):,} of {len(train_val):,} train/val images have a folder "
                 f"class (train {placed['train']:,}, val {placed['val']:,}); {len(folder_classes)} classes; "
                 f"{len(train_val) - sum(placed.values()):,} left out")
    lines.append("  " + ", ".join(f"{name} {n}" for name, n in folder_classes.most_common()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: build the cache, print its report, ``--export-folders OUT``; the exit status."""
    parser = ds.command_line_parser(
        "python -m models.sources.openclipart", "The Open Clip Art Library 0.18 (Debian package openclipart-svg) as a "
        "multi-label dataset: clean its keywords, render the drawings once into the cache, print the cleaning report.",
        f"the svg folder (default: {DEFAULT_ROOT}), or a folder holding svg/ and png/", MIN_CLASS_COUNT, "keyword",
        "also print every dropped/merged keyword and why")
    parser.add_argument("--export-folders", type=Path, default=None, metavar="OUT",
                        help="also write the folder view as OUT/{train,val}/<class>/<image> + OUT/test_labels.csv")
    parser.add_argument("--link", choices=("symlink", "hardlink", "copy"), default="symlink",
                        help="how --export-folders places the images (default: %(default)s)")
    args = parser.parse_args(argv)

    def show(folder: Path, manifest: dict[str, Any]) -> None:
        if args.rule:
            print(ds.rule_lines({"dropped folders": DROPPED_FOLDERS, "batch keywords": BATCH_KEYWORDS,
                              "artifacts": {f"/{p.pattern}/": v for p, v in ARTIFACT_PATTERNS},
                              "dropped keywords": {**DROPPED_KEYWORDS, **AUTHOR_KEYWORDS}}), end="")
            print("merged: " + ", ".join(f"{k}->{v}" for k, v in MERGED_KEYWORDS.items()))
        print(report(folder, manifest))
        if args.export_folders is not None:
            written = export_folder_view(args.export_folders, args.root, args.min_count, args.link, args.cache,
                                         progress=not args.quiet)
            print(f"folder view written to {args.export_folders.absolute()}: train {written.get('train', 0)}, "
                  f"val {written.get('val', 0)}, test_labels.csv {written['test']} rows; train it with "
                  f"--data folder:{args.export_folders}")

    return ds.run_command(lambda: ensure_openclipart(args.root, args.min_count, args.cache, progress=not args.quiet),
                       show)


if __name__ == "__main__":
    sys.exit(main())
