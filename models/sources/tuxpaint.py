"""The Tux Paint stamps as a human-tagged multi-label dataset, ``--data tuxpaint[:DIR][?view=folders][&min-count=N]``
(docs/datasets.md, "tuxpaint")."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from models.data.csv_format import emit_note
from models.data.drawing_cache import MANIFEST_FORMAT, folder_view_parts, parse_spec, split_parts, view_splits
from models.data.types import DataError, DatasetSplits
from models.sources import drawing_sets as ds
from models.sources.drawings import RASTER_SIZE

__all__ = ["DEFAULT_ROOT", "DROPPED_FOLDERS", "MERGED_LABELS", "MIN_CLASS_COUNT", "STOP_WORDS", "STYLE_FOLDERS",
           "description_labels", "ensure_tuxpaint", "folder_labels", "load_tuxpaint", "load_tuxpaint_spec",
           "stamp_group"]

DEFAULT_ROOT = Path("/usr/share/tuxpaint/stamps")
DEBIAN_PACKAGE = "tuxpaint-stamps-default"
RULE_VERSION = 1
VIEWS = ("labels", "folders")
IMAGE_SUFFIXES = (".png", ".svg")

#: A label on fewer images than this is not a class (the spec's ``min-count`` overrides it).
MIN_CLASS_COUNT = 8
#: Description words shorter than this are not labels.
MIN_WORD_LENGTH = 3
#: Fractions of the images in train, val and test (filled group by group in hash order).
SPLIT_FRACTIONS = (("train", 0.6), ("val", 0.2), ("test", 0.2))

#: Folders (relative to DIR, POSIX) whose stamps are left out, with the reason.
DROPPED_FOLDERS: dict[str, str] = {
    "symbols/alphabets": "158 letters (filled, outlined, upper and lower case of four alphabets) and hand signs "
                         "of the American Sign Language: glyphs whose folders name a font variant"}

#: Folder names that say how a stamp is drawn or sorted, not what it shows (never labels).
STYLE_FOLDERS: dict[str, str] = {
    "cartoon": "a drawing style (animals/dinosaur/cartoon, vehicles/locomotive/cartoon, ...), in many categories",
    "00_symbols": "symbols/money/00_symbols: a sorting folder of currency signs"}

#: Plurals and variants -> one label (folder names and description words alike).
MERGED_LABELS: dict[str, str] = {
    "amphibians": "amphibian", "animals": "animal", "apes": "ape", "apples": "apple", "balloons": "balloon",
    "bears": "bear", "birds": "bird", "body_parts": "body_part", "bovines": "bovine", "candles": "candle",
    "cats": "cat", "cents": "cent", "cherries": "cherry", "coins": "coin", "dinosaurs": "dinosaur", "dishes": "dish",
    "dogs": "dog", "eggs": "egg", "equines": "equine", "eyes": "eye", "flags": "flag", "flowers": "flower",
    "hats": "hat", "hobbies": "hobby", "houses": "house", "insects": "insect", "lizards": "lizard",
    "mammals": "mammal", "marsupials": "marsupial", "monuments": "monument", "mushrooms": "mushroom",
    "notes": "note", "nuts": "nut", "operators": "operator", "planes": "plane", "planets": "planet",
    "plants": "plant", "rodents": "rodent", "roadsigns": "roadsign", "shapes": "shape", "sports": "sport",
    "squares": "square", "stars": "star", "stones": "stone", "symbols": "symbol", "tools": "tool", "toys": "toy",
    "trees": "tree", "utensils": "utensil", "vegetables": "vegetable", "vehicles": "vehicle"}

#: Description words that are not labels: function words, numbers and words that name no visible content.
STOP_WORDS: frozenset[str] = frozenset((
    "about", "also", "and", "another", "any", "are", "as", "at", "back", "been", "but", "by", "called", "can",
    "could", "did", "does", "doing", "each", "else", "even", "every", "first", "for", "from", "get", "gets", "go",
    "goes", "had", "half", "has", "have", "her", "here", "his", "how", "if", "into", "is", "its", "it", "just",
    "kind", "like", "look", "looks", "made", "make", "makes", "many", "means", "more", "most", "move", "moves",
    "much", "not", "one", "only", "onto", "other", "our", "out", "over", "own", "part", "piece", "pair", "put",
    "same", "second", "set", "she", "some", "such", "than", "that", "the", "their", "them", "then", "there", "these",
    "they", "this", "those", "three", "through", "two", "type", "under", "upon", "use", "used", "very", "was", "way",
    "were", "what", "when", "where", "which", "while", "who", "will", "with", "you", "your", "four", "five", "six",
    "seven", "eight", "nine", "ten",
))

_LEFT_OUT_REASONS = ("dropped folder", "not rasterised", "merged duplicate", "no frequent label")
_WORD = re.compile(r"[a-z]+")
_TRAILING_NUMBER = re.compile(r"[-_ ]?\d+$")
_FOLDER_RUNS = re.compile(r"[\s-]+")


# ----------------------------------------------------------------------------------------------------------------
# Labels


def _canonical(name: str) -> str:
    return MERGED_LABELS.get(name, name)


def folder_labels(relative: str) -> list[str]:
    """The folder labels of a stamp: its folders, normalised and merged, style folders left out, each once."""
    labels: list[str] = []
    for folder in PurePosixPath(relative).parent.parts:
        name = ds.fold(folder, _FOLDER_RUNS, "_")
        if name and name not in STYLE_FOLDERS and _canonical(name) not in labels:
            labels.append(_canonical(name))
    return labels


def description_labels(description: str) -> list[str]:
    """The labels of a description: its long enough non-stop words, merged, sorted, each once."""
    words = _WORD.findall(ds.fold(description))
    return sorted({_canonical(w) for w in words if len(w) >= MIN_WORD_LENGTH and w not in STOP_WORDS})


def stamp_group(relative: str) -> str:
    """A stamp's split group: its folder and name without a trailing number."""
    path = PurePosixPath(relative)
    stem = _TRAILING_NUMBER.sub("", path.stem) or path.stem
    return str(path.parent / stem)


