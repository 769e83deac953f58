"""``python -m serve api --model MODEL``: the HTTP service's command line; ``--help`` imports no torch."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.command_line import CommandFailed, UsageError, run_command
from models.registry import Row, Table
from serve import BACKEND_HELP, DEVICE_HELP
from serve import api as defaults
from serve.commands.tag import add_caption_options, add_max_pixels, add_selection_options, caption_rules_of

if TYPE_CHECKING:
    from serve.api.service import ApiSettings


def _run_local(settings: ApiSettings, host: str, port: int, cluster: dict[str, Any]) -> None:
    from serve.api.app import run_local

    run_local(settings, host, port)


def _run_ray(settings: ApiSettings, host: str, port: int, cluster: dict[str, Any]) -> None:
    from serve.api.ray_serve import run_ray

    run_ray(settings, host, port, **cluster)


#: Where the service runs: the value serves ``settings`` on ``host:port`` until stopped.
API_ENGINES: Table[Any] = Table("service engine", [
    Row("local", "one process on this machine: uvicorn, the app's own dynamic batching", _run_local),
    Row("ray", "Ray Serve replicas on a Ray cluster (or a local instance), Ray's batching, autoscaling", _run_ray),
])

API_EPILOG = f"""\
endpoints (the OpenAPI description: /openapi.json, pages at /docs):
  POST /v1/tag    every class score and the tags of each image, chosen as by `serve tag`: multipart files
                  (curl -F file=@cat.jpg), one raw image body (curl --data-binary @cat.jpg -H 'Content-Type:
                  image/jpeg'), or JSON {{"paths": [...]}} (--allow-paths) / {{"urls": [...]}} (--allow-urls);
                  query options override the server's: select, threshold, max_tags, min_score, and caption
                  rules added to the server's: exclude, exclude_re, replace, first, spaces, escape, weights
  GET  /v1/model  the model, its classes, the default selection, thresholds and caption rules, the limits
  GET  /healthz   200 while the process serves;  GET /readyz: 200 once the model is loaded and warmed up
  GET  /metrics   Prometheus text: requests by path and status, latency, images, batch sizes, queue depth

refusals: 401 no or wrong API key, 403 a path or URL the server does not read, 413 body over --max-upload-mb,
  image over --max-pixels or more than --max-images, 415 not an image, 422 corrupt image or bad option, 503 not
  ready, queue full (--max-queue) or the model failed that batch (the service goes on). Uploads are decoded
  in memory: a request writes nothing to disk.

security: loopback only unless --host says otherwise; with --api-key (or ${defaults.API_KEY_ENV}, which other
  users cannot read from the process list) /v1 and /metrics need `Authorization: Bearer KEY`; /healthz,
  /readyz and the API description stay open for load balancers.

exit status:
  0  the server ran and was stopped (Ctrl-C)
  1  the model could not be loaded, the server could not start (port in use), a package is missing
  2  usage error: MODEL not found, bad option value, --allow-paths not a folder

examples:
  python -m serve api -m runs/voc-an/export/model.onnx                   # http://127.0.0.1:8000/docs
  curl -F file=@cat.jpg 'http://127.0.0.1:8000/v1/tag?select=top-k:5'
  {defaults.API_KEY_ENV}=secret python -m serve api -m model.onnx --host 0.0.0.0 --allow-paths /data/photos
  python -m serve api -m model.onnx --engine ray --address auto --replicas 2 --max-replicas 8 --gpus-per-replica 1
"""


def add_api_parser(sub: argparse._SubParsersAction) -> None:
    """The ``api`` subcommand's options."""
    api = sub.add_parser(
        "api", help="serve a model over HTTP: JSON scores and tags per image, batching, health, metrics",
        description="Serve MODEL as an HTTP service: each image's class scores and tags (the selection and caption "
        "rules of `serve tag`), dynamic batching, health and readiness, Prometheus metrics, an OpenAPI "
        "description. One process (uvicorn) or Ray Serve replicas (--engine ray).",
        epilog=API_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    api.add_argument("--model", "-m", type=Path, required=True, metavar="MODEL",
                     help="exported .onnx, training checkpoint .pt, or another registered runtime's file, e.g. "
                     "-m runs/voc-an/export/model.onnx")
    api.add_argument("--backend", metavar="NAME", help=BACKEND_HELP)
    api.add_argument("--device", metavar="DEV", help=DEVICE_HELP)
    net = api.add_argument_group("server")
    net.add_argument("--host", default=defaults.DEFAULT_HOST,
                     help="address to listen on; --host 0.0.0.0 for every interface (default: %(default)s)")
    net.add_argument("--port", type=int, default=defaults.DEFAULT_PORT, help="port (default: %(default)s)")
    net.add_argument("--api-key", metavar="KEY", help=f"requests to /v1 and /metrics need 'Authorization: Bearer "
                     f"KEY' (default: ${defaults.API_KEY_ENV} when set, else no key)")
    net.add_argument("--engine", choices=API_ENGINES.names(), default="local",
                     help=f"{API_ENGINES.cli_help()} (default: %(default)s)")
    limits = api.add_argument_group("inputs and limits")
    limits.add_argument("--allow-paths", type=Path, action="append", default=[], metavar="DIR",
                        help='also take JSON {"paths": [...]}: files inside DIR (repeatable; links resolved first)')
    limits.add_argument("--allow-urls", action="store_true",
                        help='also take JSON {"urls": [...]}: http(s) images the server fetches (only on networks '
                        "where the server may reach what clients name)")
    limits.add_argument("--max-images", type=int, default=defaults.DEFAULT_MAX_IMAGES, metavar="N",
                        help="images per request (default: %(default)s)")
    limits.add_argument("--max-upload-mb", type=float, default=defaults.DEFAULT_MAX_UPLOAD_MB, metavar="MB",
                        help="largest request body, and largest fetched URL (default: %(default)s)")
    add_max_pixels(limits)
    batching = api.add_argument_group("batching and threads")
    batching.add_argument("--max-batch", type=int, default=defaults.DEFAULT_MAX_BATCH, metavar="N",
                          help="images per model call at most (default: %(default)s; on a CPU larger batches were "
                          "no faster, a GPU wants more, e.g. --max-batch 64)")
    batching.add_argument("--max-wait-ms", type=float, default=defaults.DEFAULT_MAX_WAIT_MS, metavar="MS",
                          help="how long a batch waits for more images after its first (default: %(default)s)")
    batching.add_argument("--max-queue", type=int, default=defaults.DEFAULT_MAX_QUEUE, metavar="N",
                          help="images (ray: requests per replica) waiting at most; more get 503 (default: "
                          "%(default)s)")
    batching.add_argument("--decode-threads", type=int, metavar="N",
                          help="local engine: image decoding threads (default: one per CPU, at most 8)")
    batching.add_argument("--threads", type=int, metavar="N",
                          help="the model's CPU threads (default: the runtime's choice; ray: the replica's CPUs)")
    add_selection_options(api.add_argument_group("tag selection: the defaults, a request may override them"))
    add_caption_options(api.add_argument_group("caption rules: a request's are added to these"))
    ray = api.add_argument_group("ray engine")
    ray.add_argument("--address", metavar="ADDR", help="Ray cluster address, e.g. auto (default: a local instance)")
    ray.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas (default: %(default)s)")
    ray.add_argument("--max-replicas", type=int, metavar="N",
                     help="autoscale between --replicas and N replicas with the load (default: no autoscaling)")
    ray.add_argument("--cpus-per-replica", type=int, metavar="N",
                     help="CPUs per replica (default: the cluster's CPUs over the replicas)")
    ray.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="F",
                     help="GPUs per replica, fractions allowed (default: %(default)s)")


def _settings(args: argparse.Namespace) -> tuple[object, dict[str, object]]:
    """The :class:`~serve.api.service.ApiSettings` and the ray engine's options of ``args`` (``UsageError``)."""
    from serve.api.service import ApiSettings
    from serve.outputs.selection_modes import Selection
    from serve.outputs.thresholds import read_thresholds_file
    from serve.tagging.job import TagChoice

    ray_only = [f"--{n.replace('_', '-')}" for n in ("address", "max_replicas", "cpus_per_replica",
                                                     "gpus_per_replica") if getattr(args, n)]
    if args.engine != "ray" and (ray_only or args.replicas != 1):
        raise UsageError(f"{', '.join(ray_only) or '--replicas'} need(s) --engine ray")
    if not args.model.is_file():
        raise UsageError(f"model not found: {args.model}")
    for folder in args.allow_paths:
        if not folder.is_dir():
            raise UsageError(f"--allow-paths {folder}: not a folder")
    if args.max_pixels < 0 or not 0 < args.port < 65536 or args.replicas < 1:
        raise UsageError("--max-pixels must be >= 0, --port in 1..65535, --replicas >= 1")
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise UsageError("--max-replicas must be >= --replicas")
    try:
        max_tags = args.max_tags if args.max_tags is not None else args.top_k  # --top-k: the old name
        mode = Selection(*args.select, max_tags, args.min_score or 0.0)
        per_class = read_thresholds_file(args.thresholds) if args.thresholds is not None else None
        choice = TagChoice(args.threshold, per_class, mode, caption_rules_of(args))
        settings = ApiSettings(
            str(args.model), args.backend, args.device, args.threads, choice, max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms, max_queue=args.max_queue, max_images=args.max_images,
            max_upload_bytes=int(args.max_upload_mb * 1024 * 1024), max_pixels=args.max_pixels or None,
            allow_paths=tuple(args.allow_paths), allow_urls=args.allow_urls,
            api_key=args.api_key or os.environ.get(defaults.API_KEY_ENV) or None,
            **({"decode_threads": args.decode_threads} if args.decode_threads is not None else {}))
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    cluster = {"address": args.address, "replicas": args.replicas, "max_replicas": args.max_replicas,
               "cpus_per_replica": args.cpus_per_replica, "gpus_per_replica": args.gpus_per_replica}
    return settings, cluster if args.engine == "ray" else {}


def _serve(args: argparse.Namespace) -> None:
    """Check the options, then run the engine until Ctrl-C (the exceptions of :func:`run_command`)."""
    settings, cluster = _settings(args)
    needs = ["fastapi", "uvicorn", "python_multipart", "prometheus_client", *(["ray.serve"] * (args.engine == "ray"))]
    for module in needs:
        try:
            __import__(module)
        except ImportError as exc:
            raise CommandFailed(f"the service needs {module} ({exc}): pip install \"spml[service]\" "
                                "(and \"spml[ray]\" for --engine ray)") from None
    from models.runtimes import BackendUnavailableError, ModelLoadError, ModelSpecError

    try:
        API_ENGINES[args.engine](settings, args.host, args.port, cluster)
    except ModelSpecError as exc:
        raise UsageError(str(exc)) from None
    except (ModelLoadError, BackendUnavailableError) as exc:
        raise CommandFailed(f"cannot load model: {exc}") from None
    except (OSError, RuntimeError) as exc:
        raise CommandFailed(f"cannot serve: {exc}") from None
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)


def run_api(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``api`` with parsed arguments: serve until Ctrl-C; returns the exit status."""
    return run_command(f"{parser.prog} api", lambda: _serve(args))
