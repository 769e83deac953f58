"""The ``ray`` engine: score a plan on a Ray cluster (or a local Ray instance) with Ray Data.

The driver (this process) handles metadata only: the plan's keys and locations, the results coming back. It
never imports torch or ONNX Runtime and needs no GPU, so the head node of a GPU cluster may be CPU-only.

Dataflow: one row per image to tag (key, location), or, for tar shards, one row per shard file with the keys
already done inside it (expanded into samples, with their encoded bytes, by :func:`expand_shard`) -> a pool of
model actors (:class:`TagActor`: ``--workers`` of them, ``--gpus-per-worker`` GPUs and ``--cpus-per-worker``
CPUs each). Each actor loads the model once, on its own device, and runs the local engine's loop
(:func:`serve.scoring.score_items`) on the chunks it receives: its CPUs decode images in threads ahead of the
model, as uint8, so decoding is fused with inference and only paths (or a shard's encoded bytes) travel to the
actors, and only scores travel back. The driver receives the results batch by batch; the pipeline journals them.

CPU budget: by default one actor per node (CPU models) with all of the node's CPUs, or one actor per GPU
share (``--gpus-per-worker``) with the node's CPUs split between its actors; each actor uses its CPUs both for
decoding and for the model's threads, as the local engine does on one machine.

Faults: a batch whose scoring raises is retried in the actor, with the model reloaded, up to
:data:`MAX_BATCH_RETRIES` times. An actor that dies (killed, out of memory, node lost) ends the Ray job; the
engine then starts a new one for the images not returned yet, up to :data:`MAX_JOB_RESTARTS` times, so no
image is lost or returned twice. Ray Data's own actor restarts are switched off: they keep the actors'
constructor arguments in the object store and make Ray log an error line on every run (ray-project/ray#53727).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from serve.engines import EngineUnavailableError, Result
from serve.runtimes import parse_device
from serve.scoring import score_items
from serve.sources import Item, shard_items

if TYPE_CHECKING:
    from serve.tag import TagJob, TagPlan

#: How many times a batch whose scoring raised is retried in its actor (with the model reloaded).
MAX_BATCH_RETRIES = 3
#: How many times the Ray job is started again, for the images not returned yet, after an actor died.
MAX_JOB_RESTARTS = 3
#: Images per actor call (at least one model batch): results come back, and are journaled, call by call.
CHUNK_IMAGES = 64
#: Calls an actor runs at once: while one call's batch is in the model, the next call's images decode.
CALLS_PER_ACTOR = 2


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


class _HandledActorDeaths(logging.Filter):
    """Drops Ray Data's error records (tracebacks) about a dead actor: the engine restarts the job for the images
    not tagged yet and says so in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return exc is None or not _actor_died(exc)


def connect(ray: Any, address: str | None) -> None:
    """Join the cluster at ``address``, or start a local Ray instance; reuse an instance this process already has."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-dataset INFO lines between our messages
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled": ours is on
    for name in ("ray.data.exceptions", "ray.data._internal.execution.streaming_executor_state"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _HandledActorDeaths) for f in logger.filters):
            logger.addFilter(_HandledActorDeaths())
    if ray.is_initialized():
        return
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)


def actor_layout(nodes: Sequence[dict[str, Any]], job: TagJob) -> tuple[int, int]:
    """``(actors, CPUs per actor)`` for the cluster's alive ``nodes`` (``ray.nodes()``) and the job's
    ``workers``, ``gpus_per_worker`` and ``cpus_per_worker`` (each used as given when set)."""
    resources = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if job.gpus_per_worker > 0:
        hosts = [(r, int(r.get("GPU", 0) // job.gpus_per_worker)) for r in resources]
        hosts = [(r, k) for r, k in hosts if k > 0]
        if not hosts:
            raise RuntimeError(f"no node of the Ray cluster has {job.gpus_per_worker:g} GPU(s) for a model actor")
        workers = job.workers or sum(k for _, k in hosts)
        cpus = job.cpus_per_worker or max(1, min(int(r.get("CPU", 0)) // k for r, k in hosts))
        return workers, cpus
    cpu_nodes = [int(r.get("CPU", 0)) for r in resources if r.get("CPU", 0) >= 1] or [1]
    workers = job.workers or len(cpu_nodes)
    cpus = job.cpus_per_worker or max(1, min(max(cpu_nodes), sum(cpu_nodes) // workers))
    return workers, cpus


def expand_shard(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Ray Data ``flat_map``: one shard unit -> one row per sample not done yet (key, image bytes or error)."""
    skip = set(row["skip"])
    for item in shard_items(row["location"]):
        if item.key not in skip:
            yield {"key": item.key, "location": item.location, "data": item.data, "error": item.error or ""}


