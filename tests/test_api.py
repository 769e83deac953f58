"""The HTTP service (``python -m serve api``), served once by uvicorn on a loopback port: answers equal ``serve tag``'s
records and the Predictor's scores, batching batches, bad input gets a 4xx naming the reason, a failed model call
fails its own batch only, the API key, health, readiness, metrics and the OpenAPI description, and no request writes
a file."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
import json
import socket
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from export import export_onnx
from models import ModelMeta, build_model, save_checkpoint
from serve.__main__ import main
from serve.predictor import Predictor

pytest.importorskip("prometheus_client")
uvicorn = pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from serve.api.app import build_app  # noqa: E402
from serve.api.service import ApiSettings, TaggingService  # noqa: E402

CLASSES = ["cat", "dog", "long_car"]
MAX_PIXELS = 200 * 200
MAX_UPLOAD = 2 * 1024 * 1024


def write_pictures(folder: Path) -> list[Path]:
    """Pictures in a few formats and modes (JPEG, PNG with alpha, grey PNG, palette GIF, a larger JPEG)."""
    rng = np.random.default_rng(5)
    folder.mkdir(parents=True)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(folder / "rgb.jpg", quality=90)
    Image.fromarray(np.dstack([rgb, rng.integers(0, 256, (37, 53), dtype=np.uint8)]), "RGBA").save(folder / "a.png")
    Image.fromarray(rng.integers(0, 256, (31, 31), dtype=np.uint8), "L").save(folder / "grey.png")
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.gif")
    Image.fromarray(rng.integers(0, 256, (150, 190, 3), dtype=np.uint8)).save(folder / "big.jpg", quality=85)
    return sorted(folder.iterdir())


@dataclasses.dataclass
class Running:
    """The served app: its base ``url``, the ``service`` behind it and the files of the tests."""

    url: str
    service: TaggingService
    onnx: Path
    pictures: list[Path]
    root: Path

    def post(self, *, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
             **kw: Any) -> httpx.Response:
        return httpx.post(self.url + "/v1/tag", params=params, headers=headers, timeout=30, **kw)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of ``GET /metrics``."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return 0.0

    @contextlib.contextmanager
    def settings(self, **changes: Any) -> Iterator[None]:
        """The service's settings changed for the duration (they are read per request)."""
        old = self.service.settings
        self.service.settings = dataclasses.replace(old, **changes)
        try:
            yield
        finally:
            self.service.settings = old


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A random resnet18 (32 px, per-class thresholds) exported to ONNX and served by uvicorn in a thread, with small
    limits, paths allowed under ``allowed/`` and URLs allowed."""
    root = tmp_path_factory.mktemp("api")
    threads = torch.get_num_threads()  # the service sets torch to one thread for the process: restored at the end
    torch.manual_seed(3)
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=32, thresholds=[0.4, 0.5, 0.6])
    save_checkpoint(root / "best.pt", build_model("resnet18", len(CLASSES)).state_dict(), meta)
    pictures = write_pictures(root / "allowed" / "pics")
    onnx = export_onnx(root / "best.pt", images=root / "allowed" / "pics").onnx_path
    (root / "outside.png").write_bytes(pictures[1].read_bytes())
    (root / "allowed" / "escape.png").symlink_to(root / "outside.png")
    settings = ApiSettings(str(onnx), max_batch=8, max_wait_ms=2, max_images=6, max_upload_bytes=MAX_UPLOAD,
                           max_pixels=MAX_PIXELS, decode_threads=2, allow_paths=(root / "allowed",), allow_urls=True)
    service = TaggingService.load(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(service), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the app did not start"
    yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", service, onnx, pictures, root)
    server.should_exit = True
    thread.join(20)
    torch.set_num_threads(threads)


def uploads(paths: list[Path]) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (p.name, p.read_bytes())) for p in paths]


def test_answers_equal_the_tag_commands_records_and_the_predictors(api: Running, tmp_path: Path) -> None:
    options = ["--select", "top-k:2", "--first", "sks", "--spaces", "--exclude", "cat"]
    out = tmp_path / "tags.jsonl"
    assert main(["tag", str(api.root / "allowed" / "pics"), "-m", str(api.onnx), "-o", str(out), "--no-progress",
                 "--no-summary", *options]) == 0
    tagged = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    params = {"select": "top-k:2", "first": "sks", "spaces": "true", "exclude": "cat"}
    answer = api.post(files=uploads(api.pictures), params=params)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["name"] for r in results] == [p.name for p in api.pictures]
    for result in results:
        want = tagged[result["name"]]
        assert result["tags"] == want["tags"] and result["tags"][0] == "sks"
        assert max(abs(result["scores"][c] - want["scores"][c]) for c in CLASSES) <= 1e-6
    predictor = Predictor.load(api.onnx)
    for path in api.pictures[:2]:  # the defaults: the model's calibrated thresholds; a raw body and a path
        expected = predictor.predict(path)
        raw = api.post(content=path.read_bytes(), headers={"Content-Type": "image/png"}).json()["results"][0]
        by_path = api.post(json={"paths": [f"pics/{path.name}"]}).json()["results"][0]
        for got in (raw, by_path):
            assert got["tags"] == expected.tags
            assert max(abs(got["scores"][c] - expected.scores[c]) for c in CLASSES) <= 1e-6
    assert by_path["name"] == f"pics/{api.pictures[1].name}"


def test_urls_are_fetched_in_memory(api: Running) -> None:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(api.root / "allowed" / "pics"))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    files = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{files.server_address[1]}"
    try:
        answer = api.post(json={"urls": [f"{base}/rgb.jpg"]})
        assert answer.status_code == 200 and answer.json()["results"][0]["name"] == f"{base}/rgb.jpg"
        assert api.post(json={"urls": [f"{base}/missing.jpg"]}).status_code == 422
        assert api.post(json={"urls": ["file:///etc/passwd"]}).status_code == 422
        with api.settings(allow_urls=False):
            refused = api.post(json={"urls": [f"{base}/rgb.jpg"]})
        assert refused.status_code == 403 and "--allow-urls" in refused.json()["detail"]
    finally:
        files.shutdown()


def padded_png(size: int) -> bytes:
    """A small valid PNG followed by zeros up to ``size`` bytes (Pillow ignores what follows the image)."""
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue() + bytes(size - len(buf.getvalue()))


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"files": [("files", ("broken.jpg", b"\xff\xd8\xff\xe0 not really a jpeg"))]}, 422, "broken.jpg: truncated"),
    ({"files": [("files", ("notes.png", b"just some text\n"))]}, 415, "not an image"),
    ({"content": b"", "headers": {"Content-Type": "image/png"}}, 422, "no image"),
    ({"json": {"paths": "a.png"}}, 422, "lists of strings"),
    ({"json": {"paths": ["../outside.png"]}}, 403, "outside the folders"),
    ({"json": {"paths": ["escape.png"]}}, 403, "outside the folders"),
    ({"json": {"paths": ["/etc/passwd"]}}, 403, "outside the folders"),
    ({"json": {"paths": ["pics/none.png"]}}, 404, "no such file"),
    ({"json": {"paths": ["pics"] * 7}}, 413, "at most 6"),
    ({"content": b"x" * 100, "headers": {"Content-Type": "multipart/form-data"}}, 400, "multipart"),
])
def test_bad_input_gets_a_4xx_with_the_reason(api: Running, body: dict[str, Any], status: int, reason: str) -> None:
    answer = api.post(**body)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["detail"]


def test_limits_truncated_and_huge_images(api: Running) -> None:
    jpeg = api.pictures[1].read_bytes()
    cut = api.post(files=[("f", ("cut.jpg", jpeg[: len(jpeg) // 2]))])
    assert cut.status_code == 422 and "truncated" in cut.json()["detail"]
    buf = io.BytesIO()
    Image.new("RGB", (300, 300)).save(buf, "PNG")  # 90,000 px > MAX_PIXELS, a few hundred bytes
    bomb = api.post(files=[("f", ("bomb.png", buf.getvalue()))])
    assert bomb.status_code == 413 and "decompression bomb" in bomb.json()["detail"]
    for kw in ({"files": [("f", ("big.png", padded_png(MAX_UPLOAD + 1000)))]},
               {"content": padded_png(MAX_UPLOAD + 1000), "headers": {"Content-Type": "image/png"}}):
        answer = api.post(**kw)
        assert answer.status_code == 413 and "limit" in answer.json()["detail"]
    assert api.post(files=uploads(api.pictures[:1] * 7)).status_code == 413
    bad_option = api.post(files=uploads(api.pictures[:1]), params={"exclude": "unicorn"})
    assert bad_option.status_code == 422 and "unicorn" in bad_option.json()["detail"]
    assert api.post(files=uploads(api.pictures[:1]), params={"select": "top-k:0"}).status_code == 422
    assert httpx.get(api.url + "/healthz").status_code == 200  # none of it hurt the service


def test_no_request_writes_a_file(api: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.formparsers import MultiPartParser

    big = padded_png(MAX_UPLOAD - 4096)
    assert len(big) > MultiPartParser.spool_max_size  # Starlette's default would spool this upload to a file
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made = []  # Linux's TemporaryFile has no name (O_TMPFILE): count the calls, not only the folder's files
    for name in ("TemporaryFile", "NamedTemporaryFile", "mkstemp"):
        real = getattr(tempfile, name)
        monkeypatch.setattr(tempfile, name, functools.partial(lambda real, *a, **k: made.append(1) or real(*a, **k),
                                                              real))
    before = set(api.root.rglob("*"))
    assert api.post(files=[("f", ("big.png", big))]).status_code == 200
    assert api.post(content=big, headers={"Content-Type": "image/png"}).status_code == 200
    assert api.post(files=[("f", ("bad.png", big[100:]))]).status_code == 415
    assert made == [] and list(scratch.iterdir()) == [] and set(api.root.rglob("*")) == before


def test_batching_gathers_concurrent_requests(api: Running) -> None:
    calls, batches = api.service.predictor.model_calls, api.metric("spml_api_batch_size_count")
    picture = api.pictures[0].read_bytes()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            answers = await asyncio.gather(*(
                client.post(api.url + "/v1/tag", content=picture, headers={"Content-Type": "image/jpeg"})
                for _ in range(8)))
        return [a.status_code for a in answers]

    api.service.batcher.max_wait_s = 0.2
    try:
        assert asyncio.run(burst()) == [200] * 8
    finally:
        api.service.batcher.max_wait_s = api.service.settings.max_wait_ms / 1000
    new_batches = api.metric("spml_api_batch_size_count") - batches
    assert api.service.predictor.model_calls - calls == new_batches < 8
    assert api.metric("spml_api_images_total", outcome="tagged") >= 8


def test_a_failing_model_call_fails_its_batch_only(api: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    real = api.service.predictor.scores_from_inputs
    failures = []

    def fail_once(batch: np.ndarray) -> np.ndarray:
        if not failures:
            failures.append(len(batch))
            raise RuntimeError("out of device memory")
        return real(batch)

    monkeypatch.setattr(api.service.predictor, "scores_from_inputs", fail_once)
    errors = api.metric("spml_api_model_errors_total")
    failed = api.post(files=uploads(api.pictures[:1]))
    assert failed.status_code == 503 and "out of device memory" in failed.json()["detail"]
    assert failed.headers["retry-after"] == "1"
    assert api.post(files=uploads(api.pictures[:2])).status_code == 200
    assert api.metric("spml_api_model_errors_total") == errors + 1
    assert httpx.get(api.url + "/readyz").status_code == 200


def test_api_key_health_readiness_metrics_and_openapi(api: Running) -> None:
    with api.settings(api_key="s3cret"):
        assert api.post(files=uploads(api.pictures[:1])).status_code == 401
        wrong = api.post(files=uploads(api.pictures[:1]), headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["detail"]
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert httpx.get(api.url + "/metrics").status_code == 401
        assert httpx.get(api.url + "/v1/model").status_code == 401
        good = api.post(files=uploads(api.pictures[:1]), headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 200
        for open_path in ("/healthz", "/readyz", "/openapi.json"):
            assert httpx.get(api.url + open_path).status_code == 200
    model = httpx.get(api.url + "/v1/model").json()
    assert model["classes"] == CLASSES and model["model"]["arch"] == "resnet18"
    assert model["defaults"]["thresholds"] == {"cat": 0.4, "dog": 0.5, "long_car": 0.6}
    assert httpx.get(api.url + "/readyz").json() == {"status": "ready"}
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(api.url + "/metrics").text)}
    assert {"spml_api_requests", "spml_api_request_seconds", "spml_api_images", "spml_api_batch_size",
            "spml_api_model_seconds", "spml_api_queue_depth", "spml_api_ready"} <= set(families)
    statuses = {(s.labels["path"], s.labels["status"]) for s in families["spml_api_requests"].samples
                if s.name == "spml_api_requests_total"}
    assert ("/v1/tag", "200") in statuses and ("/v1/tag", "401") in statuses
    spec = httpx.get(api.url + "/openapi.json").json()
    assert {"/v1/tag", "/v1/model", "/healthz", "/readyz", "/metrics"} <= set(spec["paths"])
    body = spec["paths"]["/v1/tag"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "image/*", "application/json"} <= set(body)


def test_command_line_usage_errors(api: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(api.onnx)
    for argv, message in (
        (["-m", str(tmp_path / "none.onnx")], "model not found"),
        (["-m", model, "--allow-paths", str(tmp_path / "none")], "not a folder"),
        (["-m", model, "--replicas", "2"], "need(s) --engine ray"),
        (["-m", model, "--max-batch", "0"], "--max-batch must be >= 1"),
        (["-m", model, "--exclude-re", "("], "invalid regular expression"),
    ):
        assert main(["api", *argv]) == 2, argv
        assert message in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["api", "-m", model, "--port", str(taken.getsockname()[1])]) == 1
    assert "cannot serve" in capsys.readouterr().err


def test_a_ray_replica_serves_the_app_with_rays_batching_without_a_cluster(
        api: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``ray`` engine's replica class, built in this process: its app answers as the local one, its images
    batched by Ray's ``@serve.batch`` with the service's batch size and wait (the replica context Ray's batching
    reads is the one thing faked). The deployment on a Ray instance: tests/test_tag_ray.py."""
    ray_serve = pytest.importorskip("ray.serve")
    from fastapi.testclient import TestClient

    from serve.api.ray_serve import TaggerReplica

    context = types.SimpleNamespace(_deployment_config=types.SimpleNamespace(max_ongoing_requests=16))
    monkeypatch.setattr(ray_serve, "get_replica_context", lambda: context)
    replica_class = TaggerReplica.func_or_class.__mro__[1]  # the class under Ray's ingress wrapper
    replica = replica_class(dataclasses.replace(api.service.settings, max_batch=4, max_wait_ms=200))
    assert (replica.score._get_max_batch_size(), replica.score._get_batch_wait_timeout_s()) == (4, 0.2)
    picture = api.pictures[0]
    with TestClient(replica.__serve_build_asgi_app__()) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.post("/v1/tag", content=picture.read_bytes()), range(8)))
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    local = api.post(content=picture.read_bytes()).json()
    assert [a.json() for a in answers] == [local] * 8
    sizes = {s.name: s.value for s in families["spml_api_batch_size"].samples}
    assert sizes["spml_api_batch_size_sum"] == 9 and sizes["spml_api_batch_size_count"] <= 5  # 8 and the warm-up
    assert replica.service.predictor.model_calls == sizes["spml_api_batch_size_count"]


def test_load_benchmark_writes_its_section(api: Running, tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    from bench import api_speed
    from bench.results_page import read_section

    page = tmp_path / "page.md"
    threads = torch.get_num_threads()
    try:
        api_speed.main([str(api.onnx), "--engines", "local", "--clients", "1,3", "--requests", "4,6", "--images", "3",
                        "--size", "40", "--max-batch", "2", "--seconds", "0.05", "--page", str(page)])
    finally:
        torch.set_num_threads(threads)
    text = read_section("api-cpu", page)
    assert text is not None and "Command: `python -m bench.api_speed" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| local |")]
    assert [(r[1], r[2], r[-1]) for r in rows] == [("1", "4", "0 |"), ("3", "6", "0 |")]
    assert "shared-core bound" in text
    assert "- local: 3 clients at" in text and "p99 / p50 at 1 client" in text
