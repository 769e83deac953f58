"""Geometry of the built-in dataset's classes: polygons within the unit circle, a footprint and an optional pattern;
none is a rotation of another."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import ImageDraw

Polygon = np.ndarray  # float array of shape (K, 2): x, y in unit coordinates (y points down)


@dataclass(frozen=True)
class ShapeGeometry:
    """One class's polygons: the ``footprint`` (``add=False`` cuts a hole) and the ``pattern``."""

    footprint: tuple[tuple[Polygon, bool], ...]
    pattern: tuple[Polygon, ...] = ()


def _poly(points: list[tuple[float, float]]) -> Polygon:
    return np.asarray(points, dtype=np.float64)


def _regular(n: int, radius: float = 1.0, phase: float = -math.pi / 2) -> Polygon:
    t = phase + np.arange(n) * (2 * math.pi / n)
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)


def _circle(radius: float = 1.0, cx: float = 0.0, cy: float = 0.0, n: int = 72) -> Polygon:
    pts = _regular(n, radius, phase=0.0)
    return pts + np.array([cx, cy])


def _rect(x0: float, y0: float, x1: float, y1: float) -> Polygon:
    return _poly([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])


def _normalise(geom: ShapeGeometry) -> ShapeGeometry:
    """Centre the bounding box of the additive polygons on the origin and scale them into the unit circle."""
    pts = np.concatenate([p for p, add in geom.footprint if add])
    centre = (pts.min(axis=0) + pts.max(axis=0)) / 2
    scale = 1.0 / float(np.sqrt(((pts - centre) ** 2).sum(axis=1)).max())
    return ShapeGeometry(
        footprint=tuple(((p - centre) * scale, add) for p, add in geom.footprint),
        pattern=tuple((p - centre) * scale for p in geom.pattern),
    )


def _disk() -> ShapeGeometry:
    return ShapeGeometry(((_circle(), True),))


def _ring() -> ShapeGeometry:
    return ShapeGeometry(((_circle(), True), (_circle(0.58), False)))


def _square() -> ShapeGeometry:
    return ShapeGeometry(((_rect(-1, -1, 1, 1), True),))


def _square_frame() -> ShapeGeometry:
    return ShapeGeometry(((_rect(-1, -1, 1, 1), True), (_rect(-0.58, -0.58, 0.58, 0.58), False)))


def _triangle() -> ShapeGeometry:
    return ShapeGeometry(((_regular(3), True),))


def _diamond() -> ShapeGeometry:
    return ShapeGeometry(((_poly([(0, -1), (0.55, 0), (0, 1), (-0.55, 0)]), True),))


def _pentagon() -> ShapeGeometry:
    return ShapeGeometry(((_regular(5), True),))


def _star() -> ShapeGeometry:
    outer = _regular(5, 1.0)
    inner = _regular(5, 0.42, phase=-math.pi / 2 + math.pi / 5)
    pts = np.empty((10, 2))
    pts[0::2] = outer
    pts[1::2] = inner
    return ShapeGeometry(((pts, True),))


def _plus() -> ShapeGeometry:
    w = 0.24
    return ShapeGeometry(
        (
            (
                _poly(
                    [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w),
                     (-1, w), (-1, -w), (-w, -w)]
                ),
                True,
            ),
        )
    )


def _crescent() -> ShapeGeometry:
    return ShapeGeometry(((_circle(), True), (_circle(0.82, 0.42, -0.08), False)))


