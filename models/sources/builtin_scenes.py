"""The procedural image generator of the built-in dataset: overlapping shapes, occluders, textured backgrounds; an
image's labels are the classes that stay visible (``MIN_VISIBLE_FRACTION``), its RNG seeded by ``(seed, split,
index)``."""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from models.sources.shapes import CLASS_NAMES, SHAPES, draw_footprint, draw_pattern

NUM_CLASSES = len(CLASS_NAMES)

#: An instance whose visible fraction (after everything is drawn) is below this does not count.
MIN_VISIBLE_FRACTION = 0.4
#: Most objects (class instances) in one image.
MAX_OBJECTS = 6
#: Object size (diameter of the circle around the shape) as a fraction of the image side.
SIZE_RANGE = (0.28, 0.55)
#: Shapes are drawn at this multiple of the image size and downsampled (anti-aliasing).
SUPERSAMPLE = 2

# Class order from most to least frequent (a fixed shuffle, so frequency is unrelated to the class index).
_FREQUENCY_ORDER = [
    "square", "disk", "triangle", "star", "ring", "plus", "ellipse", "heart", "arrow", "diamond",
    "l_shape", "semicircle", "crescent", "hourglass", "pentagon", "t_shape", "striped_square",
    "lightning", "square_frame", "checkerboard",
]  # fmt: skip
_ZIPF_EXPONENT = 0.85

#: When the first class of a pair is drawn, the second is added too with probability ``_PAIR_PROBABILITY``.
COOCCURRING_PAIRS: list[tuple[str, str]] = [
    ("star", "crescent"), ("heart", "arrow"), ("ellipse", "hourglass"), ("diamond", "pentagon"),
    ("l_shape", "square_frame")]
_PAIR_PROBABILITY = 0.85

# Number of independently drawn objects (partners of co-occurring pairs come on top, up to MAX_OBJECTS).
_N_PRIMARY = np.array([1, 2, 3, 4, 5])
_N_PRIMARY_P = np.array([0.15, 0.25, 0.28, 0.2, 0.12])
_N_OCCLUDERS_P = np.array([0.75, 0.2, 0.05])

#: The split's number in an image's seed ``(seed, split, index)``.
SPLITS = {"train": 0, "test": 1}

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive), as PIL's getbbox returns it


def _class_probabilities() -> np.ndarray:
    rank = np.array([_FREQUENCY_ORDER.index(name) for name in CLASS_NAMES], dtype=np.float64)
    weights = (rank + 1.0) ** -_ZIPF_EXPONENT
    return weights / weights.sum()


_CLASS_P = _class_probabilities()
_PARTNER = {CLASS_NAMES.index(a): CLASS_NAMES.index(b) for a, b in COOCCURRING_PAIRS}


@dataclass(frozen=True)
class SceneObject:
    """One thing drawn: class (-1: an occluder ``blob``), centre and diameter as fractions of the side, rotation."""

    cls: int
    cx: float
    cy: float
    size: float
    angle: float
    blob: tuple[float, ...] = ()

    @property
    def is_occluder(self) -> bool:
        """True for an occluder blob (no class)."""
        return self.cls < 0


# --------------------------------------------------------------------------------------------------------
# Scene sampling (cheap: no pixels)


def sample_scene(rng: np.random.Generator) -> list[SceneObject]:
    """Sample a scene's objects (class, position, size, rotation) and occluders in drawing order, without pixels."""
    classes: list[int] = []
    n_primary = int(rng.choice(_N_PRIMARY, p=_N_PRIMARY_P))
    for _ in range(n_primary):
        if len(classes) >= MAX_OBJECTS:
            break
        cls = int(rng.choice(NUM_CLASSES, p=_CLASS_P))
        classes.append(cls)
        partner = _PARTNER.get(cls)
        if partner is not None and rng.random() < _PAIR_PROBABILITY and len(classes) < MAX_OBJECTS:
            classes.append(partner)
    order = rng.permutation(len(classes))

    scene: list[SceneObject] = []
    for i in order:
        size = float(rng.uniform(*SIZE_RANGE))
        margin = 0.38 * size  # the object may stick out of the frame a little
        cx, cy = rng.uniform(margin, 1.0 - margin, size=2)
        scene.append(SceneObject(classes[i], float(cx), float(cy), size, float(rng.uniform(0, 2 * math.pi))))

    n_occluders = int(rng.choice(len(_N_OCCLUDERS_P), p=_N_OCCLUDERS_P))
    for _ in range(n_occluders):
        size = float(rng.uniform(0.15, 0.35))
        cx, cy = rng.uniform(0.1, 0.9, size=2)
        blob = _blob_shape(rng, (0.55, 1.0), (0.0, 0.16))
        occluder = SceneObject(-1, float(cx), float(cy), size, float(rng.uniform(0, 2 * math.pi)), blob)
        # Never first: an occluder drawn before every object would hide nothing.
        scene.insert(int(rng.integers(1, len(scene) + 1)), occluder)
    return scene


