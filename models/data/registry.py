"""One table of dataset kinds (:data:`DATASET_KINDS`) and :func:`load_dataset`, which turns a spec (``kind:argument``, a
standalone name, or a bare path whose kind is detected) into ``DatasetSplits``."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from models.data.coco import find_coco_year, load_coco
from models.data.csv_format import CSV_FILENAME, load_csv
from models.data.cub import find_cub_dir, load_cub
from models.data.drawing_cache import dataset_name as drawing_set_name
from models.data.families import family_named
from models.data.folder import is_class_tree, load_folder_spec
from models.data.formatted import formatted_dataset_name, formatted_family, is_formatted_dir, load_formatted
from models.data.nus import is_nus_dir, load_nus_spec
from models.data.spec_options import split_spec_options
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, ObjectTable
from models.data.voc import find_voc_dirs, load_voc
from models.registry import Row, Table, unknown_message

__all__ = ["DATASET_KINDS", "DatasetKind", "describe_kinds", "detect_kind", "load_dataset", "parse_builtin_argument",
           "spec_dataset_name", "spec_family"]

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
    from models.sources.builtin import BUILTIN_PRESETS, ensure_builtin  # lazy: only this kind needs the generator

    if preset not in BUILTIN_PRESETS:
        raise DataError(f"{unknown_message('builtin preset', preset, BUILTIN_PRESETS)}; use builtin:<preset>[@seed<N>]")
    folder = Path(ensure_builtin(preset=preset, seed=seed))
    splits = load_csv(folder / CSV_FILENAME)
    splits.name = f"builtin-{preset}"
    splits.source = f"builtin:{preset}@seed{seed}"
    train = splits.train

    def objects() -> ObjectTable:
        """The training images' shapes (models/sources/builtin.py), for the label-bias protocols."""
        from models.sources.builtin import builtin_objects

        return builtin_objects(preset, seed, train)

    splits.train_objects = objects
    splits.complete_splits = ALL_SPLITS  # procedural: every label is known
    return splits


def _builder(name: str) -> Callable[[str], object]:
    """``models.sources.<module>.<function>``, imported only when called."""
    module, _, function = name.partition(".")
    return lambda argument: getattr(importlib.import_module(f"models.sources.{module}"), function)(argument)


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


def _load_coco_spec(argument: str) -> DatasetSplits:
    """``coco:<root>[?reference]``: MS-COCO (``reference``: classes in the json's order)."""
    path, options = split_spec_options(argument, ("reference",), "coco")
    return load_coco(Path(path), reference="reference" in options)


def _builtin_name(argument: str) -> str:
    """``builtin-<preset>`` (``builtin`` for an argument that does not parse)."""
    try:
        return f"builtin-{parse_builtin_argument(argument)[0]}"
    except DataError:
        return "builtin"


def _csv_name(argument: str) -> str:
    """The name of the CSV's folder."""
    path = Path(argument).expanduser()
    return (path if path.is_dir() else path.parent).resolve().name


def _folder_name(argument: str) -> str:
    """The name of the class tree's root folder."""
    return Path(argument.partition("?")[0]).expanduser().absolute().name


def _family_by_name(name_of: Callable[[str], str]) -> Callable[[str], str]:
    """The family whose names include the folder name ``name_of(argument)``."""
    return lambda argument: family_named(name_of(argument)) or ""


def _is_csv(path: Path) -> bool:
    """A ``.csv`` file, or a folder holding ``labels.csv``."""
    return path.suffix.lower() == ".csv" if path.is_file() else (path / CSV_FILENAME).is_file()


def _is_coco(path: Path) -> bool:
    """A COCO root: instance jsons of a known year, or any ``annotations/instances_*.json``."""
    return find_coco_year(path) is not None or any((path / "annotations").glob("instances_*.json"))


@dataclass(frozen=True)
class DatasetKind:
    """One kind of dataset spec: its name, loader, help form, path detection, family and dataset name."""

    name: str
    load: Callable[[str], DatasetSplits]
    form: str
    dataset_name: Callable[[str], str]
    detect: Callable[[Path], bool] | None = None
    family: str = ""
    find_family: Callable[[str], str] | None = None
    standalone: bool = False

    def family_of(self, argument: str) -> str:
        """The family of the dataset ``name:argument`` (``""``: none), without loading it."""
        return self.family or (self.find_family(argument) if self.find_family is not None else "")


