"""The SPML protocol of Cole et al. (METHODS.md section 6.2): observed labels and the train/val split.

- Observed labels are sampled ONCE from the annotated labels with a fixed seed (1200 by default), before
  the split and independently of the method, so every method sees the same positives.
- 20% of the training pool is held out as a fully labelled validation split (unless the source has an
  explicit val split); the test split is always fully labelled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from train.data.types import DatasetSplits, LabelledImages

PROTOCOL_SEED = 1200


@dataclass
class ObservedSpec:
    """How training labels are observed: ``single`` (one positive), ``full``, or ``partial`` with rate."""

    kind: str
    rate: float = 1.0

    def __str__(self) -> str:
        return f"partial:{self.rate:g}" if self.kind == "partial" else self.kind


def parse_observed(text: str) -> ObservedSpec:
    """Parse ``single`` | ``full`` | ``partial:R`` (0 < R <= 1) into an :class:`ObservedSpec`."""
    text = text.strip().lower()
    if text in ("single", "full"):
        return ObservedSpec(text)
    if text.startswith("partial:"):
        try:
            rate = float(text.split(":", 1)[1])
        except ValueError:
            rate = -1.0
        if 0.0 < rate <= 1.0:
            return ObservedSpec("partial", rate)
    raise ValueError(f"invalid --observed {text!r}: use single, full or partial:R with 0 < R <= 1")


def sample_observed(labels: np.ndarray, spec: ObservedSpec, seed: int = PROTOCOL_SEED) -> np.ndarray:
    """Observed 0/1 matrix from the full ``labels`` (N, C).

    ``single``: for each row in order, shuffle its positive indices with ``RandomState(seed)`` and keep the
    first (Cole et al.'s ``generate_observed_labels``); rows with no positive stay all-zero.
    ``partial``: keep each positive independently with probability ``rate`` (PU-MLC's setting).
    ``full``: the labels themselves.
    """
    labels = np.asarray(labels, dtype=np.uint8)
    if spec.kind == "full":
        return labels.copy()
    rng = np.random.RandomState(seed)
    observed = np.zeros_like(labels)
    if spec.kind == "single":
        for i, row in enumerate(labels):
            positives = np.flatnonzero(row)
            if positives.size:
                rng.shuffle(positives)
                observed[i, positives[0]] = 1
        return observed
    keep = rng.random_sample(labels.shape) < spec.rate
    return (labels.astype(bool) & keep).astype(np.uint8)


def split_train_val(n: int, val_fraction: float = 0.2, seed: int = PROTOCOL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Cole et al.'s split: permute ``range(n)`` with ``RandomState(seed)``; the first ``n - round(f n)``
    indices (sorted) are train, the rest (sorted) val."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError("val_fraction must be in [0, 1)")
    perm = np.random.RandomState(seed).permutation(n)
    n_val = round(val_fraction * n)
    return np.sort(perm[: n - n_val]), np.sort(perm[n - n_val :])


@dataclass
class ProtocolSplits:
    """Train images with observed and full labels, a fully labelled val split, an optional test split."""

    classes: list[str]
    train: LabelledImages  # .labels are the FULL (annotated) labels
    train_observed: np.ndarray  # (N_train, C) uint8: what training may use
    val: LabelledImages
    test: LabelledImages | None
    observed: ObservedSpec
    fingerprint: str

    def summary(self) -> str:
        """One line describing split sizes and label counts."""
        obs = self.train_observed.sum(1).mean() if len(self.train) else 0.0
        full = self.train.labels.sum(1).mean() if len(self.train) else 0.0
        test = len(self.test) if self.test is not None else 0
        return (
            f"train {len(self.train)} (observed {self.observed}: {obs:.2f} labels/image of {full:.2f}), "
            f"val {len(self.val)}, test {test}, {len(self.classes)} classes"
        )


def dataset_fingerprint(splits: DatasetSplits) -> str:
    """A short sha256 over class names, image paths (relative to their common root) and label matrices.

    Image bytes are not hashed (too slow for COCO-sized data); the fingerprint identifies the annotation.
    """
    h = hashlib.sha256()
    h.update("\n".join(splits.classes).encode())
    for part_name in ("train", "val", "test"):
        part = getattr(splits, part_name)
        if part is None:
            continue
        h.update(part_name.encode())
        names = [p.name for p in part.paths]
        h.update("\n".join(names).encode())
        h.update(np.ascontiguousarray(part.labels).tobytes())
    return h.hexdigest()[:16]


def build_protocol(
    splits: DatasetSplits,
    observed: ObservedSpec,
    val_fraction: float = 0.2,
    seed: int = PROTOCOL_SEED,
) -> ProtocolSplits:
    """Apply the protocol to a loaded dataset: sample observed labels on the training pool, then hold out
    ``val_fraction`` of it as val (unless the dataset has an explicit val split)."""
    pool = splits.train
    if len(pool) == 0:
        raise ValueError(f"dataset {splits.name} has no training images")
    pool_observed = sample_observed(pool.labels, observed, seed)
    if splits.val is not None and len(splits.val) > 0:
        train, train_obs, val = pool, pool_observed, splits.val
    else:
        tr_idx, va_idx = split_train_val(len(pool), val_fraction, seed)
        if len(va_idx) == 0:
            raise ValueError(f"dataset {splits.name}: too few training images ({len(pool)}) to hold out a val split")
        train, train_obs, val = pool.subset(tr_idx), pool_observed[tr_idx], pool.subset(va_idx)
    return ProtocolSplits(
        classes=list(splits.classes),
        train=train,
        train_observed=train_obs,
        val=val,
        test=splits.test if splits.test is not None and len(splits.test) > 0 else None,
        observed=observed,
        fingerprint=dataset_fingerprint(splits),
    )
