"""Class-per-folder image trees, ``folder:ROOT`` (docs/datasets.md, "folder"). Identical files under several class
folders are ONE image with several positives; every problem of the tree is reported at once in one
:class:`DataError`."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
from PIL import Image
from tqdm import tqdm

from models.data.csv_format import CLASSES_FILENAME, emit_note, read_classes_file
from models.data.spec_options import split_spec_options
from models.data.types import DataError, DatasetSplits, LabelledImages
from models.files.digest import file_blake2b
from models.files.folder_walk import is_hidden, walk_folder
from models.files.image_extensions import is_image_name

__all__ = ["FOLDER_OPTIONS", "is_class_tree", "load_folder", "load_folder_spec"]

SPLIT_NAMES = ("train", "val", "test")
FOLDER_OPTIONS = ("skip-verify",)
_IO_THREADS = 8

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class _File:
    """One image file found in the tree."""

    split: str
    cls: str
    path: Path  # as found under ROOT (not resolved: a symlink keeps its own name)
    size: int = -1
    inode: tuple[int, int] = (0, 0)


@dataclass
class _Image:
    """One distinct image (identical bytes): every file that holds it."""

    files: list[_File] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.files[0].path


def _subfolders(folder: Path) -> list[Path]:
    """The sub-folders of ``folder`` the one folder walk enters (not hidden, not symbolic links), sorted by name."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise DataError(f"{folder}: cannot list the folder: {exc.strerror or exc}") from exc
    return [Path(e.path) for e in entries if not is_hidden(e.name) and e.is_dir(follow_symlinks=False)]


def _layout(root: Path) -> dict[str, Path]:
    """Split name -> folder whose sub-folders are the classes: ``{"train": root}`` for the flat layout."""
    folders = _subfolders(root)
    split_folders = [f for f in folders if f.name.lower() in SPLIT_NAMES]
    if not split_folders:
        return {"train": root}
    others = [f.name for f in folders if f.name.lower() not in SPLIT_NAMES]
    if others:
        raise DataError(
            f"{root}: has split folders ({', '.join(f.name for f in split_folders)}) beside other folders "
            f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); use either ROOT/<class>/<image> or "
            "ROOT/{train,val,test}/<class>/<image>")
    by_split: dict[str, Path] = {}
    for folder in split_folders:
        name = folder.name.lower()
        if name in by_split:
            raise DataError(f"{root}: two folders for split {name!r}: {by_split[name].name} and {folder.name}")
        by_split[name] = folder
    return by_split


def is_class_tree(path: Path) -> bool:
    """True when ``path`` looks like a class-per-folder tree (cheap: no deep walk)."""
    path = Path(path)
    if not path.is_dir():
        return False
    try:
        folders = _subfolders(path)
    except DataError:
        return False
    if not folders:
        return False
    if all(f.name.lower() in SPLIT_NAMES for f in folders):
        return True
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                if any(e.is_file() and is_image_name(e.name) and not is_hidden(e.name) for e in entries):
                    return True
        except OSError:
            continue
    return False


def _walk_images(folder: Path, ignored: list[Path], linked: list[Path], unreadable: list[str]) -> list[Path]:
    """Every image file below ``folder``, sorted; the rest counted in ``ignored``, ``linked``, ``unreadable``."""
    listing = walk_folder(folder)
    ignored += listing.ignored()
    linked += listing.linked_folders
    unreadable += [f"cannot list folder {where}: {reason}" for where, reason in listing.unreadable]
    return sorted(listing.images())


def _parallel(func: Callable[[_T], _R], items: list[_T], desc: str, progress: bool | None) -> list[_R]:
    """``[func(item) for item in items]`` on a few threads (file I/O), with a tqdm bar on stderr."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:
        results = pool.map(func, items)
        return list(tqdm(results, total=len(items), desc=desc, unit="file", file=sys.stderr, leave=False,
                         disable=None if progress is None else not progress))


def _content_hash(path: Path) -> str:
    """BLAKE2b of the file's bytes (hex); raises OSError when it cannot be read."""
    return file_blake2b(path, 20)