class TagActor:
    """Ray Data actor: loads the model once on its device, then decodes (``threads`` threads, ahead of the model)
    and scores the chunks of images it receives. It runs :data:`CALLS_PER_ACTOR` calls at once, one of them in
    the model at a time, so that decoding never waits for the model."""

    def __init__(
        self, model: str, backend: str | None, device: str | None, max_pixels: int | None, batch_size: int, threads: int
    ) -> None:
        from serve.predictor import ImagePreprocessor, Predictor

        self.spec = (model, backend, device, max_pixels, threads)
        self.predictor = Predictor.load(model, backend, device, max_pixels=max_pixels, threads=threads)
        self.preprocess = ImagePreprocessor(self.predictor.transform, max_pixels)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")
        self.batch_size = batch_size
        self.model_lock = threading.Lock()

    def run_model(self, images: np.ndarray) -> np.ndarray:
        """Sigmoid scores ``(N, C)`` of preprocessed images: one runtime call (one call at a time)."""
        with self.model_lock:
            return self.predictor.scores_from_inputs(images)

    def score(self, images: np.ndarray) -> np.ndarray:
        """:meth:`run_model`, retried with the model reloaded when it raises (:data:`MAX_BATCH_RETRIES` times)."""
        from serve.predictor import Predictor

        for _ in range(MAX_BATCH_RETRIES):
            try:
                return self.run_model(images)
            except Exception:
                model, backend, device, max_pixels, threads = self.spec
                self.predictor = Predictor.load(model, backend, device, max_pixels=max_pixels, threads=threads)
        return self.run_model(images)

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows (key, location[, data, error]) -> (key, scores ``(N, C)`` float32, error; "" when scored)."""
        data, known = rows.get("data"), rows.get("error")
        items = [
            Item(
                str(key),
                str(rows["location"][i]),
                bytes(data[i]) if data is not None and data[i] is not None else None,
                str(known[i]) if known is not None and known[i] else None,
            )
            for i, key in enumerate(rows["key"])
        ]
        results = [r for batch in score_items(items, self.score, self.preprocess, self.batch_size, pool=self.pool)
                   for r in batch]  # fmt: skip
        scores = np.zeros((len(results), len(self.predictor.classes)), np.float32)
        for i, result in enumerate(results):
            if result.scores is not None:
                scores[i] = result.scores
        return {
            "key": np.array([r.key for r in results], dtype=object),
            "scores": scores,
            "error": np.array([r.error or "" for r in results], dtype=object),
        }


def _units(plan: TagPlan, todo: list[Item] | None, returned: set[str]) -> list[dict[str, Any]]:
    """Rows of the Ray job: one per image of ``todo`` still to tag (folders, list files), or, for shards
    (``todo=None``), one per shard file with the keys done inside it (done before or ``returned`` by this run),
    grouped in one pass."""
    if todo is not None:
        return [{"key": i.key, "location": i.location} for i in todo if i.key not in returned]
    by_shard: dict[str, list[str]] = {}
    for key in (*plan.done, *returned):
        by_shard.setdefault(key.split("/", 1)[0], []).append(key)
    return [{"key": u.key, "location": u.location, "skip": by_shard.get(u.key, [])} for u in plan.source.locations()]


def build_dataset(
    ray: Any, job: TagJob, shards: bool, units: list[dict[str, Any]], layout: tuple[int, int], actor_cls: type
) -> Any:
    """The Ray Data pipeline: units -> (shard expansion) -> the pool of model actors (``layout``: actors, CPUs)."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the pipeline shows one bar of its own (images done)
    ctx.print_on_execution_start = False
    workers, cpus = layout
    chunk = job.batch_size * max(1, round(CHUNK_IMAGES / job.batch_size))
    ds = ray.data.from_items(units, override_num_blocks=max(1, min(len(units), 200)))
    if shards:
        ds = ds.flat_map(expand_shard, num_cpus=0)  # reading tars: light, and the actors may hold every CPU
    device = job.device or ("cuda" if job.gpus_per_worker else None)
    kwargs = {"model": str(job.model), "backend": job.backend, "device": device, "max_pixels": job.max_pixels,
              "batch_size": job.batch_size, "threads": cpus}  # fmt: skip
    with warnings.catch_warnings():  # max_restarts has no named parameter (yet): Ray warns about the **kwargs
        warnings.simplefilter("ignore", DeprecationWarning)
        return ds.map_batches(
            actor_cls,
            fn_constructor_kwargs=kwargs,
            batch_size=chunk,
            compute=ray.data.ActorPoolStrategy(
                size=workers, max_concurrent_calls_per_actor=CALLS_PER_ACTOR, enable_true_multi_threading=True
            ),
            num_cpus=cpus,
            num_gpus=job.gpus_per_worker or None,
            max_restarts=0,  # see the module docstring: the engine restarts the job instead
        )