def deepest_folder_class(relative: str, classes: set[str]) -> str | None:
    """The folder view's class of a stamp: the deepest folder along its path whose label is in ``classes``."""
    for label in reversed(folder_labels(relative)):
        if label in classes:
            return label
    return None


# ----------------------------------------------------------------------------------------------------------------
# Reading the stamps


@dataclass
class _Stamp:
    """One stamp: its path below DIR without suffix, the file drawn, its description and labels."""

    relative: str  # POSIX, no suffix
    image: Path
    description: str
    labels: list[str] = field(default_factory=list)


def resolve_root(root: Path | str | None) -> Path:
    """The stamps folder; a :class:`DataError` naming the Debian package when it is missing."""
    path = ds.source_folder(root, DEFAULT_ROOT, "stamps")
    if not path.is_dir():
        raise DataError(
            f"tuxpaint: {path}: no such folder. The Tux Paint stamps are the Debian/Ubuntu package "
            f"{DEBIAN_PACKAGE}: `sudo apt-get install {DEBIAN_PACKAGE}`; or give a copy of the same layout with "
            "--data tuxpaint:DIR (DIR: the stamps folder, <category>/[<sub-folder>/]<name>.png with <name>.txt)")
    return path


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """``(relative path, stat)`` of every image and description file below ``root``, sorted."""
    return ds.files_below(root, (*IMAGE_SUFFIXES, ".txt"), os.stat)


