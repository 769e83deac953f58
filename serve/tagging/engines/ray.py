"""The ``ray`` engine: model actors (:class:`TagActor`) on work units (docs/tagging-at-scale.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from models.runtimes import parse_device
from serve.outputs.records import Result
from serve.tagging.engines.base import ENGINES, Engine, EngineUnavailableError
from serve.tagging.scoring import score_items
from serve.tagging.sources import Item, shard_items

if TYPE_CHECKING:
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan

#: How many times a model call that raised is retried in its actor (with the model reloaded).
MAX_BATCH_RETRIES = 3
#: How many times Ray restarts a model actor that died (its units are run again).
MAX_ACTOR_RESTARTS = 3
#: Images per work unit of a folder or list file: results come back, and are journaled, unit by unit.
CHUNK_IMAGES = 64
#: Units an actor works on at once: while one unit's batch is in the model, the next unit's images decode.
CALLS_PER_ACTOR = 2

#: A work unit: ``("images", [(key, location), ...])`` or ``("shard", (path, [keys done]))``.
Unit = tuple[str, Any]


def import_ray() -> Any:
    """The ``ray`` module; raises :class:`EngineUnavailableError` with the install hint when it is missing."""
    try:
        import ray
    except ImportError:
        raise EngineUnavailableError('the ray engine needs Ray: pip install "spml[ray]" (or pip install ray)') from None
    return ray


def actor_layout(nodes: Sequence[dict[str, Any]], job: TagJob) -> tuple[int, int]:
    """``(actors, CPUs per actor)`` for the cluster's alive ``nodes`` and the job's settings."""
    resources = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if job.cluster.gpus_per_worker > 0:
        hosts = [(r, int(r.get("GPU", 0) // job.cluster.gpus_per_worker)) for r in resources]
        hosts = [(r, k) for r, k in hosts if k > 0]
        if not hosts:
            raise RuntimeError(
                f"no node of the Ray cluster has {job.cluster.gpus_per_worker:g} GPU(s) for a model actor")
        workers = job.run.workers or sum(k for _, k in hosts)
        cpus = job.cluster.cpus_per_worker or max(1, min(int(r.get("CPU", 0)) // k for r, k in hosts))
        return workers, cpus
    cpu_nodes = [int(r.get("CPU", 0)) for r in resources if r.get("CPU", 0) >= 1] or [1]
    workers = job.run.workers or len(cpu_nodes)
    cpus = job.cluster.cpus_per_worker or max(1, min(min(cpu_nodes), sum(cpu_nodes) // workers))  # fits on every node
    return workers, cpus


class TagActor:
    """A model actor: loads the model once and scores units, decoding ahead on ``threads`` threads."""

    def __init__(
        self, model: str, backend: str | None, device: str | None, max_pixels: int | None, batch_size: int, threads: int
    ) -> None:
        from serve.images import ImagePreprocessor
        from serve.predictor import Predictor

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

    def score_unit(self, unit: Unit) -> tuple[list[str], np.ndarray, list[str]]:
        """One work unit -> (keys, scores ``(N, C)`` float32, errors: "" for the scored images)."""
        kind, payload = unit
        if kind == "shard":
            location, done = payload
            skip = set(done)
            items: Any = (i for i in shard_items(location) if i.key not in skip)
        else:
            items = [Item(key, location) for key, location in payload]
        results = [r for batch in score_items(items, self.score, self.preprocess, self.batch_size, pool=self.pool)
                   for r in batch]  # fmt: skip
        scores = np.zeros((len(results), len(self.predictor.classes)), np.float32)
        for i, result in enumerate(results):
            if result.scores is not None:
                scores[i] = result.scores
        return [r.key for r in results], scores, [r.error or "" for r in results]


def work_units(plan: TagPlan) -> list[Unit]:
    """The plan's work units: chunks of :data:`CHUNK_IMAGES` images, or one per shard with its done keys."""
    if plan.source.kind != "shards":
        todo = [(i.key, i.location) for i in plan.todo]
        return [("images", todo[i : i + CHUNK_IMAGES]) for i in range(0, len(todo), CHUNK_IMAGES)]
    by_shard: dict[str, list[str]] = {}
    for key in plan.done:
        by_shard.setdefault(key.split("/", 1)[0], []).append(key)
    return [("shard", (u.location, by_shard.get(u.key, []))) for u in plan.source.locations()]


def score(
    job: TagJob, plan: TagPlan, report: Callable[[str], None], actor_cls: type = TagActor
) -> Iterator[list[Result]]:
    """Score the plan's images on the Ray cluster, started only when there is something to tag."""
    if job.model is None:
        raise ValueError("the ray engine needs a model file (its actors load it), not a model in memory")
    if parse_device(job.run.device)[0] in ("cuda", "tensorrt") and not job.cluster.gpus_per_worker:
        raise ValueError(f"--device {job.run.device} with the ray engine needs --gpus-per-worker (actors get no GPU)")
    ray = import_ray()
    from ray.util import ActorPool

    units = work_units(plan)
    if not units:
        return
    if not ray.is_initialized():  # join the cluster, or start a local instance; reuse one this process has
        ray.init(address=job.cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers, cpus = actor_layout(ray.nodes(), job)
    gpus = f" and {job.cluster.gpus_per_worker:g} GPU(s)" if job.cluster.gpus_per_worker else ""
    report(f"engine ray: {workers} model actor(s), {cpus} CPU(s){gpus} each")
    remote = ray.remote(actor_cls).options(num_cpus=cpus, num_gpus=job.cluster.gpus_per_worker or None,
                                           max_concurrency=CALLS_PER_ACTOR, max_restarts=MAX_ACTOR_RESTARTS,
                                           max_task_retries=MAX_ACTOR_RESTARTS)
    device = job.run.device or ("cuda" if job.cluster.gpus_per_worker else None)
    actors = [remote.remote(str(job.model), job.run.backend, device, job.run.max_pixels, job.run.batch_size, cpus)
              for _ in range(workers)]  # fmt: skip
    try:
        pool = ActorPool([actor for actor in actors for _ in range(CALLS_PER_ACTOR)])
        try:
            for keys, scores, errors in pool.map_unordered(lambda actor, unit: actor.score_unit.remote(unit), units):
                yield [Result(k, None, e) if e else Result(k, s) for k, s, e in zip(keys, scores, errors, strict=True)]
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"the Ray job failed ({_one_line(exc)})") from None
    finally:
        for actor in actors:
            ray.kill(actor)


def _one_line(exc: BaseException) -> str:
    """A short reason: the last line of a remote exception, or the first one of an actor's death notice."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if "Actor" in type(exc).__name__ else lines[-1]


@ENGINES.register
class RayEngine(Engine):
    """The ``ray`` engine (module docstring)."""

    name = "ray"
    description = "a Ray cluster: a pool of model actors, tar shards or image lists split into work units"
    score = staticmethod(score)
    check_available = staticmethod(import_ray)