def _blob_shape(rng: np.random.Generator, aspect: tuple[float, float],
                amplitude: tuple[float, float]) -> tuple[float, ...]:
    """A random blob: its aspect ratio, then three (amplitude, phase) harmonic pairs."""
    params = [float(rng.uniform(*aspect))]
    for _k in range(3):
        params += [float(rng.uniform(*amplitude)), float(rng.uniform(0, 2 * math.pi))]
    return tuple(params)


def _blob_polygon(params: tuple[float, ...], cx: float, cy: float, radius: float, angle: float,
                  n: int = 40) -> list[tuple[float, float]]:
    """Pixel-space outline of an irregular blob (occluder or clutter): a wobbly, squashed circle."""
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    r = np.ones_like(t)
    for k in range(3):
        r += params[1 + 2 * k] * np.cos((k + 2) * t + params[2 + 2 * k])
    x, y = r * np.cos(t), params[0] * r * np.sin(t)
    c, s = math.cos(angle), math.sin(angle)
    px = (x * c - y * s) * radius + cx
    py = (x * s + y * c) * radius + cy
    return list(zip(px.tolist(), py.tolist(), strict=True))


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, canvas: int) -> None:
    cx, cy, radius = obj.cx * canvas, obj.cy * canvas, obj.size * canvas / 2
    if obj.is_occluder:
        draw.polygon(_blob_polygon(obj.blob, cx, cy, radius, obj.angle), fill=255)
    else:
        draw_footprint(draw, obj.cls, cx, cy, radius, obj.angle)


def _masks_and_boxes(scene: list[SceneObject], canvas: int) -> tuple[list[np.ndarray], list[Box | None]]:
    masks: list[np.ndarray] = []
    boxes: list[Box | None] = []
    for obj in scene:
        img = Image.new("L", (canvas, canvas), 0)
        _draw_object(ImageDraw.Draw(img), obj, canvas)
        masks.append(np.asarray(img) > 127)
        boxes.append(img.getbbox())
    return masks, boxes


def scene_masks(scene: list[SceneObject], canvas: int) -> list[np.ndarray]:
    """Boolean ``(canvas, canvas)`` pixel mask of every scene object (before occlusion), in scene order."""
    return _masks_and_boxes(scene, canvas)[0]


def _counting_instances(scene: list[SceneObject], masks: list[np.ndarray],
                        boxes: list[Box | None]) -> list[tuple[SceneObject, int]]:
    """The class instances that count, with their visible pixels, walking the scene from the last drawn back."""
    counting: list[tuple[SceneObject, int]] = []
    if not masks:
        return counting
    covered = np.zeros_like(masks[0])
    for obj, mask, box in zip(reversed(scene), reversed(masks), reversed(boxes), strict=True):
        if box is None:
            continue
        x0, y0, x1, y1 = box
        m, cov = mask[y0:y1, x0:x1], covered[y0:y1, x0:x1]
        area = int(np.count_nonzero(m))
        if not obj.is_occluder and area > 0:
            visible = int(np.count_nonzero(m & ~cov))
            if visible >= MIN_VISIBLE_FRACTION * area:
                counting.append((obj, visible))
        cov |= m
    return counting


def _labels_from_masks(scene: list[SceneObject], masks: list[np.ndarray], boxes: list[Box | None]) -> np.ndarray:
    """Multi-hot labels of the classes with at least one counting instance."""
    labels = np.zeros(NUM_CLASSES, dtype=np.uint8)
    for obj, _visible in _counting_instances(scene, masks, boxes):
        labels[obj.cls] = 1
    return labels


