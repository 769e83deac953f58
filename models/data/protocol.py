"""The SPML protocol of Cole et al. (CVPR 2021; docs/methods.md, "The SPML protocol"): observed labels sampled ONCE from
the training pool as the reference does, then 20% held out as val. The test split is always fully labelled."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from models.data.formatted import load_label_matrix
from models.data.label_bias import bias_weights
from models.data.label_regime import LabelRegime, detect_regimes, parse_declarations
from models.data.observed_file import ProtocolRecord, image_root, read_protocol_file, relative_paths
from models.data.observed_spec import ObservedSpec, parse_observed
from models.data.sampling import observe_partial, observe_uniform, observe_weighted
from models.data.spec_options import split_spec_options
from models.data.types import ALL_SPLITS, DataError, DatasetSplits, LabelledImages

__all__ = ["PROTOCOL_SEED", "ObservedSpec", "ProtocolSplits", "build_protocol", "dataset_fingerprint",
           "parse_observed", "protocol_record", "sample_observed", "split_train_val"]

PROTOCOL_SEED = 1200


def sample_observed(labels: np.ndarray, spec: ObservedSpec, seed: int = PROTOCOL_SEED,
                    splits: DatasetSplits | None = None) -> np.ndarray:
    """Observed int8 matrix (1 positive, -1 negative, 0 unobserved) from the pool's full ``labels`` by ``spec``."""
    labels = np.asarray(labels)
    if spec.kind == "all":
        return (labels == 1).astype(np.int8)
    if spec.kind == "partial":
        return observe_partial(labels, spec.rate, seed)
    if spec.kind != "single":
        raise ValueError(f"--observed {spec} is read from a file, not sampled")
    if spec.variant == "uniform":
        return observe_uniform(labels, spec.num_pos, spec.num_neg, seed)
    if splits is None:
        raise ValueError(f"--observed {spec} needs the dataset (its objects or classes), not only its labels")
    weights = bias_weights(spec.variant, splits, spec.weights)
    return observe_weighted(labels, weights, seed, uniform_if_equal=spec.variant == "empirical")


def resolve_observed(observed: ObservedSpec, splits: DatasetSplits) -> ObservedSpec:
    """``--observed auto``: ``single`` on a benchmark (complete training labels), ``all`` on a user's own data."""
    if observed.kind != "auto":
        return observed
    kind = "single" if "train" in splits.complete_splits else "all"
    return replace(observed, kind=kind)


