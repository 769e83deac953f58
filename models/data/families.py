"""The dataset families the methods' presets are keyed by; ``formatted``, ``csv`` and ``folder`` data take the family
whose ``names`` include the folder's name, whole (:func:`family_named`: ``coconut`` is no family)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from models.data.known_classes import COCO_CLASSES, CUB_ATTRIBUTES, NUS_WIDE_CONCEPTS
from models.data.voc import VOC_CLASSES
from models.registry import Row, Table

__all__ = ["DATASET_FAMILIES", "Family", "family_named"]


@dataclass(frozen=True)
class Family:
    """A dataset family: its ``name``, ``classes`` (None: they vary) and the pattern of its dataset ``names``."""

    name: str
    classes: tuple[str, ...] | None
    names: str

    def matches(self, name: str) -> bool:
        """True when the dataset name ``name`` is this family's (the whole name, any case)."""
        return re.fullmatch(self.names, name.strip(), re.IGNORECASE) is not None


DATASET_FAMILIES: Table[Family] = Table("dataset family", [Row(f.name, help, f) for help, f in (
    ("PASCAL VOC 2007/2012, 20 classes", Family("voc", VOC_CLASSES, r"voc(2007|2012)?|pascal([_-]?voc)?")),
    ("MS-COCO 2014/2017, 80 classes", Family("coco", COCO_CLASSES, r"coco(2014|2017)?")),
    ("NUS-WIDE, 81 concepts", Family("nus", NUS_WIDE_CONCEPTS, r"nus([_-]?wide)?")),
    ("CUB-200-2011, 312 attributes", Family("cub", CUB_ATTRIBUTES, r"cub([_-]?200)?([_-]2011)?")),
    ("the built-in procedural shapes", Family("builtin", None, r"builtin(-[\w.-]+)?")),
)])


def family_named(name: str) -> str | None:
    """The family whose names include ``name`` (``voc2012`` -> ``voc``), or None (``coconut``)."""
    return next((f.name for f in DATASET_FAMILIES.values() if f.matches(name)), None)
