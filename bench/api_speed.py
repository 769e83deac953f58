"""The HTTP service under load: ``python -m bench.api_speed MODEL [--engines local,ray:1,ray:2,ray:2:haproxy]
[--clients 1,8,32] [--requests 150,400,800]``.

Writes ``--images`` JPEGs of ``--size`` px (:func:`bench.tag_speed.make_jpegs`) and measures the model-only rate of
MODEL in this process: the runtime on preloaded batches of up to ``--max-batch`` images (four sizes), loaded as the
service loads it and as ``Predictor.load`` does (they differ for ONNX Runtime on a CPU: the service's threads sleep
between batches instead of spinning), the best of them the reference. Then, for each engine, starts ``python -m
serve api`` on a free loopback port (its own process; ``ray:N``: Ray Serve with N replicas on a local instance, the
machine's CPUs split between them; ``ray:N:haproxy``: through Ray Serve's HAProxy ingress), waits for ``/readyz``,
and runs a bounded client against it: C concurrent clients (aiohttp, one connection each, keep-alive), each sending
single-image requests (``POST /v1/tag``, the JPEG as the raw body) one after the other, until the level's fixed
number of requests is done, after a warm-up of 2 C requests. Per level: p50 / p99 latency per request, throughput
(requests over the level's wall time), its share of the best model-only rate and the requests not answered 200. The
client runs on the same machine, so its CPU time counts against the service, as it would for a client on the same
host. The model-only rates (and decoding alone) are measured before each engine and after the last, since the
machine's load drifts: each engine is compared with the lower best beside it. Section ``api-cpu`` of the results
page.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import torch

from bench.results_page import add_page_options, command_line, load_text, machine_line, publish
from bench.tag_speed import make_jpegs, model_only
from serve import ApiSettings, Predictor, TaggingService

#: Targets of the service (issue 63): share of the model-only rate at 32 clients; p99 / p50 at one client; ray with
#: two replicas against one local process (throughput at the most clients).
TARGET_SHARE, TARGET_TAIL, TARGET_RAY = 0.70, 2.0, 0.80
#: ``ray:N:haproxy``: Ray Serve's HAProxy ingress straight to the replicas, in place of its Python proxies (feature
#: flags of Ray 2.60, set for the local instance the service starts; docs/deploy.md).
HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(model: Path, engine: str, max_batch: int, log: Path,
                 backend: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m serve api`` for ``engine`` (``local`` or ``ray:N``) on a free port, once ``/readyz`` says ready
    (``RuntimeError`` with the log's end if it exits or takes over 5 minutes)."""
    port = free_port()
    args = [sys.executable, "-m", "serve", "api", "-m", str(model), "--port", str(port), "--max-batch", str(max_batch)]
    args += ["--backend", backend] if backend else []
    kind, _, rest = engine.partition(":")
    replicas, _, ingress = rest.partition(":")
    if kind == "ray":
        args += ["--engine", "ray", "--replicas", replicas or "1"]
    env = {**os.environ, **(HAPROXY if ingress == "haproxy" else {})}
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"serve api ({engine}) did not get ready:\n{log.read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (both engines stop cleanly on it), then SIGKILL for the whole session after 60 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def load(url: str, bodies: list[bytes], clients: int, requests: int) -> tuple[list[float], float, int]:
    """``requests`` single-image requests from ``clients`` concurrent clients: (latencies of the 200 answers in
    seconds, wall seconds, requests not answered 200). aiohttp, whose CPU time per request is a fraction of
    httpx's (bench/README.md, the section's notes): the client shares the service's cores."""
    import aiohttp

    latencies: list[float] = []
    failed = sent = 0

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal sent, failed
        while sent < requests:
            body = bodies[sent % len(bodies)]
            sent += 1
            start = time.perf_counter()
            try:
                async with http.post(url + "/v1/tag", data=body, headers={"Content-Type": "image/jpeg"}) as answer:
                    await answer.read()
                    ok = answer.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failed += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return latencies, time.perf_counter() - start, failed