def split_train_val(n: int, val_fraction: float = 0.2, seed: int = PROTOCOL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Cole et al.'s split: ``RandomState(seed)`` permutes ``range(n)``; train first, val last, each sorted."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError("val_fraction must be in [0, 1)")
    perm = np.random.RandomState(seed).permutation(n)
    n_val = round(val_fraction * n)
    return np.sort(perm[: n - n_val]), np.sort(perm[n - n_val :])


@dataclass
class ProtocolSplits:
    """Train images with full and observed labels, the val split, an optional (fully labelled) test split."""

    classes: list[str]
    train: LabelledImages  # .labels are the FULL (annotated) labels
    train_observed: np.ndarray  # (N_train, C) int8: 1 observed positive, -1 observed negative, 0 unobserved
    val: LabelledImages  # .labels: what val is scored with (clean, or the observed positives with val=observed)
    test: LabelledImages | None
    observed: ObservedSpec
    fingerprint: str
    seed: int = PROTOCOL_SEED  # the protocol seed that sampled the labels and drew the split
    val_observed: np.ndarray | None = None  # (N_val, C) int8 observed labels of the val images (None: unknown)
    declared_labels: str = "auto"  # the label regimes the user declared (--labels: for every split or per split)
    complete_splits: tuple[str, ...] = ALL_SPLITS  # the splits the dataset says are complete (DatasetSplits)

    @cached_property
    def regimes(self) -> dict[str, LabelRegime]:
        """The label regime of each split's labels as given (train: annotated; val: as scored)."""
        parts = {"train": self.train.labels, "val": self.val.labels,
                 "test": self.test.labels if self.test is not None else None}
        regimes = detect_regimes(parts, self.declared_labels, self.complete_splits)
        known = {"train": self.train_observed, "val": self.val_observed}
        return {split: replace(regime, negatives=int((known[split] < 0).sum()))
                if known.get(split) is not None else regime for split, regime in regimes.items()}

    def has_full_labels(self, split: str) -> bool:
        """Whether ``split`` (train, val or test) has full labels: figures that need them are computed on it."""
        regime = self.regimes.get(split)
        return regime is not None and regime.full

    @property
    def train_labels_full(self) -> bool:
        """Whether the training images' annotated labels are complete: the oracle methods may train on them."""
        return self.has_full_labels("train")

    @property
    def train_has_full_labels(self) -> bool:
        """Whether the training split has full labels that training does not observe."""
        return self.train_labels_full and not np.array_equal(self.train_observed, self.train.labels)

    def summary(self) -> str:
        """One line describing split sizes and label counts."""
        pos = (self.train_observed == 1).sum(1).mean() if len(self.train) else 0.0
        neg = (self.train_observed == -1).sum(1).mean() if len(self.train) else 0.0
        full = self.train.labels.sum(1).mean() if len(self.train) else 0.0
        test = len(self.test) if self.test is not None else 0
        negatives = f" and {neg:.2f} negatives" if neg else ""
        val_labels = " (observed labels)" if self.observed.val == "observed" else ""
        return (f"train {len(self.train)} (observed {self.observed}: {pos:.2f} labels/image of {full:.2f}"
                f"{negatives}), val {len(self.val)}{val_labels}, test {test}, {len(self.classes)} classes")


def dataset_fingerprint(splits: DatasetSplits) -> str:
    """A short sha256 of the class names, relative paths and labels: it identifies the annotation."""
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


def _val_part(val: LabelledImages, val_observed: np.ndarray | None, observed: ObservedSpec,
              where: str) -> LabelledImages:
    """``val`` scored with its clean labels, or (``val=observed``) with its observed positives."""
    if observed.val == "clean":
        return val
    if val_observed is None:
        raise DataError(f"--observed {observed}: {where} has no observed labels for the validation images, so "
                        "they cannot be scored with them (val=observed)")
    return LabelledImages(val.paths, (val_observed == 1).astype(np.uint8), val.classes)


def _split_pool(
    splits: DatasetSplits, pool_observed: np.ndarray, observed: ObservedSpec, val_fraction: float, seed: int
) -> ProtocolSplits:
    """Hold out ``val_fraction`` of the pool as val (unless there is a val split), with its observed labels."""
    pool = splits.train
    if splits.val is not None and len(splits.val) > 0:
        train, train_obs, val = pool, pool_observed, splits.val
        samplable = observed.kind in ("single", "partial", "all") and (
            observed.kind != "single" or observed.variant in ("uniform", "empirical"))
        if samplable:
            explicit = replace(splits, train=splits.val, train_observed=None, train_objects=None)
            val_obs: np.ndarray | None = sample_observed(val.labels, observed, seed, explicit)
        else:
            val_obs = None
    else:
        tr_idx, va_idx = split_train_val(len(pool), val_fraction, seed)
        if len(va_idx) == 0:
            raise ValueError(f"dataset {splits.name}: too few training images ({len(pool)}) to hold out a val split")
        train, train_obs, val = pool.subset(tr_idx), pool_observed[tr_idx], pool.subset(va_idx)
        val_obs = pool_observed[va_idx]
    return ProtocolSplits(
        classes=list(splits.classes), train=train, train_observed=train_obs,
        val=_val_part(val, val_obs, observed, f"dataset {splits.name}'s val split"),
        test=splits.test if splits.test is not None and len(splits.test) > 0 else None,
        observed=observed, fingerprint=dataset_fingerprint(splits), seed=seed, val_observed=val_obs)


def _rows_by_path(record_paths: list[str], candidates: dict[str, int], path: Path, what: str) -> list[int]:
    """Row numbers of ``record_paths`` among ``candidates``; a missing one -> ``DataError`` with the count."""
    missing = [p for p in record_paths if p not in candidates]
    if missing:
        raise DataError(f"--observed {path} does not match this dataset: {len(missing)} of its {len(record_paths)} "
                        f"{what} images are not in it (first: {missing[0]})")
    return [candidates[p] for p in record_paths]


def _recorded_spec(text: str) -> ObservedSpec:
    """The :class:`ObservedSpec` a protocol file's ``observed`` member names (``given:NAME[?val=...]`` too)."""
    if not text.startswith("given:"):
        return parse_observed(text, check_files=False)
    name, options = split_spec_options(text[len("given:"):], ("val",), "given")
    return ObservedSpec("given", path=name, val=options.get("val", "clean") or "clean")


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
    observed = _recorded_spec(record.observed)
    val = _val_part(pool.subset(val_rows), record.val_observed, observed, f"{path} (a version-1 protocol file)")
    return ProtocolSplits(
        classes=list(splits.classes), train=pool.subset(train_rows), train_observed=record.train_observed,
        val=val, test=splits.test if splits.test is not None and len(splits.test) > 0 else None,
        observed=observed, fingerprint=fingerprint, seed=record.protocol_seed, val_observed=record.val_observed)


def protocol_record(protocol: ProtocolSplits, splits: DatasetSplits) -> ProtocolRecord:
    """The protocol file content of ``protocol`` (built from the dataset ``splits``)."""
    parts = [splits.train] + [p for p in (splits.val, splits.test) if p is not None]
    root = image_root(parts)
    return ProtocolRecord(
        dataset=splits.name, fingerprint=protocol.fingerprint, classes=list(protocol.classes),
        train_paths=relative_paths(protocol.train, root), train_observed=protocol.train_observed,
        val_paths=relative_paths(protocol.val, root), observed=str(protocol.observed), protocol_seed=protocol.seed,
        val_observed=protocol.val_observed)


def build_protocol(splits: DatasetSplits, observed: ObservedSpec, val_fraction: float = 0.2, seed: int = PROTOCOL_SEED,
                   labels: str = "auto") -> ProtocolSplits:
    """Apply the protocol to a loaded dataset: the observed labels, then ``val_fraction`` held out unless the dataset
    has a val split; ``labels`` declares the regimes."""
    parse_declarations(labels)  # a bad --labels value fails here
    protocol = replace(_with_known_negatives(_build_protocol(splits, resolve_observed(observed, splits),
                                                             val_fraction, seed)),
                       declared_labels=labels.strip(), complete_splits=tuple(splits.complete_splits))
    protocol.regimes  # noqa: B018  (detected now: a contradicted declaration fails before any training)
    return protocol


def _with_known_negatives(protocol: ProtocolSplits) -> ProtocolSplits:
    """The labels the dataset gives as absent become observed negatives (-1) of train and val."""
    def marked(observed: np.ndarray | None, images: LabelledImages) -> np.ndarray | None:
        if observed is None or images.negatives is None:
            return observed
        out = np.array(observed, dtype=np.int8, copy=True)
        out[images.negatives.astype(bool)] = -1
        return out

    train = marked(protocol.train_observed, protocol.train)
    assert train is not None
    return replace(protocol, train_observed=train, val_observed=marked(protocol.val_observed, protocol.val))


def _build_protocol(splits: DatasetSplits, observed: ObservedSpec, val_fraction: float, seed: int) -> ProtocolSplits:
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
        given = ObservedSpec("given", path=path.name, val=observed.val)
        return _split_pool(splits, matrix.astype(np.int8), given, val_fraction, seed)
    if observed.is_published and splits.train_observed is not None:
        given = ObservedSpec("given", path=splits.observed_source, val=observed.val)
        return _split_pool(splits, splits.train_observed, given, val_fraction, seed)
    return _split_pool(splits, sample_observed(pool.labels, observed, seed, splits), observed, val_fraction, seed)
