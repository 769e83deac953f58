"""Gradio demo: API scores equal the Predictor's, re-filtering without the model, errors, batch files, CLI,
and a headless Chromium run of the page (driven over the DevTools protocol on a pipe; no extra package)."""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from models import ModelMeta, build_model, save_checkpoint
from serve.demo.app import build_demo, launch_demo, parse_size
from serve.demo.catalog import find_examples, find_models
from serve.demo.model_store import ModelStore
from serve.predictor import Prediction, Predictor

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
gradio_client = pytest.importorskip("gradio_client")

REPO = Path(__file__).resolve().parents[1]
MAX_PIXELS = 200 * 200
MAX_FILE_SIZE = 300 * 1024
#: The tag controls left as they start: thresholds mode, K 5, no cap, no floor, no caption rules.
NO_RULES = ("thresholds", 5, 0, 0.0, "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_run(runs: Path, name: str, classes: list[str], source: str) -> Path:
    """``runs/<name>/best.pt``: random resnet18 at 64 px with calibrated thresholds, trained "on" ``source``."""
    torch.manual_seed(7)
    net = build_model("resnet18", len(classes))
    thresholds = np.round(np.linspace(0.3, 0.7, len(classes)), 3).tolist()
    meta = ModelMeta(classes=classes, arch="resnet18", image_size=64, thresholds=thresholds, data={"source": source})
    save_checkpoint(runs / name / "best.pt", net.state_dict(), meta)
    return runs / name / "best.pt"


@pytest.fixture(scope="module")
def setup(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A runs folder with a model of the built-in classes, the tiny built-in dataset in the (test) cache."""
    from models.sources.shapes import CLASS_NAMES

    root = tmp_path_factory.mktemp("demo")
    runs = root / "runs"
    ckpt = make_run(runs / "group", "tiny-an", list(CLASS_NAMES), "builtin:tiny@seed0")
    (runs / "group" / "tiny-an" / "export").mkdir()
    (runs / "group" / "tiny-an" / "export" / "model.onnx").write_bytes(b"listed, never loaded in these tests")
    (runs / "group" / "tiny-an" / "last.pt").write_bytes(b"resume checkpoint: not offered")
    files = root / "files"
    files.mkdir()
    Image.new("RGB", (400, 400), (200, 30, 30)).save(files / "huge.png")  # 160,000 px > MAX_PIXELS
    (files / "notes.png").write_text("not a picture\n")
    (files / "big.bin").write_bytes(os.urandom(MAX_FILE_SIZE + 10_000))
    return {"runs": runs, "ckpt": ckpt, "files": files}


@pytest.fixture(scope="module")
def app(setup: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The demo launched on a free loopback port; yields url, key, predictor, examples, client."""
    choices = find_models(setup["runs"])
    key = "group/tiny-an/best.pt"
    predictor = Predictor.load(choices[key], device="cpu", max_pixels=MAX_PIXELS)
    store = ModelStore(choices, device="cpu", max_pixels=MAX_PIXELS, loaded={key: predictor})
    examples = find_examples(predictor.meta)
    demo = build_demo(store, key, examples, max_batch_files=5)
    _, url, _ = launch_demo(
        demo, port=free_port(), max_file_size=MAX_FILE_SIZE, prevent_thread_lock=True, quiet=True, queue_size=8
    )
    try:
        client = gradio_client.Client(url, verbose=False, download_files=str(setup["files"].parent / "downloads"))
        yield {"url": url, "key": key, "predictor": predictor, "examples": examples, "client": client}
    finally:
        demo.close()


def test_picker_and_examples_found_without_generating(setup: dict[str, Any], app: dict[str, Any]) -> None:
    assert list(find_models(setup["runs"])) == ["group/tiny-an/best.pt", "group/tiny-an/export/model.onnx"]
    examples = app["examples"]
    assert len(examples.images) == 8 and "tiny-seed0" in examples.note
    assert all("/images/test/" in p.as_posix() for p in examples.images)
    truth = examples.truth_for(examples.images[0].read_bytes())
    assert truth and set(truth) <= set(app["predictor"].classes)
    # nothing generated: with an empty cache there are no examples, only a note
    empty = setup["files"].parent / "empty-cache"
    empty.mkdir()
    old = os.environ["SPML_CACHE"]
    os.environ["SPML_CACHE"] = str(empty)
    try:
        none = find_examples(app["predictor"].meta)
    finally:
        os.environ["SPML_CACHE"] = old
    assert none.images == [] and "not generated" in none.note and list(empty.iterdir()) == []
    assert parse_size("20mb") == 20 * 1024**2 and parse_size("1.5kb") == 1536
    with pytest.raises(ValueError):
        parse_size("lots")


def test_api_returns_every_score_equal_to_the_predictor(app: dict[str, Any]) -> None:
    client, predictor, key = app["client"], app["predictor"], app["key"]
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/predict", "/predict_batch"} <= set(api)
    image = app["examples"].images[1]
    expected = predictor.scores([image])[0]
    result = client.predict(gradio_client.handle_file(str(image)), True, 0.5, key, api_name="/predict")
    assert list(result["scores"]) == predictor.classes  # every class, model order: not cut to a top-k
    got = np.array([result["scores"][c] for c in predictor.classes])
    assert np.abs(got - expected).max() <= 1e-6
    assert result["threshold_mode"] == "calibrated"
    assert list(result["thresholds"].values()) == pytest.approx(predictor.meta.thresholds)
    assert result["tags"] == predictor.predict(image).tags
    low = float(np.floor(np.sort(expected)[-3] * 1e4) / 1e4)  # a global threshold that keeps the top 3
    result = client.predict(gradio_client.handle_file(str(image)), False, low, key, api_name="/predict")
    assert set(result["thresholds"].values()) == {low} and result["threshold_mode"] == "global"
    assert result["tags"] == predictor.predict(image, threshold=low).tags and len(result["tags"]) >= 3


def test_threshold_changes_refilter_without_running_the_model(app: dict[str, Any]) -> None:
    client, predictor, key = app["client"], app["predictor"], app["key"]
    image = app["examples"].images[2]
    scores = predictor.scores([image])[0]
    before = predictor.model_calls
    first = client.predict(gradio_client.handle_file(str(image)), True, 0.5, key, api_name="/predict")
    assert predictor.model_calls == before + 1
    for use_calibrated, value in ((False, 0.0), (False, 1.0), (True, 0.5), (False, 0.25)):
        doc, html = client.predict(use_calibrated, value, *NO_RULES, api_name="/refilter")
        assert doc["scores"] == first["scores"]
        want = predictor.thresholds(None if use_calibrated else value)
        assert list(doc["thresholds"].values()) == pytest.approx(want.tolist())
        assert doc["tags"] == Prediction.from_probabilities(predictor.classes, scores, want).tags
        assert all(f'data-class="{c}"' in html for c in predictor.classes)
    assert predictor.model_calls == before + 1  # four re-filters, no model call


def test_bad_files_give_readable_errors(setup: dict[str, Any], app: dict[str, Any]) -> None:
    client, key, files = app["client"], app["key"], setup["files"]
    cases = {"notes.png": "not an image", "huge.png": "image too large: 400x400"}
    for name, reason in cases.items():
        with pytest.raises(Exception, match=f"Cannot read {name}: {reason}"):
            client.predict(gradio_client.handle_file(str(files / name)), True, 0.5, key, api_name="/predict")
    with pytest.raises(Exception, match="maximum file size"):  # refused before upload by the client...
        client.predict(gradio_client.handle_file(str(files / "big.bin")), True, 0.5, key, api_name="/predict")
    big = {"files": ("big.png", (files / "big.bin").read_bytes())}
    upload = httpx.post(app["url"] + "gradio_api/upload", files=big)
    assert upload.status_code == 413  # ... and by the server
    with pytest.raises(Exception, match="unknown model"):  # only the picker's entries, never a path
        image = gradio_client.handle_file(str(files / "huge.png"))
        client.predict(image, True, 0.5, "/etc/passwd", api_name="/predict")


def test_batch_table_csv_and_jsonl(setup: dict[str, Any], app: dict[str, Any]) -> None:
    client, predictor, key = app["client"], app["predictor"], app["key"]
    images = app["examples"].images[:3]
    payload = [gradio_client.handle_file(str(p)) for p in [images[0], setup["files"] / "notes.png", *images[1:]]]
    table, csv_path, jsonl_path, zip_path = client.predict(payload, True, 0.5, key, api_name="/predict_batch")
    assert table["headers"] == ["file", "tags", "error", *predictor.classes]
    assert [row[0] for row in table["data"]] == [images[0].name, "notes.png", images[1].name, images[2].name]
    assert "not an image" in table["data"][1][2]
    expected = predictor.scores(images)
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    lines = [json.loads(line) for line in Path(jsonl_path).read_text().splitlines()]
    assert lines[1] == {"path": "notes.png", "error": rows[1]["error"]} and rows[1]["tags"] == ""
    for want, row, line, image in zip(expected, [rows[0], *rows[2:]], [lines[0], *lines[2:]], images, strict=True):
        from_csv = np.array([float(row[c]) for c in predictor.classes])
        from_jsonl = np.array([line["scores"][c] for c in predictor.classes])
        assert np.abs(from_csv - want).max() <= 1e-6 and np.abs(from_jsonl - want).max() <= 1e-6
        tags = predictor.predict(image).tags
        assert line["tags"] == tags and row["tags"] == ";".join(tags)
    with zipfile.ZipFile(zip_path) as archive:  # one caption per readable image, named as serve tag names sidecars
        captions = {name: archive.read(name).decode() for name in archive.namelist()}
    assert captions == {Path(line["path"]).with_suffix(".txt").name: ", ".join(line["tags"]) + "\n"
                        for line in lines if "tags" in line}


def test_selection_modes_and_caption_rules_in_the_demo(app: dict[str, Any]) -> None:
    """The tag controls (mode, K, cap, floor, caption rules) through the API: the tags equal the pipeline's
    selection of the same scores, the caption has the rules applied, the batch zip holds the captions, and a bad
    rule is an error naming it, before the model runs."""
    from serve.outputs.caption_rules import parse_rules_text
    from serve.outputs.selection_modes import make_selection
    from serve.outputs.stage import TagSelector

    client, predictor, key = app["client"], app["predictor"], app["key"]
    images = app["examples"].images[3:5]
    scores = predictor.scores(images)
    first_class = predictor.classes[0]
    rules_text = f"first sks\nreplace {first_class}=FIRST\nweights"
    rules = parse_rules_text(rules_text)
    cases = [("mcut", 5, 0, 0.0), ("top-k", 3, 0, 0.0), ("top-k", 4, 2, 0.0), ("thresholds", 5, 0, 0.2)]
    for mode, k, cap, floor in cases:
        select = TagSelector(list(predictor.classes), predictor.thresholds(),
                           make_selection(f"top-k:{k}" if mode == "top-k" else mode, cap or None, floor), rules)
        want = select("x", scores[0])
        doc = client.predict(gradio_client.handle_file(str(images[0])), True, 0.5, key, mode, k, cap, floor,
                             rules_text, api_name="/predict")
        chosen = select.chosen(want["scores"])
        assert doc["tags"] == chosen, (mode, k, cap, floor)
        assert doc["caption"] == ", ".join(want["tags"]) and want["tags"][0] == "sks"
        if mode == "top-k":
            assert len(chosen) == min(k, cap or k)
        # the same controls re-filter the kept scores (no model call)
        before = predictor.model_calls
        refiltered, _ = client.predict(True, 0.5, mode, k, cap, floor, rules_text, api_name="/refilter")
        assert refiltered["tags"] == chosen and predictor.model_calls == before
    payload = [gradio_client.handle_file(str(p)) for p in images]
    _, _, jsonl_path, zip_path = client.predict(payload, True, 0.5, key, "top-k", 2, 0, 0.0, "first sks\nspaces",
                                                api_name="/predict_batch")
    lines = [json.loads(line) for line in Path(jsonl_path).read_text().splitlines()]
    with zipfile.ZipFile(zip_path) as archive:
        for image, line in zip(images, lines, strict=True):
            caption = archive.read(image.with_suffix(".txt").name).decode().strip().split(", ")
            assert caption[0] == "sks" and len(caption) == 3 and caption == line["tags"]
    before = predictor.model_calls
    for bad, named in (("exclude-re ([a-z", "exclude-re"), ("replace nosuchclass=x", "nosuchclass")):
        with pytest.raises(Exception, match=named):
            client.predict(gradio_client.handle_file(str(images[0])), True, 0.5, key, "thresholds", 5, 0, 0.0, bad,
                           api_name="/predict")
    assert predictor.model_calls == before


def test_cli_help_and_usage_errors(
    setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from serve.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "exit status" in out and "127.0.0.1" in out and "--max-file-size" in out
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "tag" in out and "demo" in out
    cases = [
        (["--model", str(tmp_path / "missing.pt")], "model not found"),
        (["--runs-dir", str(tmp_path / "no-runs")], "pass --model"),
        (["--runs-dir", str(tmp_path)], "no model found under"),
        (["--model", str(setup["ckpt"]), "--max-file-size", "huge"], "--max-file-size"),
        (["--model", str(setup["ckpt"]), "--port", "70000"], "--port"),
        (["--model", str(setup["ckpt"]), "--device", "gpu7"], "unknown device 'gpu7'"),
        (["--model", str(setup["ckpt"]), "--backend", "tflite"], "unknown backend 'tflite'"),
    ]
    for args, message in cases:
        assert main(["demo", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("python -m serve demo: error: ") and message in err and "Traceback" not in err
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    assert main(["demo", "--model", str(tmp_path / "broken.pt")]) == 1  # exists but does not load
    assert "cannot load model" in capsys.readouterr().err


def test_cli_serves_on_loopback_and_stops_on_ctrl_c(setup: dict[str, Any]) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False"}
    cmd = [sys.executable, "-m", "serve", "demo", "--model", str(setup["ckpt"]), "--port", str(port)]
    cmd += ["--runs-dir", str(setup["runs"]), "--device", "cpu"]
    # A shell starts background jobs with SIGINT ignored, and a Python started that way never raises
    # KeyboardInterrupt: give the demo the default disposition, as in an interactive terminal.
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                status = httpx.get(f"http://127.0.0.1:{port}/config", timeout=2).status_code
                break
            time.sleep(0.3)
        assert status == 200, proc.stdout.read() if proc.poll() is not None else "server did not answer"
        config = httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).json()
        assert any(d.get("api_name") == "predict" for d in config["dependencies"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "127.0.0.1" in proc.stdout.read()


# --------------------------------------------------------------------------------------------------------
# Headless Chromium over the DevTools protocol, on a pipe (--remote-debugging-pipe): no port, no websocket
# library, no browser download. Chromium reads commands from fd 3 and writes replies to fd 4, NUL-separated.


class DevTools:
    """A minimal Chrome DevTools Protocol client for a Chromium it starts."""

    # runs in the child: move the two pipe ends to fds 3 and 4, then become Chromium
    TRAMPOLINE = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
        "os.execv(sys.argv[3], sys.argv[3:])"
    )

    def __init__(self, executable: str, profile: Path, size: tuple[int, int] = (1280, 1500)) -> None:
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        # fds >= 10 so that moving them to 3 and 4 in the child cannot overwrite one another
        child_r, child_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(out_w)
        flags = [
            "--headless",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.TRAMPOLINE, str(child_r), str(child_w), executable, *flags],
            pass_fds=(child_r, child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(child_r)
        os.close(child_w)
        self.write_fd, self.read_fd = cmd_w, out_r
        self.buffer = b""
        self.last_id = 0
        self.session: str | None = None

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            if select.select([self.read_fd], [], [], left)[0]:
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    raise EOFError("Chromium closed the DevTools pipe")
                self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        """Send one command (to the attached page, once there is one) and return its result; events are dropped."""
        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self.last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open_page(self, url: str) -> None:
        """Open a tab, attach to it, and navigate to ``url``."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """Value of a JavaScript expression in the page."""
        return self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"page never satisfied: {expression}")

    def set_files(self, selector: str, paths: list[str]) -> None:
        """Put files into an ``<input type=file>`` as a user's file picker would (fires its change event)."""
        root = self.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        assert node, f"no element {selector}"
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": paths})

    def screenshot(self, path: Path) -> None:
        """Save the page as a PNG."""
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Close the browser (kill it if it does not exit)."""
        with contextlib.suppress(Exception):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.write_fd)
        os.close(self.read_fd)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")
def test_page_in_headless_chromium(app: dict[str, Any], tmp_path: Path) -> None:
    predictor = app["predictor"]
    browser = DevTools(str(CHROMIUM), tmp_path / "profile")
    try:
        browser.open_page(app["url"])
        browser.wait_for("!!document.querySelector('#spml-image input[type=file]')")
        placeholder = browser.wait_for("document.querySelector('#spml-result')?.innerText")
        assert placeholder.startswith("Upload an image")
        image = app["examples"].images[3]
        prediction = predictor.predict(image)
        before = predictor.model_calls
        for _ in range(3):  # a page still wiring its components may miss the first file: give it again
            browser.set_files("#spml-image input[type=file]", [str(image)])
            with contextlib.suppress(TimeoutError):
                browser.wait_for("!!document.querySelector('#spml-image img')", timeout=10)
                break
        text = browser.wait_for(
            "document.querySelector('#spml-result table') && document.querySelector('#spml-result').innerText",
            timeout=60,
        )
        assert predictor.model_calls == before + 1
        missing = [c for c in predictor.classes if c not in text]
        assert not missing, f"classes not shown: {missing}"
        assert image.name in text and "calibrated per-class thresholds" in text and "true labels" in text
        shown = browser.evaluate("[...document.querySelectorAll('#spml-result tr.above')].map(r => r.dataset.class)")
        assert sorted(shown) == sorted(prediction.tags)
        # untick "calibrated": the page re-filters with the global threshold, without a model call
        browser.evaluate("document.querySelector('#spml-calibrated input').click()")
        browser.wait_for("document.querySelector('#spml-result').innerText.includes('global threshold 0.50')")
        # moving the slider re-filters too (and would untick the box)
        browser.evaluate(
            "(() => { const r = document.querySelector('#spml-threshold input[type=range]'); r.value = 0.3;"
            " r.dispatchEvent(new Event('input', {bubbles: true})); })()"
        )
        browser.wait_for("document.querySelector('#spml-result').innerText.includes('global threshold 0.30')")
        assert browser.evaluate("document.querySelector('#spml-calibrated input').checked") is False
        shown = browser.evaluate("[...document.querySelectorAll('#spml-result tr.above')].map(r => r.dataset.class)")
        assert sorted(shown) == sorted(predictor.predict(image, threshold=0.3).tags)
        assert predictor.model_calls == before + 2  # the line above; the page itself ran the model once
        shot = tmp_path / "demo.png"
        browser.screenshot(shot)
    finally:
        browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    with Image.open(shot) as img:
        assert img.size[0] >= 1000 and img.size[1] >= 800
