"""Miniatures of the VOC, COCO and CUB layouts, written from the fabricated descriptions stored in
``tests/data/reference_protocol/`` (the inputs the reference scripts were run on; see its README).

The same builders wrote the trees the reference's ``preproc/format_*.py`` read when the fixtures were made, so a
loader that reads a tree built here must give the stored reference outputs. Image files are empty: loaders only
check that they exist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parent / "data" / "reference_protocol"
VOC_NAMES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
             "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def read_description(name: str) -> dict[str, Any]:
    """The stored description ``<name>.json`` of a miniature."""
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def reference_outputs(name: str) -> dict[str, np.ndarray]:
    """The reference's outputs stored in ``<name>.npz`` (no pickles)."""
    with np.load(FIXTURES / f"{name}.npz", allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def _voc_list_line(image_id: str, objects: list[list[Any]], cls: str) -> str:
    """One line of ``ImageSets/Main/<cls>_<phase>.txt`` as the devkit writes it: 1 (a non-difficult object),
    0 (difficult objects only) or -1 (none), the value right-aligned in two characters."""
    flags = [int(difficult) for name, difficult in objects if name == cls]
    value = -1 if not flags else (1 if 0 in flags else 0)
    return f"{image_id} {value:2d}\n"


def build_voc(root: Path, description: dict[str, Any]) -> Path:
    """``root/VOCdevkit/VOC2012`` with XML annotations, empty JPEGs, ``train.txt`` / ``val.txt`` in the stored
    (not necessarily sorted) order and the per-class ``<cls>_{train,val}.txt`` lists; returns ``root``."""
    year = root / "VOCdevkit" / "VOC2012"
    main = year / "ImageSets" / "Main"
    main.mkdir(parents=True, exist_ok=True)
    (year / "Annotations").mkdir(parents=True, exist_ok=True)
    for phase in ("train", "val"):
        images: dict[str, list[list[Any]]] = description[phase]
        order: list[str] = description[f"{phase}_order"]
        for image_id, objects in images.items():
            parts = ["<annotation>", f"  <filename>{image_id}.jpg</filename>"]
            for name, difficult in objects:
                parts += ["  <object>", f"    <name>{name}</name>", f"    <difficult>{difficult}</difficult>",
                          "  </object>"]
            (year / "Annotations" / f"{image_id}.xml").write_text("\n".join([*parts, "</annotation>"]) + "\n")
            _touch(year / "JPEGImages" / f"{image_id}.jpg")
        (main / f"{phase}.txt").write_text("".join(f"{i}\n" for i in order))
        for cls in VOC_NAMES:
            (main / f"{cls}_{phase}.txt").write_text("".join(_voc_list_line(i, images[i], cls) for i in order))
    return root


def build_coco(root: Path, description: dict[str, Any]) -> Path:
    """``root/annotations/instances_{train,val}2014.json`` and empty images named by their ``file_name``."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for phase in ("train", "val"):
        data = description[phase]
        (root / "annotations" / f"instances_{phase}2014.json").write_text(json.dumps(data))
        for image in data["images"]:
            _touch(root / f"{phase}2014" / image["file_name"])
    return root


def build_cub(root: Path, description: dict[str, Any]) -> Path:
    """The extracted archive: ``root/CUB_200_2011/attributes.txt`` beside ``root/CUB_200_2011/CUB_200_2011/``
    (the reference's ``data/cub`` layout); returns the folder that holds ``attributes.txt``."""
    parent = root / "CUB_200_2011"
    folder = parent / "CUB_200_2011"
    (folder / "attributes").mkdir(parents=True, exist_ok=True)
    (parent / "attributes.txt").write_text("".join(f"{i} {name}\n"
                                                   for i, name in enumerate(description["attributes"], 1)))
    images = description["images"]  # [image_id, path, is_train]
    (folder / "images.txt").write_text("".join(f"{i} {path}\n" for i, path, _ in images))
    (folder / "train_test_split.txt").write_text("".join(f"{i} {flag}\n" for i, _, flag in images))
    extra = set(description["extra_field_lines"])
    lines = []
    for (image_id, _, _), row in zip(images, description["labels"], strict=True):
        for attribute, present in enumerate(row, 1):
            tail = " 0" if len(lines) + 1 in extra else ""
            lines.append(f"{image_id} {attribute} {present} 3 12.5{tail}\n")
    (folder / "attributes" / "image_attribute_labels.txt").write_text("".join(lines))
    for _, path, _ in images:
        _touch(folder / "images" / path)
    return parent
