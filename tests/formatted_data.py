"""Fabricated folders in the seeds' "formatted .npy" layout (tiny 16 px JPEGs), shared by the formatted-loader and
protocol-file tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass
class Formatted:
    """What a fabricated folder holds: its folder, the image files, the label matrices and the observed matrix."""

    root: Path
    train_files: list[Path]
    test_files: list[Path]
    train_labels: np.ndarray
    test_labels: np.ndarray
    observed: np.ndarray | None


def _labels(rng: np.random.RandomState, n: int, c: int) -> np.ndarray:
    """Random 0/1 rows with at least one positive each, float64 like the seeds' files."""
    y = (rng.random_sample((n, c)) < 0.25).astype(np.float64)
    y[np.arange(n), rng.randint(0, c, n)] = 1.0
    return y


def _images(folder: Path, names: list[str], rng: np.random.RandomState) -> list[Path]:
    files = []
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (16, 16, 3), dtype=np.uint8)).save(path, quality=90)
        files.append(path)
    return files


def make_formatted(
    root: Path,
    num_classes: int = 5,
    n_train: int = 30,
    n_test: int = 10,
    image_dir: Path | None = None,
    recorded_prefix: str | None = None,
    observed: bool = True,
    classes: list[str] | None = None,
    seed: int = 0,
    negatives: bool = False,
) -> Formatted:
    """Write ``formatted_{train,val}_{images,labels}.npy`` (+ ``formatted_train_labels_obs.npy`` with one observed
    positive per row, as published, and with ``negatives`` two observed negatives (-1) per row as the seeds'
    ``--num-neg 2`` writes them, + ``classes.txt``) into ``root``.

    Images go to ``image_dir`` (default ``root``) as ``cls/train_000.jpg``; the .npy files hold the paths relative to
    it, or ``recorded_prefix + relative`` (e.g. an absolute path of another machine) when given."""
    rng = np.random.RandomState(seed)
    root.mkdir(parents=True, exist_ok=True)
    image_dir = image_dir or root
    train_names = [f"c{i % 3}/train_{i:03d}.jpg" for i in range(n_train)]
    test_names = [f"c{i % 3}/test_{i:03d}.jpg" for i in range(n_test)]
    train_files, test_files = _images(image_dir, train_names, rng), _images(image_dir, test_names, rng)
    prefix = recorded_prefix or ""
    np.save(root / "formatted_train_images.npy", np.array([prefix + n for n in train_names]))
    np.save(root / "formatted_val_images.npy", np.array([prefix + n for n in test_names]))
    train_labels, test_labels = _labels(rng, n_train, num_classes), _labels(rng, n_test, num_classes)
    np.save(root / "formatted_train_labels.npy", train_labels)
    np.save(root / "formatted_val_labels.npy", test_labels)
    obs = None
    if observed:
        obs = np.zeros_like(train_labels)
        for i, row in enumerate(train_labels):
            obs[i, rng.choice(np.flatnonzero(row))] = 1.0
            if negatives:
                obs[i, rng.permutation(np.flatnonzero(row == 0))[:2]] = -1.0
        np.save(root / "formatted_train_labels_obs.npy", obs)
    if classes is not None:
        (root / "classes.txt").write_text("".join(f"{c}\n" for c in classes))
    return Formatted(root, train_files, test_files, train_labels, test_labels, obs)
