"""The "formatted .npy" layout of the seeds' reference repositories (Cole et al. 2021), ``formatted:DIR``
(docs/datasets.md, "formatted"). As in the seeds' ``datasets.py``, the "val" files are the TEST split."""

from __future__ import annotations

import os
from pathlib import Path, PurePath

import numpy as np

from models.data.coco import coco_objects
from models.data.csv_format import CLASSES_FILENAME, emit_note, read_classes_file
from models.data.families import DATASET_FAMILIES, family_named
from models.data.spec_options import split_spec_options
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages, ObjectTable

__all__ = ["FORMATTED_FILES", "OBSERVED_NPY", "formatted_dataset_name", "formatted_family", "is_formatted_dir",
           "load_formatted",
           "load_label_matrix"]

FORMATTED_FILES = ("formatted_train_images.npy", "formatted_train_labels.npy", "formatted_val_images.npy",
                   "formatted_val_labels.npy")
OBSERVED_NPY = "formatted_train_labels_obs.npy"
OPTIONS = ("image-root", "dataset", "resample")
# where the seeds' datasets.py (get_metadata) keeps each dataset's images, relative to its data folder
_IMAGE_FOLDERS: dict[str, tuple[str, ...]] = {
    "voc": ("VOCdevkit/VOC2012/JPEGImages",), "coco": (), "nus": ("Flickr",),
    "cub": ("CUB_200_2011/images", "CUB_200_2011/CUB_200_2011/images")}


def is_formatted_dir(path: Path) -> bool:
    """True when ``path`` is a folder holding the seeds' ``formatted_train_images.npy``."""
    return (Path(path) / FORMATTED_FILES[0]).is_file()


def _load_array(path: Path) -> np.ndarray:
    """``np.load`` without pickles; unreadable or pickled files -> ``DataError`` naming the file."""
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"{path}: holds Python objects (a pickled array), which are not loaded for safety; "
                        "save the paths as a string array (np.array(list_of_str))") from exc
    except OSError as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from exc


def _load_paths(path: Path) -> list[str]:
    """An array of image paths (unicode or bytes strings) as a list of ``str``."""
    array = _load_array(path)
    if array.ndim != 1 or array.dtype.kind not in "US":
        raise DataError(f"{path}: expected a 1-D array of image path strings, found dtype {array.dtype} "
                        f"and shape {array.shape}")
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array.tolist()]


def load_label_matrix(path: Path, rows: int, allowed: tuple[int, ...] = (0, 1)) -> np.ndarray:
    """The int8 label matrix in ``path``, every value in ``allowed`` (``DataError`` naming a bad cell)."""
    array = _load_array(path)
    if array.ndim != 2 or array.shape[0] != rows:
        raise DataError(f"{path}: expected a ({rows}, C) label matrix (one row per image), found shape {array.shape}")
    bad = ~np.isin(array, allowed)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(f"{path}: row {row}, column {col} holds {array[row, col]!r}; labels must be "
                        f"{' or '.join(map(str, allowed))}")
    return array.astype(np.int8)


#: The families a formatted folder may hold: the seeds' four benchmarks (:mod:`models.data.families`).
_KNOWN = {name: family for name, family in DATASET_FAMILIES.items() if family.classes is not None}


def _family(root: Path, num_classes: int, override: str | None) -> str | None:
    """The family of ``root``: ``override`` (checked), else the one named by the folder with this class count."""
    if override is None:
        family = _KNOWN.get(family_named(root.name) or "")
        return family.name if family is not None and len(family.classes or ()) == num_classes else None
    if override not in _KNOWN:
        raise DataError(f"formatted:{root}?dataset={override}: unknown dataset (known: {', '.join(_KNOWN)})")
    expected = len(_KNOWN[override].classes or ())
    if expected != num_classes:
        raise DataError(f"formatted:{root}?dataset={override}: {override} has {expected} classes but the label "
                        f"files have {num_classes}")
    return override


def _classes(root: Path, num_classes: int, family: str | None, notes: list[str]) -> list[str]:
    """Class names from ``classes.txt``, else the known family's, else generic ``class_NNN``."""
    sidecar = root / CLASSES_FILENAME
    if sidecar.is_file():
        names = read_classes_file(sidecar)
        if len(names) != num_classes:
            raise DataError(f"{sidecar}: lists {len(names)} classes but the label files have {num_classes} columns")
        return names
    if family is not None:
        return list(_KNOWN[family].classes or ())
    emit_note(notes, f"formatted: no {CLASSES_FILENAME} in {root} and not a known dataset; using generic names "
              f"class_000..class_{num_classes - 1:03d} (add {CLASSES_FILENAME}, or ?dataset=voc|coco|nus|cub)")
    return [f"class_{i:03d}" for i in range(num_classes)]


def _image_roots(root: Path, family: str | None, image_root: str | None) -> list[Path]:
    """Folders to resolve relative paths against, in order of preference."""
    if image_root is not None:
        return [Path(image_root).expanduser().resolve()]
    families = [family] if family else list(_IMAGE_FOLDERS)
    return [root, *(root / sub for fam in families for sub in _IMAGE_FOLDERS[fam])]


def _rerooted(path: PurePath, image_root: Path) -> int | None:
    """How many leading folders of absolute ``path`` to drop so that it exists under ``image_root``."""
    parts = path.parts[1:]
    for drop in range(len(parts)):
        if (image_root.joinpath(*parts[drop:])).is_file():
            return drop + 1
    return None