def _sample_rasterised(rng: np.random.Generator,
                       canvas: int) -> tuple[list[SceneObject], list[np.ndarray], list[Box | None], np.ndarray]:
    while True:
        scene = sample_scene(rng)
        masks, boxes = _masks_and_boxes(scene, canvas)
        labels = _labels_from_masks(scene, masks, boxes)
        if labels.any():
            return scene, masks, boxes, labels


def sample_labelled_scene(rng: np.random.Generator, canvas: int = 64) -> tuple[list[SceneObject], np.ndarray]:
    """Sample scenes until a class stays visible at ``canvas`` px; returns ``(scene, labels)``."""
    scene, _masks, _boxes, labels = _sample_rasterised(rng, canvas)
    return scene, labels


# --------------------------------------------------------------------------------------------------------
# Rendering (all painting happens at SUPERSAMPLE x the image size, in uint8 except inside object boxes)


def _random_colour(rng: np.random.Generator, v_range: tuple[float, float] = (0.3, 1.0)) -> np.ndarray:
    h, s, v = rng.uniform(0, 1), rng.uniform(0.35, 1.0), rng.uniform(*v_range)
    return np.array(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32)


def _smooth_noise(rng: np.random.Generator, width: int, height: int, grid: int) -> np.ndarray:
    """Colour noise on a ``grid`` x ``grid`` lattice, bicubically upsampled: float32 ``(h, w, 3)`` in [0, 1]."""
    small = (rng.random((grid, grid, 3)) * 255).astype(np.uint8)
    big = Image.fromarray(small, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(big, dtype=np.float32) / 255.0


def _ramp(width: int, height: int, angle: float, x0: int = 0, y0: int = 0, scale: float = 1.0) -> np.ndarray:
    """Linear ramp along direction ``angle``, zero at the origin, one unit per ``scale`` px: ``(h, w, 1)``."""
    ys, xs = np.mgrid[y0 : y0 + height, x0 : x0 + width].astype(np.float32)
    return ((xs * math.cos(angle) + ys * math.sin(angle)) / scale)[..., None]


def _background(rng: np.random.Generator, canvas: int) -> Image.Image:
    """Textured background: smooth colour noise plus a gradient, computed small and upsampled to ``canvas``."""
    work = min(canvas, 128)
    coarse = _smooth_noise(rng, work, work, int(rng.integers(2, 5)))
    fine = _smooth_noise(rng, work, work, int(rng.integers(6, 14)))
    bg = 0.75 * coarse + 0.25 * fine
    grey = bg.mean(axis=2, keepdims=True)
    bg = grey + float(rng.uniform(0.3, 1.0)) * (bg - grey)  # tone the saturation down a bit
    gradient = _ramp(work, work, float(rng.uniform(0, 2 * math.pi)), scale=work) - 0.5
    bg = np.clip(bg + float(rng.uniform(0.0, 0.45)) * gradient, 0.0, 1.0)
    img = Image.fromarray((bg * 255 + 0.5).astype(np.uint8), "RGB")
    return img if work == canvas else img.resize((canvas, canvas), Image.Resampling.BICUBIC)


def _draw_clutter(rng: np.random.Generator, img: Image.Image, canvas: int) -> None:
    """Non-class clutter on the background: thin lines, thin arcs, dots and small irregular blobs."""
    draw = ImageDraw.Draw(img)

    def colour() -> tuple[int, int, int]:
        c = _random_colour(rng, (0.1, 1.0)) * 255
        return (int(c[0]), int(c[1]), int(c[2]))

    unit = canvas / 100.0
    for _ in range(int(rng.integers(1, 6))):
        p = (rng.uniform(-0.1, 1.1, size=4) * canvas).tolist()
        draw.line(p, fill=colour(), width=max(1, int(rng.uniform(0.4, 1.2) * unit)))
    for _ in range(int(rng.integers(0, 4))):
        cx, cy = rng.uniform(0, 1, size=2) * canvas
        r = rng.uniform(0.08, 0.3) * canvas
        start = float(rng.uniform(0, 360))
        draw.arc([cx - r, cy - r, cx + r, cy + r], start, start + float(rng.uniform(40, 200)), fill=colour(),
                 width=max(1, int(rng.uniform(0.4, 1.2) * unit)))
    for _ in range(int(rng.integers(2, 14))):
        cx, cy = rng.uniform(0, 1, size=2) * canvas
        r = rng.uniform(0.4, 1.4) * unit
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour())
    for _ in range(int(rng.integers(0, 4))):
        params = _blob_shape(rng, (0.3, 0.8), (0.05, 0.25))
        cx, cy = rng.uniform(0, 1, size=2) * canvas
        draw.polygon(_blob_polygon(params, cx, cy, rng.uniform(1.5, 4.5) * unit,
                                   float(rng.uniform(0, 2 * math.pi)), n=24), fill=colour())


