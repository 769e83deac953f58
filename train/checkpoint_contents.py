"""Checkpoint helpers of the trainer: RNG states that load with ``weights_only=True``, reading a checkpoint once
for every rank, and the metadata a run's checkpoints carry.

``best.pt`` holds the selected weights; ``last.pt`` adds the ``training`` state that ``--resume`` continues from
(written by :meth:`train.trainer.Trainer.save_last`, every piece an exact ``state_dict``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.checkpoint import Checkpoint, ModelMeta, load_checkpoint
from models.data.observed_file import OBSERVED_FILE
from train.distributed import barrier, broadcast_object, current_world
from train.run_setup import run_preprocessing


def capture_rng() -> dict[str, Any]:
    """All RNG states as tensors/lists (loadable with ``weights_only=True``)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_shared(path: Path, device: torch.device) -> Checkpoint:
    """The checkpoint at ``path`` on every rank: rank 0 reads it and sends it to the others under torchrun (nodes
    need not share the run folder)."""
    if not current_world().distributed:
        return load_checkpoint(path, map_location=device)
    barrier()  # rank 0 has finished writing it
    return broadcast_object(load_checkpoint(path, map_location="cpu") if current_world().is_main else None)


def run_meta(run: Any, epoch: int, metrics: dict[str, Any]) -> ModelMeta:
    """The metadata of a checkpoint of ``run`` (a :class:`~train.run_preparation.PreparedRun`) at ``epoch``
    (``metrics``: what it was selected or tested with): what the model is, the run's data and protocol, its label
    regimes, selection criterion and k."""
    cfg, splits, dataset = run.cfg, run.splits, run.dataset
    transform = run_preprocessing(cfg)
    k = run.expected_positives
    return ModelMeta(
        classes=list(splits.classes), arch=cfg.arch, image_size=cfg.image_size, lgconv=bool(cfg.lgconv),
        mean=transform.mean, std=transform.std, interpolation=transform.interpolation,  # type: ignore[arg-type]
        crop=transform.crop, weights=cfg.weights,
        head=run.model.head_meta(), method=cfg.method, method_hparams=run.method.hparams_dict(),
        data={
            "name": dataset.name, "source": dataset.source, "fingerprint": splits.fingerprint,
            # the --observed value (export rebuilds the split from it), and the labels it gave
            "observed": cfg.observed, "observed_labels": str(splits.observed), "protocol_seed": cfg.protocol_seed,
            "val_fraction": cfg.val_fraction, "num_train": len(splits.train), "num_val": len(splits.val),
            "observed_file": OBSERVED_FILE, "observed_sha256": run.data.protocol_sha256,
            "labels": cfg.labels, "label_regimes": {split: regime.kind for split, regime in splits.regimes.items()},
            "selection": run.selection.name, "expected_positives": k.to_dict() if k else None,
            "k_estimate": cfg.chosen.get("expected_positives") if cfg.chosen else None,
        },
        metrics=metrics, epoch=epoch,
    )