def score(
    job: TagJob, plan: TagPlan, report: Callable[[str], None], actor_cls: type = TagActor
) -> Iterator[list[Result]]:
    """Score the plan's images on the Ray cluster (``actor_cls``: :class:`TagActor`; tests pass one that fails
    on purpose). Starts Ray only when there is something to tag."""
    if job.model is None:
        raise ValueError("the ray engine needs a model file (its actors load it), not a model in memory")
    if parse_device(job.device)[0] in ("cuda", "tensorrt") and not job.gpus_per_worker:
        raise ValueError(f"--device {job.device} with the ray engine needs --gpus-per-worker (actors get no GPU)")
    ray = import_ray()
    shards = plan.source.kind == "shards"
    todo = None if shards else list(plan.todo)
    returned: set[str] = set()
    units = _units(plan, todo, returned)
    if not units:
        return
    connect(ray, job.address)
    workers, cpus = actor_layout(ray.nodes(), job)
    report(f"engine ray: {workers} model actor(s), {cpus} CPU(s)" + (f" and {job.gpus_per_worker:g} GPU(s)" if
           job.gpus_per_worker else "") + " each")  # fmt: skip
    for restart in range(MAX_JOB_RESTARTS + 1):
        ds = build_dataset(ray, job, shards, units, (workers, cpus), actor_cls)
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                results = [
                    Result(str(key), None, str(error)) if error else Result(str(key), row)
                    for key, row, error in zip(batch["key"], batch["scores"], batch["error"], strict=True)
                ]
                results = [r for r in results if r.key not in returned]  # never expected: each batch comes once
                returned.update(r.key for r in results)
                yield results
            return
        except ray.exceptions.RayError as exc:
            reason = _one_line(exc)
            if not _actor_died(exc) or restart == MAX_JOB_RESTARTS:
                raise RuntimeError(f"the Ray job failed ({reason})") from None
            units = _units(plan, todo, returned)
            report(f"a model actor died ({reason}); starting the Ray job again for the images not tagged yet")
            if not units:
                return


def _actor_died(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) says that an actor process died."""
    return any(name in type(exc).__name__ for name in ("ActorDiedError", "RayActorError", "ActorUnavailableError"))


def _one_line(exc: BaseException) -> str:
    """A short reason: the first line of an actor's death notice, else the last line (the remote exception)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if _actor_died(exc) else lines[-1]