def _heart() -> ShapeGeometry:
    t = np.linspace(0, 2 * math.pi, 96, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    return ShapeGeometry(((np.stack([x, y], axis=1), True),))


def _arrow() -> ShapeGeometry:
    return ShapeGeometry(
        ((_poly([(-1, -0.17), (0.15, -0.17), (0.15, -0.55), (1, 0), (0.15, 0.55), (0.15, 0.17), (-1, 0.17)]),
          True),)
    )


def _lightning() -> ShapeGeometry:
    return ShapeGeometry(
        ((_poly([(-0.05, -1), (0.55, -1), (0.18, -0.18), (0.55, -0.18), (-0.35, 1), (-0.05, 0.12),
                 (-0.42, 0.12)]), True),)
    )


def _semicircle() -> ShapeGeometry:
    t = np.linspace(math.pi, 2 * math.pi, 48)
    return ShapeGeometry(((np.stack([np.cos(t), np.sin(t)], axis=1), True),))


def _t_shape() -> ShapeGeometry:
    return ShapeGeometry(
        ((_poly([(-1, -1), (1, -1), (1, -0.55), (0.22, -0.55), (0.22, 1), (-0.22, 1), (-0.22, -0.55),
                 (-1, -0.55)]), True),)
    )


def _l_shape() -> ShapeGeometry:
    return ShapeGeometry(
        ((_poly([(-0.65, -1), (-0.2, -1), (-0.2, 0.55), (0.65, 0.55), (0.65, 1), (-0.65, 1)]), True),)
    )


def _striped_square() -> ShapeGeometry:
    bands = 5
    edges = np.linspace(-1, 1, bands + 1)
    stripes = tuple(_rect(edges[i], -1, edges[i + 1], 1) for i in range(1, bands, 2))
    return ShapeGeometry(((_rect(-1, -1, 1, 1), True),), stripes)


def _checkerboard() -> ShapeGeometry:
    cells = 4
    edges = np.linspace(-1, 1, cells + 1)
    dark = tuple(
        _rect(edges[i], edges[j], edges[i + 1], edges[j + 1])
        for i in range(cells)
        for j in range(cells)
        if (i + j) % 2 == 1
    )
    return ShapeGeometry(((_rect(-1, -1, 1, 1), True),), dark)


def _ellipse() -> ShapeGeometry:
    t = np.linspace(0, 2 * math.pi, 72, endpoint=False)
    return ShapeGeometry(((np.stack([np.cos(t), 0.42 * np.sin(t)], axis=1), True),))


def _hourglass() -> ShapeGeometry:
    return ShapeGeometry(
        ((_poly([(-0.7, -1), (0.7, -1), (0.12, 0), (0.7, 1), (-0.7, 1), (-0.12, 0)]), True),)
    )


_BUILDERS: dict[str, Callable[[], ShapeGeometry]] = {
    "disk": _disk,
    "ring": _ring,
    "square": _square,
    "square_frame": _square_frame,
    "triangle": _triangle,
    "diamond": _diamond,
    "pentagon": _pentagon,
    "star": _star,
    "plus": _plus,
    "crescent": _crescent,
    "heart": _heart,
    "arrow": _arrow,
    "lightning": _lightning,
    "semicircle": _semicircle,
    "t_shape": _t_shape,
    "l_shape": _l_shape,
    "striped_square": _striped_square,
    "checkerboard": _checkerboard,
    "ellipse": _ellipse,
    "hourglass": _hourglass,
}

#: The class names, in class-index order.
CLASS_NAMES: list[str] = list(_BUILDERS)

#: Normalised geometry of every class, indexed like ``CLASS_NAMES``.
SHAPES: list[ShapeGeometry] = [_normalise(build()) for build in _BUILDERS.values()]


def transform(poly: Polygon, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    """``poly`` rotated by ``angle``, scaled by ``radius`` px and moved to ``(cx, cy)``, as pixel points."""
    c, s = math.cos(angle), math.sin(angle)
    x = poly[:, 0] * c - poly[:, 1] * s
    y = poly[:, 0] * s + poly[:, 1] * c
    return list(zip((x * radius + cx).tolist(), (y * radius + cy).tolist(), strict=True))


def draw_footprint(draw: ImageDraw.ImageDraw, cls: int, cx: float, cy: float, radius: float, angle: float) -> None:
    """Draw class ``cls``'s footprint (255, holes 0) on ``draw`` at the given centre, radius and angle."""
    for poly, add in SHAPES[cls].footprint:
        draw.polygon(transform(poly, cx, cy, radius, angle), fill=255 if add else 0)


def draw_pattern(draw: ImageDraw.ImageDraw, cls: int, cx: float, cy: float, radius: float, angle: float) -> bool:
    """Draw class ``cls``'s second-colour pattern on ``draw``; False for classes without one."""
    pattern = SHAPES[cls].pattern
    for poly in pattern:
        draw.polygon(transform(poly, cx, cy, radius, angle), fill=255)
    return bool(pattern)
