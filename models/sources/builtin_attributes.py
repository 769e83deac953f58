"""Attribute labels of the dense built-in variant (``builtin:dense-*``): where and how visible objects appear, about 6.5
positives per image."""

from __future__ import annotations

import numpy as np
from PIL import Image

from models.sources.builtin_scenes import (
    MIN_VISIBLE_FRACTION,
    SPLITS,
    SUPERSAMPLE,
    SceneObject,
    render_scene,
    sample_labelled_scene,
    scene_masks,
)
from models.sources.shapes import CLASS_NAMES

__all__ = ["ATTRIBUTE_NAMES", "DENSE_CLASS_NAMES", "generate_dense_image", "scene_attributes"]

ATTRIBUTE_NAMES = ("top_left", "top_right", "bottom_left", "bottom_right", "large", "partly_hidden", "crowded")
#: The dense variant's classes: the shapes, then the attributes.
DENSE_CLASS_NAMES = (*CLASS_NAMES, *ATTRIBUTE_NAMES)
LARGE_SIZE = 0.5
PARTLY_HIDDEN_FRACTION = 0.8
CROWDED_OBJECTS = 4


def _shown_objects(scene: list[SceneObject], canvas: int) -> list[tuple[SceneObject, float]]:
    """The class instances that count as present (as the shape labels decide), with their visible fraction."""
    masks = scene_masks(scene, canvas)
    covered = np.zeros((canvas, canvas), dtype=bool)
    shown: list[tuple[SceneObject, float]] = []
    for obj, mask in zip(reversed(scene), reversed(masks), strict=True):
        area = int(np.count_nonzero(mask))
        visible = int(np.count_nonzero(mask & ~covered))
        if not obj.is_occluder and area > 0 and visible >= MIN_VISIBLE_FRACTION * area:
            shown.append((obj, visible / area))
        covered |= mask
    return shown


def scene_attributes(scene: list[SceneObject], canvas: int) -> np.ndarray:
    """The attribute vector (uint8, ``len(ATTRIBUTE_NAMES)``) of ``scene`` rasterised at ``canvas`` px."""
    shown = _shown_objects(scene, canvas)
    values = {
        "top_left": any(o.cx < 0.5 and o.cy < 0.5 for o, _ in shown),
        "top_right": any(o.cx >= 0.5 and o.cy < 0.5 for o, _ in shown),
        "bottom_left": any(o.cx < 0.5 and o.cy >= 0.5 for o, _ in shown),
        "bottom_right": any(o.cx >= 0.5 and o.cy >= 0.5 for o, _ in shown),
        "large": any(o.size >= LARGE_SIZE for o, _ in shown),
        "partly_hidden": any(fraction < PARTLY_HIDDEN_FRACTION for _, fraction in shown),
        "crowded": len(shown) >= CROWDED_OBJECTS}
    return np.array([values[name] for name in ATTRIBUTE_NAMES], dtype=np.uint8)


def generate_dense_image(seed: int, split: str, index: int, image_size: int) -> tuple[Image.Image, np.ndarray]:
    """Image ``index`` of ``split`` for ``seed`` and its labels over :data:`DENSE_CLASS_NAMES`."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    canvas = SUPERSAMPLE * image_size
    scene, shapes = sample_labelled_scene(rng, canvas)
    labels = np.concatenate([shapes, scene_attributes(scene, canvas)])
    return render_scene(rng, scene, image_size), labels
