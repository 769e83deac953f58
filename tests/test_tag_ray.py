"""Tagging engines and sources: the Ray engine against the local one (one shared local Ray instance, which
subprocess drivers join by address), WebDataset shards, list files, --shard partitions, resuming after a killed
driver or a killed actor, the light Ray driver (no torch, no onnxruntime, no error lines), and the local engine
not importing Ray; and on the same instance, the HTTP service's Ray Serve replicas (``serve api --engine ray``)."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tag_slowly import run_until_journaled

from export import export_onnx
from models import ModelMeta, build_model, save_checkpoint
from serve.__main__ import main

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "car"]
GOOD = ["rgb.jpg", "alpha.png", "palette.gif", "cmyk.jpg", "deep16.png", "grey.png", "sub/big.JPG", "sub/small.webp"]
BAD = ["corrupt.jpg", "truncated.jpg", "empty.png", "text.png"]


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[object]:
    """One local Ray instance (2 CPUs) for every Ray test; the CLI's ``main`` joins it in-process."""
    ray = pytest.importorskip("ray")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _jpeg_bytes(rng: np.random.Generator, size: tuple[int, int], mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode).save(buf, "JPEG")
    return buf.getvalue()


def write_mixed_folder(folder: Path) -> None:
    """Good images in odd formats (:data:`GOOD`), bad files (:data:`BAD`) and one ignored non-image file."""
    rng = np.random.default_rng(4)
    (folder / "sub").mkdir(parents=True)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    (folder / "rgb.jpg").write_bytes(_jpeg_bytes(rng, (53, 37)))
    rgba = np.dstack([rgb, rng.integers(0, 256, (37, 53), dtype=np.uint8)])
    Image.fromarray(rgba, "RGBA").save(folder / "alpha.png")
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.gif")
    (folder / "cmyk.jpg").write_bytes(_jpeg_bytes(rng, (40, 30), "CMYK"))
    Image.fromarray(rng.integers(0, 65535, (33, 29), dtype=np.uint16)).save(folder / "deep16.png")
    Image.fromarray(rng.integers(0, 256, (31, 31), dtype=np.uint8), "L").save(folder / "grey.png")
    (folder / "sub/big.JPG").write_bytes(_jpeg_bytes(rng, (300, 200)))
    Image.fromarray(rgb).save(folder / "sub/small.webp")
    (folder / "corrupt.jpg").write_bytes(rng.integers(0, 256, 500, dtype=np.uint8).tobytes())
    (folder / "truncated.jpg").write_bytes(_jpeg_bytes(rng, (120, 90))[:300])
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.png").write_text("not an image\n")
    (folder / "notes.txt").write_text("ignored\n")


def write_shards(folder: Path, images: Path) -> dict[str, str]:
    """Two WebDataset shards of the mixed folder's files (+ one sample without an image); returns
    {sample key in the outputs: file it came from}."""
    folder.mkdir()
    keys = {}
    files = sorted(p for p in images.rglob("*") if p.is_file() and p.suffix.lower() != ".txt")
    for s in range(2):
        with tarfile.open(folder / f"part-{s:03d}.tar", "w") as tar:
            for i, path in enumerate(files[s::2]):
                stem = f"s{s}i{i:02d}"
                ext = path.suffix.lower().lstrip(".")
                for name, data in ((f"{stem}.{ext}", path.read_bytes()), (f"{stem}.cls", b"0")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                keys[f"part-{s:03d}.tar/{stem}.{ext}"] = path.relative_to(images).as_posix()
            info = tarfile.TarInfo("nothing.txt")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    return keys


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | dict[str, str]]:
    """A tiny ONNX model (random resnet18, 32 px), the mixed folder and its shards."""
    root = tmp_path_factory.mktemp("engines")
    torch.manual_seed(3)
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=32, thresholds=[0.4, 0.5, 0.6])
    save_checkpoint(root / "best.pt", build_model("resnet18", len(CLASSES)).state_dict(), meta)
    write_mixed_folder(root / "pics")
    onnx = export_onnx(root / "best.pt", images=root / "pics").onnx_path
    keys = write_shards(root / "shards", root / "pics")
    return {"root": root, "onnx": onnx, "pics": root / "pics", "shards": root / "shards", "keys": keys}