def measure(url: str, bodies: list[bytes], levels: list[tuple[int, int]]) -> list[dict[str, float]]:
    """Each level ``(clients, requests)`` after a warm-up of 2 x clients requests: p50, p99 (ms), img/s, errors."""
    rows = []
    for clients, requests in levels:
        asyncio.run(load(url, bodies, clients, 2 * clients))
        latencies, wall, failed = asyncio.run(load(url, bodies, clients, requests))
        ms = np.array(latencies) * 1000 if latencies else np.array([np.nan])
        rows.append({"clients": clients, "requests": requests, "p50": float(np.percentile(ms, 50)),
                     "p99": float(np.percentile(ms, 99)), "rate": len(latencies) / wall, "failed": failed})
        print(f"  {clients} clients: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def decode_only(predictor: Predictor, bodies: list[bytes], workers: int, seconds: float) -> float:
    """Images/s of the service's decoding alone: ``workers`` threads (the service's default) preprocessing the
    request bodies, torch on one thread as in the service (no model, no HTTP)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            done, start = 0, time.perf_counter()
            while done == 0 or time.perf_counter() - start < seconds:
                done += len(list(pool.map(predictor.preprocess, bodies)))
            return done / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.api_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="an exported model (.onnx) or a checkpoint")
    parser.add_argument("--engines", default="local,ray:1,ray:2,ray:2:haproxy",
                        help="local, ray:N and ray:N:haproxy (default: %(default)s)")
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients per level (default: %(default)s)")
    parser.add_argument("--requests", default="150,400,800", help="requests per level (default: %(default)s)")
    parser.add_argument("--images", type=int, default=64, help="distinct JPEGs sent in turn (default: %(default)s)")
    parser.add_argument("--size", type=int, default=448, help="JPEG side in px (default: %(default)s)")
    parser.add_argument("--max-batch", type=int, default=8, help="the service's --max-batch (default: %(default)s)")
    parser.add_argument("--backend", help="the service's --backend (default: the model file's own choice)")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="model-only timing per batch size and loading (default: %(default)s)")
    add_page_options(parser, "api-cpu")
    args = parser.parse_args(argv)
    args.levels = list(zip(map(int, args.clients.split(",")), map(int, args.requests.split(",")), strict=True))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="api-speed-") as folder:
        run(args, argv, Path(folder))


def run(args: argparse.Namespace, argv: list[str] | None, tmp: Path) -> None:
    """Write the JPEGs under ``tmp``, measure, publish the section."""
    paths = make_jpegs(tmp / "images", args.images, args.size)
    bodies = [p.read_bytes() for p in paths]
    threads = torch.get_num_threads()
    settings = ApiSettings(str(args.model), backend=args.backend)
    loads = {"service": TaggingService.load(settings).predictor,
             "Predictor.load": Predictor.load(args.model, backend=args.backend)}
    torch.set_num_threads(threads)  # the service sets torch to one thread (it only resizes images with it)
    sizes = sorted({*(b for b in (1, 2, 4, 8, 16, 32, 64) if b < args.max_batch), args.max_batch})[-4:]

    def model_rates() -> dict[tuple[str, int], float]:
        rates = {(name, b): model_only(p, paths, b, args.seconds) for name, p in loads.items() for b in sizes}
        rates[("decoding", settings.decode_threads)] = decode_only(loads["service"], bodies,
                                                                   settings.decode_threads, args.seconds)
        print("model only:", {f"{k[0]} {k[1]}": round(v, 1) for k, v in rates.items()}, file=sys.stderr, flush=True)
        return rates

    rounds = [model_rates()]  # before each engine and after the last: each engine's reference is beside it
    results: dict[str, list[dict[str, float]]] = {}
    load_start = load_text()
    for engine in args.engines.split(","):
        print(f"engine {engine}", file=sys.stderr, flush=True)
        proc, url = start_server(args.model, engine, args.max_batch, tmp / f"{engine.replace(':', '-')}.log",
                                 args.backend)
        try:
            results[engine] = measure(url, bodies, args.levels)
        finally:
            stop_server(proc)
        rounds.append(model_rates())
    publish(args.section or "api-cpu", report(args, argv, loads["service"], rounds, results, load_start), args.page)


def report(args: argparse.Namespace, argv: list[str] | None, predictor: Predictor,
           rounds: list[dict[tuple[str, int], float]], results: dict[str, list[dict[str, float]]],
           load_start: str) -> str:
    """The section's markdown: the model-only rates, the table and each target, met or not. Engine ``i`` is
    measured against rounds ``i`` and ``i + 1`` of model-only rates (before and after it): the lower best of the
    two, and the lower shared-core bound."""
    workers = next(b for n, b in rounds[0] if n == "decoding")
    decoding = [rates[("decoding", workers)] for rates in rounds]
    bests = [max(v for k, v in rates.items() if k[0] != "decoding") for rates in rounds]
    bounds = [1 / (1 / best + 1 / d) for best, d in zip(bests, decoding, strict=True)]
    reference = {e: min(bests[i:i + 2]) for i, e in enumerate(results)}
    bound = {e: min(bounds[i:i + 2]) for i, e in enumerate(results)}
    first = rounds[0]
    by_size = "; ".join(f"{name}: " + ", ".join(f"{b}: {first[(name, b)]:.1f}" for (n, b) in first if n == name)
                        for name in dict.fromkeys(n for n, _ in first if n != "decoding"))
    runtime = f", {args.backend}" if args.backend else ""
    lines = [f"## HTTP service under load (CPU, loopback{runtime})", "",
             f"Command: `{command_line('bench.api_speed', argv)}`", "", machine_line(), f"At the start: {load_start}.",
             "", f"Model: `{args.model.name}`, {predictor.meta.arch} @{predictor.meta.image_size} px, "
             f"{len(predictor.classes)} classes (method {predictor.meta.method or '-'}, data "
             f"{(predictor.meta.data or {}).get('source', '-')}; {predictor.backend}). Model-only img/s by batch "
             f"size, before the first engine: {by_size} (batches of 1 to {args.max_batch}, as the service loads the "
             f"model and as `Predictor.load` does); the best of them, before each engine and after the last: "
             f"{', '.join(f'{b:.1f}' for b in bests)}. Decoding alone (the service's {workers} decoding threads "
             f"preprocessing the request bodies, no model): {', '.join(f'{d:.0f}' for d in decoding)} img/s. "
             "Each engine's share is of the lower best beside it (before and after it, the load of the machine "
             "drifts); shared-core bound = 1 / (1 / model-only + 1 / decoding), the rate when decoding and the model "
             "take turns on the same cores (HTTP and the client left out), the lower beside it. Requests: one "
             f"{args.size} px JPEG each (the raw body, {args.images} distinct files in turn), from C concurrent "
             f"clients on the same machine, each waiting for its answer; `serve api --max-batch {args.max_batch}` with "
             "its other defaults; `ray:N` = `--engine ray --replicas N` on a local Ray instance (the CPUs split "
             "between the replicas), through Ray Serve's proxy; `ray:N:haproxy`: the same through Ray Serve's HAProxy "
             "ingress straight to the replicas (" + \
             ", ".join(f"`{k}=1`" for k in HAPROXY) + "). Throughput = answered requests / the level's wall time.", "",
             "| engine | clients | requests | p50 ms | p99 ms | p99 / p50 | img/s | model-only img/s | of model-only "
             "| of the bound | not 200 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, rows in results.items():
        for r in rows:
            lines.append(f"| {engine} | {r['clients']} | {r['requests']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                         f"{r['p99'] / r['p50']:.2f} | {r['rate']:.1f} | {reference[engine]:.1f} | "
                         f"{r['rate'] / reference[engine]:.0%} | {r['rate'] / bound[engine]:.0%} | {r['failed']} |")
    lines += ["", "Targets:"]
    for engine, rows in results.items():
        most, one = rows[-1], rows[0]
        share, tail = most["rate"] / reference[engine], one["p99"] / one["p50"]
        lines.append(f"- {engine}: {most['clients']} clients at {share:.0%} of the model-only rate (target >= "
                     f"{TARGET_SHARE:.0%}: {'met' if share >= TARGET_SHARE else 'missed'}); p99 / p50 at "
                     f"{one['clients']} client {tail:.2f} (target < {TARGET_TAIL:g}: "
                     f"{'met' if tail < TARGET_TAIL else 'missed'})")
    for engine in (e for e in results if e.startswith("ray:2") and "local" in results):
        raw = results[engine][-1]["rate"] / results["local"][-1]["rate"]
        ratio = raw * reference["local"] / reference[engine]  # each against the model-only rate beside it
        lines.append(f"- {engine} against local at {results['local'][-1]['clients']} clients: {ratio:.2f}x of its "
                     f"share of the model-only rate, {raw:.2f}x in img/s (target >= {TARGET_RAY:.2f}x: "
                     f"{'met' if ratio >= TARGET_RAY else 'missed'})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
