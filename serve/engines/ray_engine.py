"""The ``ray`` engine: tag a SOURCE on a Ray cluster (or a local Ray instance) with Ray Data.

Dataflow: the driver lists the work units (image paths or URIs of a folder / list file, or ``.tar`` shard files,
minus what ``--existing skip`` finds done) -> ``ray.data.from_items`` -> shards are expanded into samples in
tasks (:func:`serve.sources.shard_items`) -> images are decoded and preprocessed in tasks
(:func:`serve.tag.decode_item` with the one :class:`serve.predictor.ImagePreprocessor`) -> a pool of model actors
(:class:`ModelActor`, ``--workers`` of them, ``--gpus-per-worker`` each) scores batches -> the driver streams the
results, writes each batch to the run's journal (``<output>.partial``) and the sidecars, and at the end writes the
run file (sorted by path, like the local engine) and the errors file atomically, then removes the journal.

Faults: Ray Data restarts a model actor that dies and resubmits its batch, and :class:`ModelActor` retries a
batch whose scoring raised (:data:`MAX_BATCH_RETRIES` times, model reloaded); a batch's results reach the driver
once, so no image is lost or doubled (the driver also refuses a key seen twice). An undecodable file is an
errors-file row, never a failed job. An interrupted run leaves its journal, and ``--existing skip`` (the default)
resumes from it without redoing or duplicating images.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from serve.engines import EngineUnavailableError, TagJob
from serve.predictor import ImagePreprocessor, Predictor
from serve.records import (
    DEFAULT_SEPARATOR,
    Journal,
    default_errors_path,
    journal_path,
    read_journal,
    tag_record,
    write_errors,
    write_run_file,
)
from serve.sources import Item, Source, shard_items
from serve.tag import TagSummary, check_previous, decode_item, plan_tagging
from serve.thresholds import resolve_thresholds

#: How many times a batch whose scoring raised is retried (on a restarted or another actor).
MAX_BATCH_RETRIES = 3
#: Images per decode task (decoding runs in Ray tasks, independent of the model's batch size).
DECODE_BATCH = 32


def import_ray() -> Any:
    """The ``ray`` module; raises :class:`EngineUnavailableError` with the install hint when it is missing."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise EngineUnavailableError(
            'the ray engine needs Ray Data: pip install "spml[ray]" (or pip install "ray[data]")'
        ) from None
    return ray


def check_available() -> None:
    """Raise :class:`EngineUnavailableError` (with the install hint) when Ray Data is not installed."""
    import_ray()


def connect(ray: Any, address: str | None) -> None:
    """Join the cluster at ``address``, or start a local Ray instance; reuse an instance this process already has."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-dataset INFO lines between our messages
    if ray.is_initialized():
        return
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)


def expand_shard(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Ray Data ``flat_map``: one shard unit -> one row per sample (key, image bytes or error)."""
    skip = set(row["skip"])
    for item in shard_items(row["location"]):
        if item.key not in skip:
            yield {"key": item.key, "location": item.location, "data": item.data, "error": item.error}


def decode_batch(batch: dict[str, np.ndarray], preprocess: ImagePreprocessor, size: int) -> dict[str, np.ndarray]:
    """Ray Data ``map_batches`` task: rows of (key, location[, data, error]) -> (key, image, error); a row that
    cannot be decoded gets a zero image and its reason in ``error`` ("" for good rows)."""
    keys = [str(k) for k in batch["key"]]
    images = np.zeros((len(keys), 3, size, size), np.float32)
    errors = []
    for i, key in enumerate(keys):
        data = batch["data"][i] if "data" in batch else None
        known = batch["error"][i] if "error" in batch else None
        item = Item(key, str(batch["location"][i]), bytes(data) if data is not None else None, known or None)
        array, error = decode_item(preprocess, item)
        if array is not None:
            images[i] = array
        errors.append(error or "")
    return {"key": np.array(keys, dtype=object), "image": images, "error": np.array(errors, dtype=object)}


class ModelActor:
    """Ray Data actor: loads the model once, then scores batches of decoded images (rows with an error pass).

    Ray Data restarts an actor that dies and resubmits its batch (its defaults); a batch whose scoring raises
    is retried here, with the model reloaded, up to :data:`MAX_BATCH_RETRIES` times before the job fails."""

    def __init__(self, model: str, backend: str | None, device: str | None) -> None:
        self.spec = (model, backend, device)
        self.predictor = Predictor.load(model, backend, device)

    def score(self, images: np.ndarray) -> np.ndarray:
        """Sigmoid scores ``(N, C)`` of preprocessed images (one runtime call)."""
        return self.predictor.scores_from_inputs(images)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """(key, image, error) -> (key, scores ``(N, C)`` float32, error)."""
        good = np.array([not e for e in batch["error"]], dtype=bool)
        scores = np.zeros((len(good), len(self.predictor.classes)), np.float32)
        for attempt in range(MAX_BATCH_RETRIES + 1):
            try:
                if good.any():
                    scores[good] = self.score(batch["image"][good])
                break
            except Exception:
                if attempt == MAX_BATCH_RETRIES:
                    raise
                self.predictor = Predictor.load(*self.spec)
        return {"key": batch["key"], "scores": scores, "error": batch["error"]}