def _try_hash(path: Path) -> str | OSError:
    try:
        return _content_hash(path)
    except OSError as exc:
        return exc


def _verify(path: Path) -> str | None:
    """None when PIL can open and verify the image, else the reason it cannot."""
    try:
        with Image.open(path) as image:
            image.verify()
    except Exception as exc:  # PIL raises many types for broken files
        return f"{type(exc).__name__}: {exc}"
    return None


def _group_identical(files: list[_File], problems: list[str], progress: bool | None) -> list[_Image]:
    """Group files by identical content (size, then inode, then hash); unreadable files become problems."""
    by_size: dict[int, list[_File]] = defaultdict(list)
    for f in files:
        by_size[f.size].append(f)
    keys: dict[int, tuple[object, ...]] = {}  # id(file) -> identity key
    to_hash: dict[tuple[int, int], Path] = {}  # one path per inode that needs a hash
    for group in by_size.values():
        if len({f.inode for f in group}) == 1:  # one file, or links to one file: identical without reading
            for f in group:
                keys[id(f)] = ("inode", *f.inode)
        else:
            for f in group:
                to_hash.setdefault(f.inode, f.path)
    inodes = list(to_hash)
    digests = dict(zip(inodes, _parallel(_try_hash, [to_hash[i] for i in inodes], "folder: hashing", progress),
                       strict=True))
    groups: dict[tuple[object, ...], _Image] = {}
    for f in files:
        key = keys.get(id(f))
        if key is None:
            digest = digests[f.inode]
            if isinstance(digest, OSError):
                problems.append(f"unreadable image: {f.path} ({digest.strerror or digest})")
                continue
            key = ("sha", f.size, digest)
        groups.setdefault(key, _Image()).files.append(f)
    return list(groups.values())


def _describe_problems(root: Path, problems: list[str]) -> str:
    lines = [f"{root}: {len(problems)} problem(s) in this image folder tree (nothing was trained):"]
    lines += [f"  - {p}" for p in problems]
    lines.append("expected layout: ROOT/<class>/<image> or ROOT/{train,val,test}/<class>/<image> "
                 f"(optional ROOT/{CLASSES_FILENAME})")
    return "\n".join(lines)


