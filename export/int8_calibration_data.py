"""INT8 calibration data: preprocessed images checked and re-batched, fed to the calibrator in bounded chunks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from export.errors import CalibrationDataError

CALIBRATION_BATCH = 16
CALIBRATION_CHUNK_IMAGES = 32  # per chunk, counted at 224 x 224 (scaled by pixel count for other sizes)


def calibration_batches(data: np.ndarray | Iterable[Any], image_size: int, *, max_images: int | None = None,
                        batch_size: int = CALIBRATION_BATCH) -> list[np.ndarray]:
    """Preprocessed calibration images ``(N, 3, S, S)`` (an array or an iterable of batches), validated, capped at
    ``max_images`` and re-batched to ``batch_size``; raises :class:`CalibrationDataError`."""
    if batch_size < 1:
        raise CalibrationDataError("the calibration batch size must be >= 1")
    if max_images is not None and max_images < 1:
        raise CalibrationDataError("max_images must be >= 1")
    chunks: Iterable[Any] = [data] if isinstance(data, np.ndarray) else data
    expect = (3, int(image_size), int(image_size))
    kept: list[np.ndarray] = []
    total = 0
    for i, chunk in enumerate(chunks):
        arr = np.asarray(chunk)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or tuple(arr.shape[1:]) != expect:
            raise CalibrationDataError(
                f"calibration batch {i} has shape {tuple(arr.shape)}; expected (N, {expect[0]}, {expect[1]}, "
                f"{expect[2]}) preprocessed like the model's inputs")
        if not np.issubdtype(arr.dtype, np.floating):
            raise CalibrationDataError(
                f"calibration batch {i} has dtype {arr.dtype}; expected float32 images normalised with the "
                "model's mean/std (not raw pixels)")
        arr = arr.astype(np.float32, copy=False)
        if not np.isfinite(arr).all():
            raise CalibrationDataError(f"calibration batch {i} contains NaN or infinite values")
        if max_images is not None:
            arr = arr[: max_images - total]
        if len(arr):
            kept.append(arr)
            total += len(arr)
        if max_images is not None and total >= max_images:
            break
    if total == 0:
        raise CalibrationDataError("no calibration images were given")
    images = np.concatenate(kept) if len(kept) > 1 else kept[0]
    return [np.ascontiguousarray(images[s : s + batch_size]) for s in range(0, total, batch_size)]


class BatchReader:
    """ONNX Runtime ``CalibrationDataReader`` over a list of batches, with ``set_range`` for chunked runs."""

    def __init__(self, input_name: str, batches: list[np.ndarray]) -> None:
        self._name = input_name
        self._batches = batches
        self._iter: Iterator[np.ndarray] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch as an ONNX Runtime feed, None when the (range of) batches is used up."""
        batch = next(self._iter, None)
        return None if batch is None else {self._name: batch}

    def __len__(self) -> int:
        """Number of batches."""
        return len(self._batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restart the reader on batches ``start_index:end_index`` (ORT's chunked calibration calls this)."""
        self._iter = iter(self._batches[start_index:end_index])


def chunk_stride(n_batches: int, batch_size: int, image_size: int) -> int:
    """Batches per calibration chunk: the largest divisor of ``n_batches`` within the chunk's image budget."""
    chunk_images = CALIBRATION_CHUNK_IMAGES * (224 * 224) / float(image_size * image_size)
    target = max(1, int(chunk_images // batch_size))
    return max(d for d in range(1, min(target, n_batches) + 1) if n_batches % d == 0)