#: The kinds, in the order a bare path is detected (the first whose detector accepts it loads it).
DATASET_KINDS: Table[DatasetKind] = Table("dataset kind", [Row(kind.name, kind.form, kind) for kind in (
    DatasetKind("builtin", _load_builtin, "builtin[:<preset>[@seed<N>]]   procedural dataset (presets: tiny, small, "
                "default, large; dense-tiny, dense-small, dense: with 7 attribute labels)", _builtin_name,
                family="builtin", standalone=True),
    DatasetKind("csv", lambda argument: load_csv(_csv_file(argument)), "csv:<labels.csv | folder>         generic "
                "CSV (image,labels[,split]; classes.txt optional)", _csv_name, detect=_is_csv,
                find_family=_family_by_name(_csv_name)),
    DatasetKind("formatted", load_formatted, "formatted:<dir>[?image-root=P&dataset=voc|coco|nus|cub&resample]  the "
                "seeds' formatted_*.npy", formatted_dataset_name, detect=is_formatted_dir,
                find_family=formatted_family),
    DatasetKind("voc", load_voc, "voc:<VOCdevkit | VOC20xx folder>  PASCAL VOC 2007/2012", lambda _: "voc",
                detect=lambda path: bool(find_voc_dirs(path)), family="voc"),
    DatasetKind("coco", _load_coco_spec, "coco:<root>[?reference]           MS-COCO 2014/2017 "
                "(annotations/instances_*.json)", lambda _: "coco", detect=_is_coco, family="coco"),
    DatasetKind("cub", load_cub, "cub:<CUB_200_2011 | its parent>    CUB-200-2011, 312 attributes as labels",
                lambda _: "cub", detect=lambda path: find_cub_dir(path) is not None, family="cub"),
    DatasetKind("nus", load_nus_spec, "nus:<root>[?images=DIR][&keep-unlabelled]  NUS-WIDE, 81 concepts (images "
                "under root/Flickr)", lambda _: "nus", detect=is_nus_dir, family="nus"),
    DatasetKind("folder", load_folder_spec, "folder:<root>[?skip-verify]       one folder per class: "
                "root/<class>/<image> or root/{train,val,test}/<class>/<image>", _folder_name, detect=is_class_tree,
                find_family=_family_by_name(_folder_name)),
    DatasetKind("openclipart", _builder("openclipart.load_openclipart_spec"), "openclipart[:<svg dir>][?view="
                "folders&min-count=N]  Open Clip Art Library 0.18 (Debian openclipart-svg), uploader keywords as "
                "labels; view=folders: one label per image, its folder", partial(drawing_set_name, "openclipart"),
                standalone=True),
    DatasetKind("tuxpaint", _builder("tuxpaint.load_tuxpaint_spec"), "tuxpaint[:<stamps dir>][?view=folders&"
                "min-count=N]  Tux Paint's stamps (Debian tuxpaint-stamps-default), folders and description words "
                "as labels; view=folders: one label per image, its folder", partial(drawing_set_name, "tuxpaint"),
                standalone=True),
    DatasetKind("icons", _builder("icon_sets.load_icon_set_spec"), "icons:<npm package dir>[?min-count=N]  an npm "
                "icon set (Tabler, Lucide), its keyword tags as labels", _builder("icon_sets.icon_set_dataset_name")),
)])


def describe_kinds() -> str:
    """Return a multi-line help text listing the accepted dataset spec forms (for the CLI ``--help``)."""
    lines = ["Dataset specs:"]
    lines += [f"  {kind.form}" for kind in DATASET_KINDS.values()]
    lines.append("  <path>                            auto-detected: a .csv file or a folder with labels.csv, a VOC "
                 "folder, a COCO root, a CUB_200_2011 folder, a NUS-WIDE root, a folder of formatted_*.npy files or a "
                 "folder of class folders")
    return "\n".join(lines)


def detect_kind(path: Path) -> str | None:
    """The dataset kind of an existing bare path, or None."""
    path = Path(path).expanduser().resolve()
    if not path.exists():
        return None
    return next((kind.name for kind in DATASET_KINDS.values() if kind.detect is not None and kind.detect(path)), None)


def _spec_kind(spec: str) -> tuple[DatasetKind | None, str]:
    """The kind of ``spec`` and its argument, without loading (None when undetected)."""
    spec = spec.strip()
    if spec in DATASET_KINDS and DATASET_KINDS[spec].standalone:
        return DATASET_KINDS[spec], ""
    match = _KIND_PREFIX.match(spec)
    if match is not None and match.group("kind") in DATASET_KINDS:
        return DATASET_KINDS[match.group("kind")], match.group("arg")
    kind = detect_kind(Path(spec)) if spec else None
    return (DATASET_KINDS[kind] if kind is not None else None), spec


def spec_dataset_name(spec: str) -> str:
    """The dataset name a spec will load under, without loading it; ``""`` if unknown."""
    kind, argument = _spec_kind(spec)
    return kind.dataset_name(argument) if kind is not None else ""


def spec_family(spec: str) -> str:
    """The family of the dataset a spec names, without loading it; ``""`` for none."""
    kind, argument = _spec_kind(spec)
    return kind.family_of(argument) if kind is not None else ""


def load_dataset(spec: str) -> DatasetSplits:
    """Load the dataset ``spec`` as DatasetSplits; ``DataError`` listing the forms when unknown."""
    spec = spec.strip()
    if not spec:
        raise DataError(f"empty dataset spec\n{describe_kinds()}")
    if spec in DATASET_KINDS and DATASET_KINDS[spec].standalone:
        return _load(DATASET_KINDS[spec], "")
    name, query_mark, query = spec.partition("?")
    if query_mark and name in DATASET_KINDS and DATASET_KINDS[name].standalone and not Path(spec).exists():
        return _load(DATASET_KINDS[name], f"?{query}")  # openclipart?view=folders: the default source, options
    if spec in DATASET_KINDS and not Path(spec).exists():
        raise DataError(f"dataset spec {spec!r} needs an argument: {DATASET_KINDS[spec].form}")
    match = _KIND_PREFIX.match(spec)
    if match is not None and match.group("kind") in DATASET_KINDS:
        return _load(DATASET_KINDS[match.group("kind")], match.group("arg"))

    path = Path(spec).expanduser()
    if path.exists():
        kind = detect_kind(path)
        if kind is None:
            raise DataError(f"{path.resolve()}: cannot tell what kind of dataset this is\n{describe_kinds()}")
        return _load(DATASET_KINDS[kind], str(path))
    if match is not None:
        raise DataError(f"unknown dataset kind {match.group('kind')!r} in {spec!r} (known: {', '.join(DATASET_KINDS)})"
                        f"\n{describe_kinds()}")
    raise DataError(f"{path.resolve()}: no such file or folder\n{describe_kinds()}")


def _load(kind: DatasetKind, argument: str) -> DatasetSplits:
    """``kind``'s loader on ``argument``, with the dataset's family as the kind declares it (unless the loader did)."""
    splits = kind.load(argument)
    if not splits.family:
        splits.family = kind.family_of(argument)
    return splits