def load_folder(root: Path, verify: bool = True, progress: bool | None = None) -> DatasetSplits:
    """Load a class-per-folder tree as :class:`DatasetSplits` (``verify``: open every image first)."""
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise DataError(f"{root}: no such folder")
    layout = _layout(root)
    problems: list[str] = []
    ignored: list[Path] = []
    linked: list[Path] = []  # symbolic links to folders: not entered (the one folder walk's rule)
    if "train" not in layout:
        problems.append(f"no train folder (found {', '.join(sorted(layout))}); the training split is required")

    files: list[_File] = []
    folder_classes: dict[str, set[str]] = defaultdict(set)  # class -> splits it has a folder in
    for split, split_dir in layout.items():
        try:
            entries = sorted(os.scandir(split_dir), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"cannot list folder {split_dir}: {exc.strerror or exc}")
            continue
        class_dirs = []
        for entry in entries:
            if is_hidden(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                class_dirs.append(Path(entry.path))
            elif entry.is_dir():
                linked.append(Path(entry.path))
            elif is_image_name(entry.name):
                problems.append(f"image outside any class folder: {entry.path}")
            elif entry.name != CLASSES_FILENAME or split_dir != root:
                ignored.append(Path(entry.path))
        if not class_dirs:
            problems.append(f"no class folders in {split_dir}")
        for class_dir in class_dirs:
            images = _walk_images(class_dir, ignored, linked, problems)
            folder_classes[class_dir.name].add(split)
            if not images:
                problems.append(f"empty class folder (no image file): {class_dir}")
            files += [_File(split, class_dir.name, path) for path in images]

    class_file = root / CLASSES_FILENAME
    if class_file.is_file():
        classes = read_classes_file(class_file)
        listed = set(classes)
        problems += [f"class folder {name!r} is not listed in {class_file}" for name in sorted(folder_classes)
                     if name not in listed]
    else:
        classes = sorted(folder_classes)
    have_training = {f.cls for f in files if f.split == "train"}
    if "train" in layout:  # an empty train/<class> folder is reported above; a missing one here
        problems += [f"class {name!r} has no training image (no folder {layout['train'] / name})"
                     for name in classes if name not in have_training and "train" not in folder_classes[name]]

    kept: list[_File] = []
    for f in files:
        try:
            info = os.stat(f.path)
        except OSError as exc:  # a dangling symlink, a permission problem
            problems.append(f"unreadable image: {f.path} ({exc.strerror or exc})")
            continue
        f.size, f.inode = info.st_size, (info.st_dev, info.st_ino)
        kept.append(f)
    images = _group_identical(kept, problems, progress)
    for image in images:
        image.files.sort(key=lambda f: (SPLIT_NAMES.index(f.split), str(f.path)))
    if verify:
        reasons = _parallel(_verify, [image.path for image in images], "folder: checking images", progress)
        problems += [f"corrupt or unreadable image: {image.path} ({reason})"
                     for image, reason in zip(images, reasons, strict=True) if reason is not None]
    for image in images:
        splits = sorted({f.split for f in image.files}, key=SPLIT_NAMES.index)
        if len(splits) > 1:
            where = ", ".join(str(f.path) for f in image.files)
            problems.append(f"the same image is in splits {' and '.join(splits)}: {where}")
    if problems:
        raise DataError(_describe_problems(root, problems))
    return _build_splits(root, layout, classes, images, ignored, linked)


def _build_splits(root: Path, layout: dict[str, Path], classes: list[str], images: list[_Image],
                  ignored: list[Path], linked: list[Path]) -> DatasetSplits:
    index = {name: i for i, name in enumerate(classes)}
    by_split: dict[str, list[_Image]] = {split: [] for split in SPLIT_NAMES}
    for image in images:
        by_split[image.files[0].split].append(image)

    def build(items: Iterable[_Image]) -> LabelledImages:
        ordered = sorted(items, key=lambda image: str(image.path))
        labels = np.zeros((len(ordered), len(classes)), dtype=np.uint8)
        for row, image in enumerate(ordered):
            for f in image.files:
                labels[row, index[f.cls]] = 1
        return LabelledImages([image.path for image in ordered], labels, list(classes))

    notes: list[str] = []
    splits = {split: build(items) for split, items in by_split.items() if items}
    sizes = ", ".join(f"{split} {len(part)}" for split, part in splits.items())
    emit_note(notes, f"folder: {len(images)} images in {len(classes)} class folders ({sizes}); "
              + ("class order from classes.txt" if (root / CLASSES_FILENAME).is_file() else "classes sorted by name"))
    multi = [image for image in images if len({f.cls for f in image.files}) > 1]
    if multi:
        files = sum(len(image.files) for image in multi)
        emit_note(notes, f"folder: {len(multi)} images are filed under several class folders ({files} files, "
                  "identical bytes): each is one image with several positive labels")
    doubled = sum(len(image.files) - len({f.cls for f in image.files}) for image in images)
    if doubled:
        emit_note(notes, f"folder: {doubled} files are copies of another file in the same class folder; each "
                  "image counts once")
    if ignored:
        emit_note(notes, f"folder: {len(ignored)} files ignored (not an image by their extension, or hidden), "
                  f"e.g. {ignored[0]}")
    if linked:
        emit_note(notes, f"folder: {len(linked)} symbolic links to folders not followed (the folder walk's rule, "
                  f"docs/datasets.md), e.g. {linked[0]}")
    return DatasetSplits(
        name=root.name, source=f"folder:{root}", classes=list(classes), train=splits["train"],
        val=splits.get("val"), test=splits.get("test"), notes=notes)


def load_folder_spec(argument: str) -> DatasetSplits:
    """``folder:ROOT[?skip-verify]``: a class-per-folder image tree (module docstring)."""
    path, options = split_spec_options(argument, FOLDER_OPTIONS, "folder")
    if not path.strip():
        raise DataError("folder: needs a path: folder:ROOT (ROOT/<class>/<image> or ROOT/{train,val,test}/<class>/)")
    return load_folder(Path(path.strip()), verify="skip-verify" not in options)
