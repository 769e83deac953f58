"""The tagging pipeline's scoring loop holds a bounded number of decoded images, set by the batch size and the
decode threads, whatever the number of images (serve/tagging/scoring.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from serve.tagging.scoring import decode_window, score_items
from serve.tagging.sources import Item


class CountingPreprocess:
    """A stand-in preprocessing that counts the decoded images not yet scored (decode -> +1, scored -> -1)."""

    def __init__(self) -> None:
        self.held = 0
        self.most = 0
        self.lock = threading.Lock()

    def decode(self, image: object) -> np.ndarray:
        with self.lock:
            self.held += 1
            self.most = max(self.most, self.held)
        return np.zeros((3, 2, 2), np.uint8)

    def normalize(self, images: np.ndarray) -> np.ndarray:
        return images.astype(np.float32)

    def scorer(self, batch: np.ndarray) -> np.ndarray:
        with self.lock:
            self.held -= len(batch)
        return np.zeros((len(batch), 3), np.float32)


@pytest.mark.parametrize(("batch_size", "workers"), [(4, 2), (2, 8), (16, 1)])
def test_decoded_images_are_bounded_by_batch_and_workers(batch_size: int, workers: int) -> None:
    counting = CountingPreprocess()
    items = (Item(f"k{i}", data=b"x") for i in range(500))  # streamed: the loop never lists them
    results = [r for batch in score_items(items, counting.scorer, counting, batch_size, workers)  # type: ignore[arg-type]
               for r in batch]
    assert [r.key for r in results] == [f"k{i}" for i in range(500)] and counting.held == 0
    assert counting.most <= decode_window(batch_size, workers) + batch_size
    assert decode_window(batch_size, workers) == max(2 * batch_size, 2 * workers)
