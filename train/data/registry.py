"""One registry of dataset kinds, and ``load_dataset(spec)`` that turns a spec string into ``DatasetSplits``.

Spec forms: ``kind:argument`` with kind in ``DATASET_KINDS`` (``builtin:tiny``, ``builtin:default@seed3``,
``csv:path/labels.csv``, ``csv:folder``, ``voc:/data/VOCdevkit``, ``coco:/data/coco``, ``cub:/data/CUB_200_2011``,
``nus:/data/nus?images=/mnt/flickr&keep-unlabelled``, ``formatted:/data/voc?image-root=/mnt/voc``,
``folder:/data/pets``, ``openclipart:/usr/share/openclipart/svg?view=folders``), ``builtin`` alone
(= ``builtin:default``), ``openclipart`` alone (the Debian package's folder), or a bare path whose kind is detected
from its contents.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from train.data.coco import find_coco_year, load_coco
from train.data.csv_format import CSV_FILENAME, load_csv
from train.data.cub import find_cub_dir, load_cub
from train.data.folder import is_class_tree, load_folder_spec
from train.data.formatted import formatted_dataset_name, is_formatted_dir, load_formatted
from train.data.nus import is_nus_dir, load_nus_spec
from train.data.openclipart import load_openclipart_spec, openclipart_dataset_name
from train.data.spec_options import split_spec_options
from train.data.types import ALL_SPLITS, DataError, DatasetSplits, ObjectTable
from train.data.voc import find_voc_dirs, load_voc

__all__ = ["DATASET_KINDS", "describe_kinds", "detect_kind", "load_dataset", "parse_builtin_argument",
           "spec_dataset_name"]

DEFAULT_PRESET = "default"
_BUILTIN_ARG = re.compile(r"^(?P<preset>[A-Za-z0-9_.-]*)(?:@seed(?P<seed>\d+))?$")
_KIND_PREFIX = re.compile(r"^(?P<kind>[A-Za-z][A-Za-z0-9_-]+):(?P<arg>.*)$", re.DOTALL)


def parse_builtin_argument(argument: str) -> tuple[str, int]:
    """Parse ``preset[@seedN]`` (empty preset = ``default``, no seed = 0) into ``(preset, seed)``."""
    match = _BUILTIN_ARG.match(argument.strip())
    if match is None:
        raise DataError(f"bad builtin dataset spec 'builtin:{argument}' (use builtin:<preset>[@seed<N>])")
    return match.group("preset") or DEFAULT_PRESET, int(match.group("seed") or 0)


def _load_builtin(argument: str) -> DatasetSplits:
    """``builtin:<preset>[@seed<N>]``: generate (or reuse) the procedural dataset and load its CSV."""
    preset, seed = parse_builtin_argument(argument)
    from train.data.builtin import PRESETS, ensure_builtin  # lazy: only this kind needs the generator

    if preset not in PRESETS:
        raise DataError(
            f"unknown builtin preset {preset!r} (known: {', '.join(sorted(PRESETS))}); "
            "use builtin:<preset>[@seed<N>]"
        )
    folder = Path(ensure_builtin(preset=preset, seed=seed))
    splits = load_csv(folder / CSV_FILENAME)
    splits.name = f"builtin-{preset}"
    splits.source = f"builtin:{preset}@seed{seed}"
    train = splits.train

    def objects() -> ObjectTable:
        """The training images' shapes (train/data/builtin.py), for the label-bias protocols."""
        from train.data.builtin import builtin_objects

        return builtin_objects(preset, seed, train)

    splits.train_objects = objects
    splits.complete_splits = ALL_SPLITS  # procedural: every label is known
    return splits


def _csv_file(argument: str) -> Path:
    """Resolve a ``csv:`` argument: a CSV file, or a folder meaning ``folder/labels.csv``."""
    path = Path(argument).expanduser().resolve()
    if path.is_dir():
        csv_path = path / CSV_FILENAME
        if not csv_path.is_file():
            raise DataError(f"{path}: folder has no {CSV_FILENAME}")
        return csv_path
    if not path.is_file():
        raise DataError(f"{path}: CSV file not found")
    return path


def _load_csv_spec(argument: str) -> DatasetSplits:
    """``csv:<labels.csv or folder>``: load the generic CSV format."""
    return load_csv(_csv_file(argument))


def _load_voc_spec(argument: str) -> DatasetSplits:
    """``voc:<VOCdevkit or VOCdevkit/VOC20xx>``: load PASCAL VOC."""
    return load_voc(Path(argument))


def _load_coco_spec(argument: str) -> DatasetSplits:
    """``coco:<root with annotations/instances_*.json>[?reference]``: load MS-COCO (``reference``: the classes in
    the json's category order, as the seeds' format script)."""
    path, options = split_spec_options(argument, ("reference",), "coco")
    return load_coco(Path(path), reference="reference" in options)


def _load_cub_spec(argument: str) -> DatasetSplits:
    """``cub:<CUB_200_2011 folder or its parent>``: CUB-200-2011 with its 312 attributes as labels."""
    return load_cub(Path(argument))


DATASET_KINDS: dict[str, Callable[[str], DatasetSplits]] = {
    "builtin": _load_builtin,
    "csv": _load_csv_spec,
    "voc": _load_voc_spec,
    "coco": _load_coco_spec,
    "cub": _load_cub_spec,
    "nus": load_nus_spec,
    "formatted": load_formatted,
    "folder": load_folder_spec,
    "openclipart": load_openclipart_spec,
}
#: Kinds that also stand alone, meaning ``kind:`` with an empty argument (their default).
_STANDALONE_KINDS = ("builtin", "openclipart")