def _resolve(raw: list[str], root: Path, family: str | None, image_root: str | None, spec: str) -> list[Path]:
    """Absolute image paths for the strings in the .npy files; an error names the first missing image."""
    if not raw:
        return []
    roots = _image_roots(root, family, image_root)
    first = PurePath(raw[0])
    base = next((r for r in roots if (r / first).is_file()), roots[0])
    drop = _rerooted(first, roots[0]) if first.is_absolute() and image_root is not None else None

    def resolve(text: str) -> Path:
        path = PurePath(text)
        if not path.is_absolute():
            return base / path
        if drop is not None:
            return base.joinpath(*path.parts[drop:])
        return Path(path)

    paths = [resolve(text) for text in raw]
    missing = [(text, p) for text, p in zip(raw, paths, strict=True) if not os.path.isfile(p)]
    if missing:
        text, path = missing[0]
        tried = ", ".join(str(r) for r in roots)
        hint = ("" if image_root is not None else f"; image folders tried: {tried}; name the folder the paths are "
                "relative to with ?image-root=PATH")
        raise DataError(f"{spec}: {len(missing)} of {len(raw)} images missing; first: {path} (from {text!r}){hint}")
    return paths


def _spec_family(argument: str) -> tuple[Path, str] | None:
    """The folder of ``formatted:argument`` and its family from the label file's header; None if unreadable."""
    try:
        path_text, options = split_spec_options(argument, OPTIONS, "formatted")
        root = Path(path_text).expanduser().resolve()
        labels = np.load(root / FORMATTED_FILES[1], mmap_mode="r", allow_pickle=False)
        return root, _family(root, int(labels.shape[1]), options.get("dataset")) or ""
    except (DataError, OSError, ValueError, IndexError):
        return None


def formatted_family(argument: str) -> str:
    """The family of ``formatted:argument`` without loading it (``""``: none or unreadable)."""
    found = _spec_family(argument)
    return found[1] if found is not None else ""


def formatted_dataset_name(argument: str) -> str:
    """The dataset name ``formatted:argument`` loads under, without loading it (``""`` if unreadable)."""
    found = _spec_family(argument)
    return "" if found is None else found[1] or found[0].name


def load_formatted(argument: str) -> DatasetSplits:
    """``formatted:DIR[?image-root=PATH&dataset=NAME&resample]`` as DatasetSplits."""
    path_text, options = split_spec_options(argument, OPTIONS, "formatted")
    root = Path(path_text).expanduser().resolve()
    spec = f"formatted:{root}"
    if not root.is_dir():
        raise DataError(f"{spec}: no such folder")
    missing = [name for name in FORMATTED_FILES if not (root / name).is_file()]
    if missing:
        raise DataError(f"{root}: missing {', '.join(missing)} (a formatted folder holds {', '.join(FORMATTED_FILES)}"
                        f" and optionally {OBSERVED_NPY})")
    train_raw = _load_paths(root / FORMATTED_FILES[0])
    test_raw = _load_paths(root / FORMATTED_FILES[2])
    train_labels = load_label_matrix(root / FORMATTED_FILES[1], len(train_raw))
    test_labels = load_label_matrix(root / FORMATTED_FILES[3], len(test_raw))
    if train_labels.shape[1] != test_labels.shape[1]:
        raise DataError(f"{root}: {FORMATTED_FILES[1]} has {train_labels.shape[1]} classes but {FORMATTED_FILES[3]} "
                        f"has {test_labels.shape[1]}")
    notes: list[str] = []
    family = _family(root, train_labels.shape[1], options.get("dataset"))
    classes = _classes(root, train_labels.shape[1], family, notes)
    image_root = options.get("image-root") or None
    train = LabelledImages(_resolve(train_raw, root, family, image_root, spec), train_labels, classes)
    test = LabelledImages(_resolve(test_raw, root, family, image_root, spec), test_labels, classes)
    query = argument.partition("?")[2]
    source = f"{spec}?{query}" if query else spec  # absolute: export finds the images again from any folder
    splits = DatasetSplits(name=family or root.name, source=source, classes=classes, train=train,
                           test=test, notes=notes, complete_splits=ALL_SPLITS, family=family or "")
    observed_path = root / OBSERVED_NPY
    if observed_path.is_file() and "resample" not in options:
        observed = load_label_matrix(observed_path, len(train_raw), allowed=(-1, 0, 1))
        if observed.shape[1] != len(classes):
            raise DataError(f"{observed_path}: has {observed.shape[1]} classes but the label files have {len(classes)}")
        splits.train_observed = observed.astype(np.int8)
        splits.observed_source = OBSERVED_NPY
    instances = root / "annotations" / "instances_train2014.json"
    if instances.is_file():  # the seeds' data/coco folder: the objects of the label-bias protocols
        splits.train_objects = lambda: _coco_objects(instances, train_raw)
    return splits


def _coco_objects(instances: Path, names: list[str]) -> ObjectTable:
    """The objects of the formatted COCO images ``names`` from the instance json beside the files."""
    try:
        ids = [int(PurePath(name).stem.rsplit("_", 1)[-1]) for name in names]
    except ValueError as exc:
        raise DataError(f"{instances.parent.parent}: a formatted image name carries no COCO image id ({exc})") from exc
    return coco_objects(instances, ids)
