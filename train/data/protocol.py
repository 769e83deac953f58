"""The SPML protocol of Cole et al. (CVPR 2021; docs/methods.md, "The SPML protocol"): observed labels and the
train/val split.

- Observed labels are sampled ONCE from the annotated labels with a fixed seed (1200 by default), before
  the split and independently of the method, so every method sees the same positives.
- 20% of the training pool is held out as a fully labelled validation split (unless the source has an
  explicit val split); the test split is always fully labelled.
- A dataset that ships its observed labels (the seeds' ``formatted_train_labels_obs.npy``) uses them instead of
  sampling (``given``); ``--observed FILE`` takes them from a saved protocol file (train/data/observed_file.py:
  labels AND split) or from a ``.npy`` matrix with one row per image of the training pool.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from train.data.formatted import load_label_matrix
from train.data.observed_file import ProtocolRecord, image_root, read_protocol_file, relative_paths
from train.data.types import DataError, DatasetSplits, LabelledImages

PROTOCOL_SEED = 1200


@dataclass
class ObservedSpec:
    """How training labels are observed: ``single`` (one positive), ``full``, ``partial`` with rate, ``file``
    (read from ``path``: a protocol file or a pool-aligned .npy) or ``given`` (shipped with the data, ``path``
    names the file)."""

    kind: str
    rate: float = 1.0
    path: str = ""

    def __str__(self) -> str:
        if self.kind == "partial":
            return f"partial:{self.rate:g}"
        return f"{self.kind}:{self.path}" if self.kind in ("file", "given") else self.kind


def parse_observed(text: str) -> ObservedSpec:
    """Parse ``single`` | ``full`` | ``partial:R`` (0 < R <= 1) | an existing FILE into an :class:`ObservedSpec`."""
    word = text.strip().lower()
    if word in ("single", "full"):
        return ObservedSpec(word)
    if word.startswith("partial:"):
        try:
            rate = float(word.split(":", 1)[1])
        except ValueError:
            rate = -1.0
        if 0.0 < rate <= 1.0:
            return ObservedSpec("partial", rate)
        raise ValueError(f"invalid --observed {text!r}: use single, full or partial:R with 0 < R <= 1")
    if Path(text.strip()).expanduser().is_file():
        return ObservedSpec("file", path=str(Path(text.strip()).expanduser().resolve()))
    raise ValueError(f"invalid --observed {text!r}: use single, full, partial:R with 0 < R <= 1, or an existing "
                     "protocol FILE (a run's observed.npz, or a formatted_train_labels_obs.npy)")


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
    seed: int = PROTOCOL_SEED  # the protocol seed that sampled the labels and drew the split

    @property
    def train_has_full_labels(self) -> bool:
        """Whether the training split's annotated labels hold more than what training observes: then (and only
        then) the trainer scores full-label diagnostics (label recovery, the precision of a method's pseudo-labels)
        and lets the oracle methods train. Decided here alone: today by the observed labels differing from the
        annotated ones, which is false for single-positive labels as given (nothing is hidden) and for
        ``--observed full`` (nothing to recover)."""
        return not np.array_equal(self.train_observed, self.train.labels)

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


def _split_pool(
    splits: DatasetSplits, pool_observed: np.ndarray, observed: ObservedSpec, val_fraction: float, seed: int
) -> ProtocolSplits:
    """Hold out ``val_fraction`` of the training pool as val (unless the dataset has an explicit val split)."""
    pool = splits.train
    if splits.val is not None and len(splits.val) > 0:
        train, train_obs, val = pool, pool_observed, splits.val
    else:
        tr_idx, va_idx = split_train_val(len(pool), val_fraction, seed)
        if len(va_idx) == 0:
            raise ValueError(f"dataset {splits.name}: too few training images ({len(pool)}) to hold out a val split")
        train, train_obs, val = pool.subset(tr_idx), pool_observed[tr_idx], pool.subset(va_idx)
    return ProtocolSplits(
        classes=list(splits.classes), train=train, train_observed=train_obs, val=val,
        test=splits.test if splits.test is not None and len(splits.test) > 0 else None,
        observed=observed, fingerprint=dataset_fingerprint(splits), seed=seed,
    )


def _rows_by_path(record_paths: list[str], candidates: dict[str, int], path: Path, what: str) -> list[int]:
    """Row numbers of ``record_paths`` among ``candidates``; a missing one -> ``DataError`` with the count."""
    missing = [p for p in record_paths if p not in candidates]
    if missing:
        raise DataError(f"--observed {path} does not match this dataset: {len(missing)} of its {len(record_paths)} "
                        f"{what} images are not in it (first: {missing[0]})")
    return [candidates[p] for p in record_paths]


def _protocol_from_record(splits: DatasetSplits, record: ProtocolRecord, path: Path) -> ProtocolSplits:
    """The protocol saved in ``record`` applied to the loaded dataset (same classes and images required)."""
    if record.classes != list(splits.classes):
        raise DataError(f"--observed {path} does not match this dataset: its {len(record.classes)} classes "
                        f"({', '.join(record.classes[:3])}, ...) differ from the dataset's {len(splits.classes)} "
                        f"({', '.join(splits.classes[:3])}, ...)")
    fingerprint = dataset_fingerprint(splits)
    if record.fingerprint != fingerprint:
        print(f"note: --observed {path} was saved for dataset fingerprint {record.fingerprint}, this dataset has "
              f"{fingerprint}; its images and classes match, so it is used", file=sys.stderr)
    parts = [splits.train] + ([splits.val] if splits.val is not None else [])
    pool = LabelledImages([p for part in parts for p in part.paths],
                          np.concatenate([part.labels for part in parts]), list(splits.classes))
    root = image_root(parts + ([splits.test] if splits.test is not None else []))
    candidates = {rel: i for i, rel in enumerate(relative_paths(pool, root))}
    train_rows = _rows_by_path(record.train_paths, candidates, path, "training")
    val_rows = _rows_by_path(record.val_paths, candidates, path, "validation")
    kind, _, given = record.observed.partition(":")
    observed = ObservedSpec("given", path=given) if kind == "given" else parse_observed(record.observed)
    return ProtocolSplits(
        classes=list(splits.classes), train=pool.subset(train_rows), train_observed=record.train_observed,
        val=pool.subset(val_rows), test=splits.test if splits.test is not None and len(splits.test) > 0 else None,
        observed=observed, fingerprint=fingerprint, seed=record.protocol_seed,
    )


def protocol_record(protocol: ProtocolSplits, splits: DatasetSplits) -> ProtocolRecord:
    """The protocol file content of ``protocol`` (built from the dataset ``splits``)."""
    parts = [splits.train] + [p for p in (splits.val, splits.test) if p is not None]
    root = image_root(parts)
    return ProtocolRecord(
        dataset=splits.name, fingerprint=protocol.fingerprint, classes=list(protocol.classes),
        train_paths=relative_paths(protocol.train, root), train_observed=protocol.train_observed,
        val_paths=relative_paths(protocol.val, root), observed=str(protocol.observed), protocol_seed=protocol.seed,
    )


def build_protocol(
    splits: DatasetSplits,
    observed: ObservedSpec,
    val_fraction: float = 0.2,
    seed: int = PROTOCOL_SEED,
) -> ProtocolSplits:
    """Apply the protocol to a loaded dataset: the observed labels of the training pool (sampled, shipped with
    the dataset for ``single``, or read from ``observed.path``), then ``val_fraction`` of the pool held out as val
    (unless the dataset has an explicit val split). A protocol file fixes labels and split together."""
    pool = splits.train
    if len(pool) == 0:
        raise ValueError(f"dataset {splits.name} has no training images")
    if observed.kind == "file":
        path = Path(observed.path)
        if path.suffix != ".npy":
            return _protocol_from_record(splits, read_protocol_file(path), path)
        matrix = load_label_matrix(path, len(pool), allowed=(-1, 0, 1))
        if matrix.shape[1] != len(splits.classes):
            raise DataError(f"--observed {path} does not match this dataset: it has {matrix.shape[1]} classes, the "
                            f"dataset {len(splits.classes)}")
        given = ObservedSpec("given", path=path.name)
        return _split_pool(splits, (matrix == 1).astype(np.uint8), given, val_fraction, seed)
    if observed.kind == "single" and splits.train_observed is not None:
        given = ObservedSpec("given", path=splits.observed_source)
        return _split_pool(splits, splits.train_observed, given, val_fraction, seed)
    return _split_pool(splits, sample_observed(pool.labels, observed, seed), observed, val_fraction, seed)