_FORMS: dict[str, str] = {
    "builtin": "builtin[:<preset>[@seed<N>]]   procedural dataset (presets: tiny, small, default, large; "
               "dense-tiny, dense-small, dense: with 7 attribute labels)",
    "csv": "csv:<labels.csv | folder>         generic CSV (image,labels[,split]; classes.txt optional)",
    "voc": "voc:<VOCdevkit | VOC20xx folder>  PASCAL VOC 2007/2012",
    "coco": "coco:<root>[?reference]           MS-COCO 2014/2017 (annotations/instances_*.json)",
    "cub": "cub:<CUB_200_2011 | its parent>    CUB-200-2011, 312 attributes as labels",
    "nus": "nus:<root>[?images=DIR][&keep-unlabelled]  NUS-WIDE, 81 concepts (images under root/Flickr)",
    "formatted": "formatted:<dir>[?image-root=P&dataset=voc|coco|nus|cub&resample]  the seeds' formatted_*.npy",
    "folder": "folder:<root>[?skip-verify]       one folder per class: root/<class>/<image> or "
              "root/{train,val,test}/<class>/<image>",
    "openclipart": "openclipart[:<svg dir>][?view=folders&min-count=N]  Open Clip Art Library 0.18 (Debian "
                   "openclipart-svg), uploader keywords as labels; view=folders: one label per image, its folder",
}


def describe_kinds() -> str:
    """Return a multi-line help text listing the accepted dataset spec forms (for the CLI ``--help``)."""
    lines = ["Dataset specs:"]
    lines += [f"  {_FORMS.get(kind, f'{kind}:<argument>')}" for kind in DATASET_KINDS]
    lines.append(
        "  <path>                            auto-detected: a .csv file or a folder with labels.csv, a VOC "
        "folder, a COCO root, a CUB_200_2011 folder, a NUS-WIDE root, a folder of formatted_*.npy files or a "
        "folder of class folders"
    )
    return "\n".join(lines)


def detect_kind(path: Path) -> str | None:
    """Return the dataset kind (``csv``/``voc``/``coco``/``cub``/``nus``/``formatted``/``folder``) of an existing
    bare path, or None."""
    path = Path(path).expanduser().resolve()
    if path.is_file():
        return "csv" if path.suffix.lower() == ".csv" else None
    if not path.is_dir():
        return None
    if (path / CSV_FILENAME).is_file():
        return "csv"
    if is_formatted_dir(path):
        return "formatted"
    if find_voc_dirs(path):
        return "voc"
    if find_coco_year(path) is not None or any((path / "annotations").glob("instances_*.json")):
        return "coco"
    if find_cub_dir(path) is not None:
        return "cub"
    if is_nus_dir(path):
        return "nus"
    if is_class_tree(path):
        return "folder"
    return None


def spec_dataset_name(spec: str) -> str:
    """The dataset name a spec will load under, without loading it: ``builtin-<preset>``, ``voc``, ``coco``,
    ``cub``, ``nus``, ``openclipart`` (``openclipart-folders`` for its folder view), a formatted folder's family or
    name, a CSV's or a class tree's folder name (enough for
    :func:`train.methods.base.dataset_family`); ``""`` if unknown."""
    spec = spec.strip()
    match = _KIND_PREFIX.match(spec)
    if spec == "builtin" or (match is not None and match.group("kind") == "builtin"):
        argument = match.group("arg") if match is not None else ""
        try:
            return f"builtin-{parse_builtin_argument(argument)[0]}"
        except DataError:
            return "builtin"
    if match is not None and match.group("kind") in DATASET_KINDS:
        kind, argument = match.group("kind"), match.group("arg")
    else:
        kind, argument = (detect_kind(Path(spec)) or "") if spec else "", spec
    if kind in ("voc", "coco", "cub", "nus"):
        return kind
    if spec == "openclipart" or kind == "openclipart":
        return openclipart_dataset_name(argument if kind == "openclipart" else "")
    if kind == "formatted":
        return formatted_dataset_name(argument)
    if kind == "csv":
        path = Path(argument).expanduser()
        return (path if path.is_dir() else path.parent).resolve().name
    if kind == "folder":
        return Path(argument.partition("?")[0]).expanduser().absolute().name
    return ""


def load_dataset(spec: str) -> DatasetSplits:
    """Load the dataset named by ``spec`` (``kind:argument``, ``builtin``, or a bare path) as DatasetSplits.

    An unknown kind or a path whose kind cannot be detected raises ``DataError`` listing the accepted forms.
    """
    spec = spec.strip()
    if not spec:
        raise DataError(f"empty dataset spec\n{describe_kinds()}")
    if spec in _STANDALONE_KINDS:
        return DATASET_KINDS[spec]("")
    if spec in DATASET_KINDS and not Path(spec).exists():
        raise DataError(f"dataset spec {spec!r} needs an argument: {_FORMS.get(spec, spec)}")
    match = _KIND_PREFIX.match(spec)
    if match is not None and match.group("kind") in DATASET_KINDS:
        return DATASET_KINDS[match.group("kind")](match.group("arg"))

    path = Path(spec).expanduser()
    if path.exists():
        kind = detect_kind(path)
        if kind is None:
            raise DataError(f"{path.resolve()}: cannot tell what kind of dataset this is\n{describe_kinds()}")
        return DATASET_KINDS[kind](str(path))
    if match is not None:
        raise DataError(
            f"unknown dataset kind {match.group('kind')!r} in {spec!r} "
            f"(known: {', '.join(DATASET_KINDS)})\n{describe_kinds()}"
        )
    raise DataError(f"{path.resolve()}: no such file or folder\n{describe_kinds()}")