def tag(*args: str | Path) -> int:
    """Run ``python -m serve tag`` in-process (so the Ray engine joins the shared instance)."""
    return main(["tag", *map(str, args), "--no-progress"])


def read_jsonl(path: Path) -> dict[str, dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    records = {r["path"]: r for r in lines}
    assert len(records) == len(lines), "an image appears twice"
    return records


def read_errors(path: Path) -> dict[str, str]:
    return dict(line.split("\t", 1) for line in path.read_text().splitlines())


def assert_same_scores(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        got = np.array([a[key]["scores"][c] for c in CLASSES])
        want = np.array([b[key]["scores"][c] for c in CLASSES])
        assert np.abs(got - want).max() <= 1e-5, key
        assert a[key]["tags"] == b[key]["tags"]


def driver_env() -> dict[str, str]:
    """Environment of a driver process: this checkout and tests/ importable."""
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def address(ray_instance: object) -> str:
    """The shared Ray instance's address, for drivers in other processes."""
    return ray_instance.get_runtime_context().gcs_address  # type: ignore[attr-defined]


def test_ray_light_driver_matches_local(setup: dict, ray_instance: object, tmp_path: Path) -> None:
    """A driver process joins the shared instance: it never imports torch or onnxruntime, prints no error line,
    and writes what the local engine writes."""
    assert tag(setup["pics"], "-m", setup["onnx"], "-o", tmp_path / "local.jsonl") == 1
    code = (
        "import sys; from serve.__main__ import main\n"
        f"code = main(['tag', {str(setup['pics'])!r}, '-m', {str(setup['onnx'])!r}, '-o', "
        f"{str(tmp_path / 'ray.jsonl')!r}, '--engine', 'ray', '--address', {address(ray_instance)!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'onnxruntime'))\n"
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=driver_env(), timeout=300)
    assert proc.returncode == 1, proc.stderr  # exit 1: the bad files
    assert "HEAVY []" in proc.stderr, proc.stderr
    assert "engine ray:" in proc.stderr and f"tagged {len(GOOD)} images" in proc.stderr
    assert not re.search(r"\bERROR\b|^\[[^]]* E \d+ \d+\]", proc.stderr, re.M), proc.stderr
    local, ray = read_jsonl(tmp_path / "local.jsonl"), read_jsonl(tmp_path / "ray.jsonl")
    assert sorted(local) == sorted(GOOD)
    assert list(ray) == sorted(ray), "the ray engine's run file is sorted by path too"
    assert_same_scores(ray, local)
    errors = read_errors(tmp_path / "ray.errors.tsv")
    assert sorted(errors) == sorted(BAD)
    assert errors["empty.png"] == "empty file (0 bytes)"
    assert errors == read_errors(tmp_path / "local.errors.tsv")
    assert not (tmp_path / "ray.jsonl.partial").exists()


def test_ray_shards_match_local_folder(
    setup: dict, ray_instance: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = str(setup["shards"] / "part-{000..001}.tar")
    assert tag(pattern, "-m", setup["onnx"], "-o", tmp_path / "ray.csv", "--engine", "ray", "--batch-size", "3") == 1
    assert tag(setup["shards"] / "*.tar", "-m", setup["onnx"], "-o", tmp_path / "local.jsonl") == 1
    assert tag(setup["pics"], "-m", setup["onnx"], "-o", tmp_path / "folder.jsonl") == 1
    folder = read_jsonl(tmp_path / "folder.jsonl")
    local = read_jsonl(tmp_path / "local.jsonl")
    by_file = {key: folder[name] for key, name in setup["keys"].items() if name in folder}
    assert_same_scores(local, {k: {**r, "path": k} for k, r in by_file.items()})
    lines = (tmp_path / "ray.csv").read_text().splitlines()
    assert lines[0] == "path,tags," + ",".join(CLASSES) and len(lines) == 1 + len(by_file)
    rows = {row.split(",")[0]: np.array(row.rsplit(",", 3)[1:], dtype=float) for row in lines[1:]}
    for key, rec in local.items():
        assert np.abs(rows[key] - np.array([rec["scores"][c] for c in CLASSES])).max() <= 1e-5
    errors = read_errors(tmp_path / "ray.errors.tsv")
    bad_keys = {k for k, name in setup["keys"].items() if name in BAD}
    assert set(errors) == bad_keys | {"part-000.tar/nothing", "part-001.tar/nothing"}
    assert errors == read_errors(tmp_path / "local.errors.tsv")
    # resume: samples already in the run file are skipped inside their shards, the rest are added once
    kept = (tmp_path / "local.jsonl").read_text().splitlines()[::2]
    (tmp_path / "resumed.jsonl").write_text("\n".join(kept) + "\n")
    capsys.readouterr()
    assert tag(pattern, "-m", setup["onnx"], "-o", tmp_path / "resumed.jsonl", "--engine", "ray") == 1
    assert f"tagged {len(local) - len(kept)} images" in capsys.readouterr().err
    assert_same_scores(read_jsonl(tmp_path / "resumed.jsonl"), local)


def test_ray_failing_batch_and_killed_actor(setup: dict, ray_instance: object, tmp_path: Path) -> None:
    """A model call that raises is retried in the actor; an actor killed (SIGKILL) mid-run is restarted and its
    work runs again: nothing lost, nothing doubled."""
    from serve.tagging import TagJob, plan_tagging, run_plan
    from serve.tagging.engines import ray as ray_engine

    raised, killed = tmp_path / "raised", tmp_path / "killed"

    class Faulty(ray_engine.TagActor):
        def run_model(self, images: np.ndarray) -> np.ndarray:
            if not raised.exists():
                raised.write_text("x")
                raise RuntimeError("injected failure")
            if not killed.exists():
                killed.write_text("x")
                os.kill(os.getpid(), signal.SIGKILL)  # the actor process dies mid-batch
            return super().run_model(images)

    messages: list[str] = []
    job = TagJob(setup["pics"], setup["onnx"], tmp_path / "ray.jsonl", engine="ray", batch_size=2, progress=False)
    engine = types.SimpleNamespace(score=functools.partial(ray_engine.score, actor_cls=Faulty))
    summary = run_plan(plan_tagging(job), engine=engine, warn=messages.append)
    assert raised.exists() and killed.exists() and any(m.startswith("engine ray:") for m in messages)
    assert summary.tagged == len(GOOD) and sorted(k for k, _ in summary.failed) == sorted(BAD)
    assert tag(setup["pics"], "-m", setup["onnx"], "-o", tmp_path / "local.jsonl") == 1
    assert_same_scores(read_jsonl(tmp_path / "ray.jsonl"), read_jsonl(tmp_path / "local.jsonl"))


def test_ray_killed_driver_resumes(
    setup: dict, ray_instance: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver killed with SIGKILL mid-run (its actors slowed down) leaves its journal; the next run skips what
    it holds and writes the run file an uninterrupted run writes."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(25):  # 200 images: several actor calls
        for name in GOOD:
            shutil.copy(setup["pics"] / name, folder / f"{i:02d}-{name.replace('/', '-')}")
    assert tag(folder, "-m", setup["onnx"], "-o", tmp_path / "reference.jsonl") == 0
    out = tmp_path / "tags.jsonl"
    args = [str(folder), "-m", str(setup["onnx"]), "-o", str(out), "--engine", "ray", "--batch-size", "4"]
    journaled = run_until_journaled(["0.05", "--ray", address(ray_instance), *args], out, 1, driver_env())
    assert 0 < len(journaled) < 200 and not out.exists()
    capsys.readouterr()
    assert tag(folder, "-m", setup["onnx"], "-o", out, "--engine", "ray") == 0  # the dead driver's actors are gone
    assert f"tagged {200 - len(journaled)} images" in capsys.readouterr().err
    resumed, reference = read_jsonl(out), read_jsonl(tmp_path / "reference.jsonl")
    assert list(resumed) == list(reference)  # same rows, sorted
    assert_same_scores(resumed, reference)
    assert not (tmp_path / "tags.jsonl.partial").exists()


def test_actor_layout_splits_each_node_between_its_actors() -> None:
    from serve.tagging import TagJob
    from serve.tagging.engines.ray import actor_layout

    head = {"Alive": True, "Resources": {"CPU": 4.0}}  # a CPU-only head
    gpu_node = {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 4.0}}
    dead = {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}
    job = TagJob(".", "m.onnx", engine="ray", gpus_per_worker=1)
    assert actor_layout([head, gpu_node, gpu_node, dead], job) == (8, 4)  # one actor per GPU, 16 / 4 CPUs each
    job = TagJob(".", "m.onnx", engine="ray", gpus_per_worker=0.5, workers=3, cpus_per_worker=3)
    assert actor_layout([head, gpu_node], job) == (3, 3)  # as given
    assert actor_layout([{"Resources": {"CPU": 2.0}}], TagJob(".", "m.onnx", engine="ray")) == (1, 2)
    assert actor_layout([head, {"Resources": {"CPU": 8.0}}], TagJob(".", "m.onnx", engine="ray")) == (2, 4)
    with pytest.raises(RuntimeError, match="no node of the Ray cluster has 1 GPU"):
        actor_layout([head], TagJob(".", "m.onnx", engine="ray", gpus_per_worker=1))


def test_shard_partitions_cover_every_image_once(setup: dict, tmp_path: Path) -> None:
    parts, failed = [], []
    for k in (1, 2, 3):
        code = tag(setup["pics"], "-m", setup["onnx"], "-o", tmp_path / f"t{k}.jsonl", "--shard", f"{k}/3")
        parts.append(read_jsonl(tmp_path / f"t{k}.jsonl") if (tmp_path / f"t{k}.jsonl").exists() else {})
        errors = read_errors(tmp_path / f"t{k}.errors.tsv") if (tmp_path / f"t{k}.errors.tsv").exists() else {}
        assert code == (1 if errors else 0)
        failed += list(errors)
    keys = [key for part in parts for key in part]
    assert sorted(keys) == sorted(GOOD) and sorted(failed) == sorted(BAD)
    assert all(len(part) < len(GOOD) for part in parts)
    combined = "".join((tmp_path / f"t{k}.jsonl").read_text() for k in (1, 2, 3) if (tmp_path / f"t{k}.jsonl").exists())
    assert len(combined.splitlines()) == len(GOOD)


def test_list_file_source(setup: dict, tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    pics = setup["pics"]
    listing.write_text(
        f"# two by relative path, one absolute, one URI\n{os.path.relpath(pics / 'rgb.jpg', tmp_path)}\n"
        f"{os.path.relpath(pics / 'empty.png', tmp_path)}\n{pics / 'grey.png'}\n"
        f"{(pics / 'alpha.png').as_uri()}\n"
    )
    assert tag(listing, "-m", setup["onnx"], "-o", tmp_path / "list.jsonl") == 1
    assert tag(pics, "-m", setup["onnx"], "-o", tmp_path / "folder.jsonl") == 1
    got = read_jsonl(tmp_path / "list.jsonl")
    folder = read_jsonl(tmp_path / "folder.jsonl")
    assert len(got) == 3
    for key, rec in got.items():
        name = Path(key.removeprefix("file://")).name
        assert rec["scores"] == folder[name]["scores"]
    assert list(read_errors(tmp_path / "list.errors.tsv").values()) == ["empty file (0 bytes)"]


def test_usage_errors(setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tag(setup["pics"], "-m", setup["onnx"], "--shard", "4/3") == 2
    assert tag(setup["pics"], "-m", setup["onnx"], "--address", "auto") == 2
    assert tag(tmp_path / "nope/*.tar", "-m", setup["onnx"]) == 2
    assert tag(setup["shards"] / "*.tar", "-m", setup["onnx"], "--sidecar") == 2
    err = capsys.readouterr().err
    assert "--shard must be K/N" in err and "need(s) --engine ray" in err and "no .tar shards match" in err
    assert "sidecars need a folder SOURCE" in err


def test_local_engine_never_imports_ray_and_ray_missing_hint(setup: dict, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-X", "importtime", "-m", "serve", "tag", str(setup["pics"]), "-m", str(setup["onnx"])]
    proc = subprocess.run(
        [*cmd, "-o", str(tmp_path / "t.jsonl"), "--no-progress"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 1 and (tmp_path / "t.jsonl").is_file()
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "onnxruntime" in imported and not {m for m in imported if m == "ray" or m.startswith("ray.")}
    code = (
        "import sys; sys.modules['ray'] = None; from serve.__main__ import main; "
        f"sys.exit(main(['tag', {str(setup['pics'])!r}, '-m', {str(setup['onnx'])!r}, '--engine', 'ray']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith('pip install "spml[ray]" (or pip install ray)')


def test_engines_benchmark_writes_its_section(ray_instance: object, tmp_path: Path) -> None:
    """``python -m bench.tag_engines`` on a few tiny images, joining the shared instance: both engines give the
    same scores, and the section has img/s and peak RSS for both."""
    from bench import tag_engines
    from bench.results_page import read_section

    page = tmp_path / "page.md"
    argv = ["--images", "6", "--width", "40", "--height", "30", "--sizes", "32", "--batch-size", "4", "--repeats", "1",
            "--address", address(ray_instance), "--page", str(page)]  # fmt: skip
    assert tag_engines.main(argv) == 0
    text = read_section("tag-engines", page)
    assert text is not None and "python -m bench.tag_engines --images 6" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| resnet18 @32 px")]
    assert [row[1] for row in rows] == ["local", "ray"]
    assert all(row[-1] == "0.0e+00 |" and row[5].endswith(" GB") for row in rows)
    assert rows[0][6] == "-" and rows[1][6].endswith(" GB")  # the ray engine's model actor


@pytest.mark.skipif(not os.environ.get("SPML_RAY_SERVE_TEST"), reason="two replicas start and one restarts: "
                    "over the suite's time budget; SPML_RAY_SERVE_TEST=1 runs it")
def test_ray_serve_replicas_answer_as_the_predictor_and_a_killed_one_is_replaced(setup: dict,
                                                                                 ray_instance: object) -> None:
    """``serve api --engine ray``'s deployment on the shared instance: two replicas answer as the Predictor does;
    one killed under load fails its in-flight requests at once (no hang), is replaced, and the service goes on.
    (Without a cluster, tests/test_api.py checks the replica's app and Ray's batching in it on every run.)"""
    ray_serve = pytest.importorskip("ray.serve")
    import httpx

    from serve.api.ray_serve import APP_NAME, TaggerReplica, deployment_options
    from serve.api.service import ApiSettings
    from serve.predictor import Predictor

    settings = ApiSettings(str(setup["onnx"]), threads=1, decode_threads=1)
    port = free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = TaggerReplica.options(**deployment_options(settings, 2, None, 0.5, 0.0))
    ray_serve.run(app.bind(settings), name=APP_NAME, route_prefix="/")
    url, picture = f"http://127.0.0.1:{port}", setup["pics"] / "rgb.jpg"
    try:
        expected = Predictor.load(setup["onnx"]).predict(picture)
        got = httpx.post(url + "/v1/tag", files={"f": ("rgb.jpg", picture.read_bytes())}, timeout=60).json()
        assert got["results"][0]["tags"] == expected.tags
        assert max(abs(got["results"][0]["scores"][c] - expected.scores[c]) for c in CLASSES) <= 1e-6
        ray = ray_instance
        replicas = [n for n in ray.util.list_named_actors(all_namespaces=True)  # type: ignore[attr-defined]
                    if "spml-tagger" in n["name"]]
        assert len(replicas) == 2
        statuses: list[int] = []

        def load(stop: float) -> None:
            with httpx.Client(timeout=60) as client:
                while time.monotonic() < stop:
                    statuses.append(client.post(url + "/v1/tag", content=picture.read_bytes()).status_code)

        threads = [threading.Thread(target=load, args=(time.monotonic() + 4,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1)
        ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]))  # type: ignore[attr-defined]
        for thread in threads:
            thread.join(60)
        assert set(statuses) <= {200, 500, 503} and statuses.count(200) >= len(statuses) - 4, statuses
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = ray_serve.status().applications[APP_NAME].deployments["spml-tagger"].replica_states
            if running.get("RUNNING") == 2 and not set(running) - {"RUNNING"}:
                break
            time.sleep(0.5)
        assert running == {"RUNNING": 2}
        names = {n["name"] for n in ray.util.list_named_actors(all_namespaces=True)}  # type: ignore[attr-defined]
        assert replicas[0]["name"] not in names
        assert httpx.post(url + "/v1/tag", content=picture.read_bytes(), timeout=60).status_code == 200
    finally:
        ray_serve.shutdown()