def _units(source: Source, todo: list[Item] | None, done: set[str]) -> list[dict[str, Any]]:
    """Rows of the first dataset: one per image to tag (folders, list files) or per shard file (with the keys
    of its samples already done)."""
    if todo is not None:
        return [{"key": i.key, "location": i.location} for i in todo]
    units = []
    for unit in source.locations():
        prefix = unit.key + "/"
        units.append({"key": unit.key, "location": unit.location, "skip": [k for k in done if k.startswith(prefix)]})
    return units


def build_dataset(
    ray: Any,
    job: TagJob,
    source: Source,
    units: list[dict[str, Any]],
    preprocess: ImagePreprocessor,
    size: int,
    actor_cls: type = ModelActor,
) -> Any:
    """The Ray Data pipeline: units -> (shard expansion) -> decode tasks -> model actor pool."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the engine shows one bar of its own (images done)
    ctx.print_on_execution_start = False
    ds = ray.data.from_items(units, override_num_blocks=max(1, min(len(units), 200)))
    if source.kind == "shards":
        ds = ds.flat_map(expand_shard)
    ds = ds.map_batches(decode_batch, fn_kwargs={"preprocess": preprocess, "size": size}, batch_size=DECODE_BATCH)
    workers = job.workers or 1
    return ds.map_batches(
        actor_cls,
        fn_constructor_kwargs={"model": str(job.model), "backend": job.backend, "device": job.device},
        batch_size=job.batch_size,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_gpus=job.gpus_per_worker or None,
    )


def run(
    job: TagJob, predictor: Predictor, warn: Callable[[str], None] | None = None, actor_cls: type = ModelActor
) -> TagSummary:
    """Tag ``job`` with Ray Data (``predictor`` is the driver's copy: classes, thresholds, preprocessing).
    ``actor_cls`` scores the batches (a :class:`ModelActor`; tests pass one that fails on purpose)."""
    ray = import_ray()
    start = time.perf_counter()
    output = Path(job.output)
    journal_file = journal_path(output)
    journal_records = read_journal(journal_file)[0] if job.existing == "skip" else {}  # failures are retried
    plan = plan_tagging(job.source, output, job.existing, job.sidecar, job.partition, journal_records)
    classes = list(predictor.classes)
    thresholds = resolve_thresholds(predictor.meta, job.threshold, job.per_class)
    check_previous(plan.previous, plan.done, classes, output)
    todo = None if plan.source.kind == "shards" else list(plan.todo)
    done = set(plan.done)
    records = {k: plan.previous[k] for k in done if k in plan.previous}
    summary = TagSummary(plan.source.spec, output, 0, list(plan.scan_errors), plan.ignored, skipped=len(done))
    summary.errors_file = Path(job.errors) if job.errors is not None else default_errors_path(output)
    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    units = _units(plan.source, todo, done)
    if units:
        connect(ray, job.address)
        preprocess = ImagePreprocessor(predictor.transform, job.max_pixels)
        ds = build_dataset(ray, job, plan.source, units, preprocess, predictor.meta.image_size, actor_cls)
        journal = Journal(journal_file, fresh=job.existing != "skip")
        bar = tqdm(
            total=len(todo) if todo is not None else None,
            unit="img",
            file=sys.stderr,
            disable=not job.progress,
            dynamic_ncols=True,
        )
        try:
            for batch in _batches(ray, ds, journal_file):
                new, failed = [], []
                for key, row, error in zip(batch["key"], batch["scores"], batch["error"], strict=True):
                    if error:
                        failed.append((str(key), str(error)))
                        report(f"skipped {key}: {error}")
                    else:
                        new.append(tag_record(str(key), row, classes, thresholds, job.top_k))
                for rec in new:
                    if rec["path"] in records:  # never expected: Ray delivers each batch's results once
                        raise RuntimeError(f"image {rec['path']} came back twice")
                    records[rec["path"]] = rec
                    if job.sidecar is not None:
                        _write_sidecar(job, plan.sidecars[rec["path"]], rec["tags"])
                journal.write(new, failed)
                summary.tagged += len(new)
                summary.failed += failed
                bar.update(len(new) + len(failed))
        finally:
            bar.close()
            journal.close(remove=False)
    if records or summary.failed:
        separator = job.sidecar.separator if job.sidecar else DEFAULT_SEPARATOR
        write_run_file(output, records.values(), classes, separator)
    if summary.failed or summary.errors_file.exists():
        write_errors(summary.errors_file, summary.failed)
    journal_file.unlink(missing_ok=True)
    summary.seconds = time.perf_counter() - start
    return summary


def _batches(ray: Any, ds: Any, journal_file: Path) -> Iterator[dict[str, np.ndarray]]:
    """The pipeline's result batches; a failed Ray job becomes a one-line ``RuntimeError``."""
    try:
        yield from ds.iter_batches(batch_size=None, batch_format="numpy")
    except ray.exceptions.RayError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(
            f"the Ray job failed ({reason}); finished images are kept in {journal_file}: run again to resume"
        ) from None


def _write_sidecar(job: TagJob, path: Path, tags: list[str]) -> None:
    from serve.sidecars import write_sidecar

    assert job.sidecar is not None
    write_sidecar(path, tags, job.sidecar, append=job.existing == "append")