def _read_description(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _scan(root: Path) -> list[_Stamp]:
    """Every stamp below ``root`` (sorted by path), with its image file (the PNG when it has one) and description."""
    files: dict[str, dict[str, Path]] = {}
    for rel, _ in _entries(root):
        stem, suffix = rel.rsplit(".", 1)
        files.setdefault(stem, {})[f".{suffix.lower()}"] = root / rel
    stamps = []
    for stem in sorted(files):
        found = files[stem]
        image = found.get(".png") or found.get(".svg")
        if image is None:
            continue
        description = _read_description(found[".txt"]) if ".txt" in found else ""
        stamps.append(_Stamp(stem, image, description))
    if not stamps:
        raise DataError(f"tuxpaint: {root}: no .png or .svg stamp below this folder (expected the layout of the "
                        f"{DEBIAN_PACKAGE} package: <category>/[<sub-folder>/]<name>.png with <name>.txt)")
    return stamps


def _dropped(relative: str) -> bool:
    return any(PurePosixPath(relative).is_relative_to(folder) for folder in DROPPED_FOLDERS)


# ----------------------------------------------------------------------------------------------------------------
# The cache


def rule_description(min_count: int) -> dict[str, Any]:
    """The rule and raster settings as JSON data (what the cache digest covers, besides the source listing)."""
    return {
        "rule_version": RULE_VERSION, "dropped_folders": sorted(DROPPED_FOLDERS),
        "style_folders": sorted(STYLE_FOLDERS),
        "merged": sorted(MERGED_LABELS.items()), "stop_words": sorted(STOP_WORDS), "min_word_length": MIN_WORD_LENGTH,
        "min_count": int(min_count), "splits": [list(pair) for pair in SPLIT_FRACTIONS], "raster_size": RASTER_SIZE}


def cache_digest(root: Path, min_count: int) -> str:
    """The cache folder's name: a digest of the rule, the source folder and its listing (path, size, mtime)."""
    listing = ds.listing_digest((rel, info.st_size, info.st_mtime_ns) for rel, info in _entries(root))
    return ds.cache_key({"rule": rule_description(min_count), "root": str(root), "listing": listing})


def _raster_name(stamp: _Stamp) -> str:
    return ds.raster_name(PurePosixPath(stamp.relative).name, stamp.relative)


def _rasterise_all(stamps: list[_Stamp], images: Path, progress: bool | None) -> dict[str, str]:
    """Rasterise every stamp without a raster yet (resumable); the reason per stamp that failed."""
    failed: dict[str, str] = {}
    todo = [s for s in stamps if not (images / _raster_name(s)).is_file()]
    if not todo:
        return failed
    images.mkdir(parents=True, exist_ok=True)
    for stamp in ds.progress_bar(todo, "tuxpaint: rasterising (once)", "stamp", progress):
        reason = ds.write_raster(images / _raster_name(stamp), stamp.image, "tuxpaint")
        if reason:
            failed[stamp.relative] = reason
    return failed


def _build_manifest(root: Path, folder: Path, digest: str, min_count: int, progress: bool | None) -> dict[str, Any]:
    """Scan, label, rasterise (resumable) and return the manifest of one cache folder."""
    stamps = _scan(root)
    left_out: list[dict[str, str]] = []
    candidates = []
    for stamp in stamps:
        if _dropped(stamp.relative):
            left_out.append({"stamp": stamp.relative, "reason": "dropped folder"})
            continue
        stamp.labels = sorted(set(folder_labels(stamp.relative)) | set(description_labels(stamp.description)))
        candidates.append(stamp)
    images_dir = folder / "images"
    failed = _rasterise_all(candidates, images_dir, progress)
    merged: dict[str, dict[str, Any]] = {}
    for stamp in candidates:
        raster = images_dir / _raster_name(stamp)
        if stamp.relative in failed or not raster.is_file():
            left_out.append({"stamp": stamp.relative, "reason": "not rasterised",
                             "detail": failed.get(stamp.relative, "no raster")})
            continue
        key = ds.pixels_digest(raster)
        if key in merged:
            first = merged[key]
            first["labels"] = sorted(set(first["labels"]) | set(stamp.labels))
            first["sources"].append(stamp.image.relative_to(root).as_posix())
            left_out.append({"stamp": stamp.relative, "reason": "merged duplicate",
                             "detail": f"identical raster: merged into {first['stamp']}"})
            continue
        merged[key] = {"stamp": stamp.relative, "file": f"images/{raster.name}", "description": stamp.description,
                       "sources": [stamp.image.relative_to(root).as_posix()], "labels": stamp.labels}
    counter = Counter(label for image in merged.values() for label in image["labels"])
    classes, label_counts = ds.frequent(counter, min_count)
    kept = set(classes)
    images = []
    for image in merged.values():
        image["all_labels"] = image["labels"]
        image["labels"] = [label for label in image["labels"] if label in kept]
        if not image["labels"]:
            left_out.append({"stamp": image["stamp"], "reason": "no frequent label",
                             "detail": " ".join(image["all_labels"])})
            continue
        image["folder_class"] = deepest_folder_class(image["stamp"], kept)
        images.append(image)
    splits = ds.grouped_splits([stamp_group(i["stamp"]) for i in images], "tuxpaint-split", SPLIT_FRACTIONS)
    for image, split in zip(images, splits, strict=True):
        image["split"] = split
    return {
        "format": MANIFEST_FORMAT, "digest": digest, "source": str(root), "rule": rule_description(min_count),
        "counts": {"stamps": len(stamps), "images": len(images), "classes": len(classes),
                   "left_out": ds.reason_counts(left_out, _LEFT_OUT_REASONS)},
        "classes": classes, "label_counts": label_counts,
        "images": images, "left_out": left_out}


def ensure_tuxpaint(root: Path | str | None = None, min_count: int = MIN_CLASS_COUNT, cache_dir: Path | None = None,
                    progress: bool | None = None) -> tuple[Path, dict[str, Any]]:
    """``(cache folder, manifest)`` of the cleaned stamps, built (or resumed) first when needed."""
    least = ds.check_min_count("tuxpaint", min_count)
    source = resolve_root(root)
    digest = cache_digest(source, least)
    return ds.cached_manifest("tuxpaint", source, cache_dir, digest,
                           lambda folder: _build_manifest(source, folder, digest, least, progress))


# ----------------------------------------------------------------------------------------------------------------
# Loading


def load_tuxpaint(root: Path | str | None = None, view: str = "labels", min_count: int = MIN_CLASS_COUNT,
                  cache_dir: Path | None = None, progress: bool | None = None) -> DatasetSplits:
    """The cleaned Tux Paint stamps as :class:`DatasetSplits`, ``view`` ``labels`` or ``folders``."""
    if view not in VIEWS:
        raise DataError(f"tuxpaint: unknown view {view!r} (use view=folders, or no view for the full labels)")
    folder, manifest = ensure_tuxpaint(root, min_count, cache_dir, progress)
    if view == "folders":
        classes, parts, _ = folder_view_parts(folder, manifest["images"])
    else:
        classes = list(manifest["classes"])
        parts = split_parts(folder, manifest["images"], classes)
    splits = view_splits("tuxpaint", manifest["source"], view, VIEWS[0], min_count, MIN_CLASS_COUNT, classes, parts)
    emit_note(splits.notes, f"{splits.name}: {ds.split_counts(parts)}, {len(classes)} classes, "
              f"{ds.labels_per_image(parts)} labels per image (python -m models.sources.tuxpaint prints the rule)")
    return splits


def load_tuxpaint_spec(argument: str) -> DatasetSplits:
    """``tuxpaint[:DIR][?view=folders][&min-count=N]``: the Tux Paint stamps (module docstring)."""
    path, view, min_count = parse_spec("tuxpaint", argument, VIEWS, MIN_CLASS_COUNT)
    return load_tuxpaint(path or None, view=view, min_count=min_count)


# ----------------------------------------------------------------------------------------------------------------
# Command line


def report(folder: Path, manifest: dict[str, Any]) -> str:
    """The cleaning report of a built cache folder: counts per reason, labels per image, classes per split."""
    counts = manifest["counts"]
    lines = [f"cache: {folder}", f"source: {manifest['source']}", f"stamps: {counts['stamps']:,}",
             "left out / merged, by reason: " + ", ".join(f"{n} {r}" for r, n in counts["left_out"].items()),
             ds.images_line(manifest), *ds.class_lines(manifest, 14)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build the cache if needed and print the cleaning report; exit status 2 on a data error."""
    parser = ds.command_line_parser(
        "python -m models.sources.tuxpaint", f"The Tux Paint stamps (Debian package {DEBIAN_PACKAGE}) as a multi-label "
        "dataset: label them by the rule, rasterise them once into the cache, print the report.",
        f"default: {DEFAULT_ROOT}", MIN_CLASS_COUNT, "label", "also print the rule's folders, merges and stop words")
    args = parser.parse_args(argv)

    def show(folder: Path, manifest: dict[str, Any]) -> None:
        if args.rule:
            print(ds.rule_lines({"dropped folders": DROPPED_FOLDERS, "style folders": STYLE_FOLDERS}), end="")
            print("merged: " + ", ".join(f"{k}->{v}" for k, v in MERGED_LABELS.items()))
            print("stop words: " + " ".join(sorted(STOP_WORDS)))
        print(report(folder, manifest))

    return ds.run_command(lambda: ensure_tuxpaint(args.root, args.min_count, args.cache, progress=not args.quiet), show)


if __name__ == "__main__":
    sys.exit(main())