def _paint_object(rng: np.random.Generator, img: np.ndarray, obj: SceneObject, mask: np.ndarray, box: Box,
                  canvas: int) -> None:
    """Composite one object or occluder into the uint8 ``img`` inside the mask's bounding ``box``."""
    x0, y0, x1, y1 = box
    m = mask[y0:y1, x0:x1]
    region = img[y0:y1, x0:x1]
    h, w = m.shape
    if obj.is_occluder:
        tint = _random_colour(rng, (0.15, 0.9))
        fill = 0.55 * _smooth_noise(rng, w, h, int(rng.integers(2, 6))) + 0.45 * tint
    else:
        under = region[m].mean(axis=0) / 255.0
        for _ in range(8):  # keep the object distinguishable from what it is drawn on
            base = _random_colour(rng)
            if float(np.linalg.norm(base - under)) > 0.3:
                break
        fill = np.broadcast_to(base, (h, w, 3))
        cx, cy, radius = obj.cx * canvas, obj.cy * canvas, obj.size * canvas / 2
        if SHAPES[obj.cls].pattern:
            pattern = Image.new("L", (w, h), 0)
            draw_pattern(ImageDraw.Draw(pattern), obj.cls, cx - x0, cy - y0, radius, obj.angle)
            v1 = float(max(base))
            v2 = rng.uniform(0.05, v1 - 0.35) if v1 >= 0.6 else rng.uniform(v1 + 0.35, 1.0)
            second = _random_colour(rng, (v2, v2))
            fill = np.where((np.asarray(pattern) > 127)[..., None], second, fill)
        shade = float(rng.uniform(0.0, 0.35))
        ramp = _ramp(w, h, float(rng.uniform(0, 2 * math.pi)), x0, y0, scale=2 * radius)
        ramp -= ramp.mean()
        fill = fill * (1.0 + shade * ramp)
    region[m] = (np.clip(fill, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)[m]


def _render(rng: np.random.Generator, scene: list[SceneObject], masks: list[np.ndarray], boxes: list[Box | None],
            image_size: int) -> Image.Image:
    canvas = SUPERSAMPLE * image_size
    bg = _background(rng, canvas)
    _draw_clutter(rng, bg, canvas)
    img = np.array(bg)
    for obj, mask, box in zip(scene, masks, boxes, strict=True):
        if box is not None:
            _paint_object(rng, img, obj, mask, box, canvas)
    small = np.asarray(Image.fromarray(img, "RGB").reduce(SUPERSAMPLE), dtype=np.float32)
    noise = rng.standard_normal(small.shape, dtype=np.float32) * float(rng.uniform(1.0, 6.0))
    return Image.fromarray(np.clip(small + noise + 0.5, 0, 255).astype(np.uint8), "RGB")


def render_scene(rng: np.random.Generator, scene: list[SceneObject], image_size: int) -> Image.Image:
    """Paint ``scene`` on a fresh background drawn from ``rng``; an RGB image of ``image_size`` px."""
    masks, boxes = _masks_and_boxes(scene, SUPERSAMPLE * image_size)
    return _render(rng, scene, masks, boxes, image_size)


def labelled_objects(seed: int, split: str, index: int,
                     image_size: int) -> tuple[np.ndarray, list[tuple[int, float, float, float]]]:
    """The labels of image ``index`` of ``split`` (no painting) and the instances behind them."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    canvas = SUPERSAMPLE * image_size
    scene, masks, boxes, labels = _sample_rasterised(rng, canvas)
    instances = _counting_instances(scene, masks, boxes)[::-1]
    return labels, [(obj.cls, float(visible), obj.cx * canvas, obj.cy * canvas) for obj, visible in instances]


def generate_image(seed: int, split: str, index: int, image_size: int) -> tuple[Image.Image, np.ndarray]:
    """Image ``index`` of ``split`` for ``seed``, deterministic: RGB image and multi-hot uint8 labels ``(C,)``."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    scene, masks, boxes, labels = _sample_rasterised(rng, SUPERSAMPLE * image_size)
    return _render(rng, scene, masks, boxes, image_size), labels
