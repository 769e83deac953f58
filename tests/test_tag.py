"""Folder tagging: JSONL content equals sigmoid(PyTorch logits), thresholds, failures and exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from reference import reference_logits

from export import export_onnx
from models import ModelMeta, build_model, load_checkpoint, save_checkpoint
from models.files.folder_walk import find_images
from models.runtimes import OnnxRuntimeBackend, TorchBackend, runtime_for
from serve.outputs.records import tag_record
from serve.outputs.thresholds import resolve_thresholds

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "car", "tree", "boat"]
THRESHOLDS = [0.3, 0.45, 0.5, 0.55, 0.7]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_tag(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "serve", "tag", *map(str, args), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=120)


def make_images(folder: Path, n: int, seed: int) -> list[Path]:
    """``n`` random images with mixed extension case, some in nested folders; returns their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        sub = folder / ("a/b" if i % 3 == 2 else "a" if i % 3 == 1 else "")
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / (f"im{i}.png" if i % 2 else f"im{i}.JPEG")
        Image.fromarray(rng.integers(0, 256, (24 + 3 * i, 40, 3), dtype=np.uint8)).save(
            path, format="PNG" if i % 2 else "JPEG"
        )
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, ModelMeta]:
    """(checkpoint, exported onnx, meta) of a random resnet18 with per-class thresholds."""
    root = tmp_path_factory.mktemp("tagmodel")
    torch.manual_seed(1)
    net = build_model("resnet18", len(CLASSES))
    meta = ModelMeta(classes=CLASSES, arch="resnet18", image_size=48, thresholds=THRESHOLDS)
    save_checkpoint(root / "best.pt", net.state_dict(), meta)
    pics = root / "pics"
    make_images(pics, 3, seed=9)
    result = export_onnx(root / "best.pt", images=pics)
    return root / "best.pt", result.onnx_path, load_checkpoint(root / "best.pt").meta


def expected_scores(checkpoint: Path, folder: Path, paths: list[Path]) -> dict[str, np.ndarray]:
    """sigmoid(PyTorch logits) per relative path, computed without the serve package."""
    probs = 1.0 / (1.0 + np.exp(-reference_logits(checkpoint, paths).astype(np.float64)))
    return {p.relative_to(folder).as_posix(): row for p, row in zip(paths, probs, strict=True)}


def check_lines(lines: list[dict], expected: dict[str, np.ndarray], thresholds: list[float]) -> None:
    assert [r["path"] for r in lines] == sorted(expected)
    for rec in lines:
        assert list(rec["scores"]) == CLASSES
        got = np.array([rec["scores"][c] for c in CLASSES])
        assert np.abs(got - expected[rec["path"]]).max() <= 1e-4
        want = [c for c, t in zip(CLASSES, thresholds, strict=True) if rec["scores"][c] >= t]
        assert sorted(rec["tags"]) == sorted(want)
        assert [rec["scores"][c] for c in rec["tags"]] == sorted((rec["scores"][c] for c in rec["tags"]), reverse=True)


def test_tag_folder_with_a_corrupt_file(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    checkpoint, onnx_path, _ = model
    folder = tmp_path / "photos"
    good = make_images(folder, 7, seed=3)
    (folder / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (folder / "readme.txt").write_text("ignored\n")
    out = tmp_path / "out" / "tags.jsonl"
    done = run_tag(folder, "--model", onnx_path, "--output", out, "--batch-size", "3", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "a/broken.png" in done.stderr and "1 failed" in done.stderr
    assert "readme.txt" not in done.stderr.replace("non-image", "")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(good)
    check_lines(lines, expected_scores(checkpoint, folder, good), THRESHOLDS)  # the model's thresholds
    assert any(rec["tags"] for rec in lines) or all(max(rec["scores"].values()) < min(THRESHOLDS) for rec in lines)


def test_clean_folder_exit_0_default_output_and_global_threshold(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path
) -> None:
    checkpoint, onnx_path, _ = model
    folder = tmp_path / "clean"
    good = make_images(folder, 4, seed=5)
    elsewhere = tmp_path / "elsewhere"
    make_images(elsewhere, 2, seed=6)
    (folder / "link").symlink_to(elsewhere, target_is_directory=True)  # symlinked folders are not followed
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_tag(folder, "--model", onnx_path, "--threshold", "0.5", cwd=cwd)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (cwd / "tags.jsonl").read_text().splitlines()]
    check_lines(lines, expected_scores(checkpoint, folder, good), [0.5] * len(CLASSES))


def test_usage_errors_exit_2(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    _, onnx_path, _ = model
    done = run_tag(tmp_path / "missing", "--model", onnx_path, cwd=tmp_path)
    assert done.returncode == 2 and "folder not found" in done.stderr
    done = run_tag(tmp_path, "--model", tmp_path / "nope.onnx", cwd=tmp_path)
    assert done.returncode == 2 and "model not found" in done.stderr
    assert not (tmp_path / "tags.jsonl").exists()


def test_runtimes_agree_and_registry(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    checkpoint, onnx_path, meta = model
    assert runtime_for(onnx_path) is OnnxRuntimeBackend and runtime_for(checkpoint) is TorchBackend
    with pytest.raises(ValueError, match="unsupported model file"):
        runtime_for(tmp_path / "model.engine.txt")
    ort_rt = OnnxRuntimeBackend.load(onnx_path)
    torch_rt = TorchBackend.load(checkpoint, device="cpu")
    assert ort_rt.meta == meta == torch_rt.meta
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 48)).astype(np.float32)
    assert np.abs(ort_rt.predict_logits(x) - torch_rt.predict_logits(x)).max() <= 1e-4
    folder = tmp_path / "f"
    make_images(folder, 3, seed=1)
    assert [p.relative_to(folder).as_posix() for p in find_images(folder)] == ["a/b/im2.JPEG", "a/im1.png", "im0.JPEG"]


def test_thresholds_and_record() -> None:
    meta = ModelMeta(classes=["a", "b", "c"], arch="resnet18", image_size=32, thresholds=[0.2, 0.5, 0.9])
    assert resolve_thresholds(meta).tolist() == [0.2, 0.5, 0.9]
    assert resolve_thresholds(meta, 0.4).tolist() == [0.4] * 3
    meta.thresholds = None
    assert resolve_thresholds(meta).tolist() == [0.5] * 3
    rec = tag_record("x.jpg", np.array([0.3, 0.95, 0.5000004]), ["a", "b", "c"], np.array([0.2, 0.5, 0.5]))
    assert rec == {"path": "x.jpg", "scores": {"a": 0.3, "b": 0.95, "c": 0.5}, "tags": ["b", "c", "a"]}


# --------------------------------------------------------------------------------------------------------
# The production batch tagger: discovery, dry run, sidecars, CSV, existing-output policies, thresholds
# files, top-k, bad inputs, atomicity. In-process ``main`` (fast) except the exit-code checks via subprocess.


def tag_main(*args: str | Path) -> int:
    from serve.__main__ import main

    return main(["tag", *map(str, args), "--no-progress"])


def png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb's signature) with no real data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))


def temp_leftovers(*folders: Path) -> list[Path]:
    """Temp files of atomic writes (``.<name>.<random>.tmp``) left anywhere under ``folders``."""
    return [p for f in folders for p in f.rglob(".*") if p.name.endswith(".tmp")]


def test_symlink_policy_and_loop(tmp_path: Path) -> None:
    folder = tmp_path / "pics"
    make_images(folder, 3, seed=2)
    outside = tmp_path / "outside"
    make_images(outside, 1, seed=4)
    (folder / "a" / "loop").symlink_to(folder, target_is_directory=True)  # a loop: must not be entered
    (folder / "up").symlink_to(tmp_path, target_is_directory=True)
    (folder / "linked.PNG").symlink_to(outside / "im0.JPEG")  # symlinked files are followed
    rels = [p.relative_to(folder).as_posix() for p in find_images(folder)]
    assert rels == ["a/b/im2.JPEG", "a/im1.png", "im0.JPEG", "linked.PNG"]


def test_dry_run_lists_without_loading_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "pics"
    make_images(folder, 4, seed=1)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model: loading it would fail")
    (folder / "a" / "im1.txt").write_text("done\n")  # a sidecar: already done under --existing skip
    out = tmp_path / "tags.jsonl"
    assert tag_main(folder, "--model", junk, "--sidecar", "--dry-run", "--output", out) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["a/b/im2.JPEG", "im0.JPEG", "im3.png"]
    assert "4 images found, 1 already done" in captured.err and "3 would be tagged" in captured.err
    assert tag_main(folder, "--model", junk, "--sidecar", "--dry-run", "--existing", "overwrite") == 0
    assert len(capsys.readouterr().out.split()) == 4
    assert not out.exists() and not (folder / "im0.txt").exists()


def test_sidecars_mirror_the_tree_csv_columns_and_top_k(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    import csv

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    images = make_images(folder, 5, seed=7)
    (folder / "im0.png").write_bytes(images[0].read_bytes())  # same stem as im0.JPEG: a.jpg.txt naming
    captions, out = tmp_path / "captions", tmp_path / "run" / "tags.csv"
    code = tag_main(folder, "--model", onnx_path, "--sidecar-dir", captions, "--separator", " | ",
                    "--threshold", "0", "--top-k", "2", "--output", out)
    assert code == 0
    rows = list(csv.reader(out.open(newline="")))
    assert rows[0] == ["path", "tags", *CLASSES]
    body = {r[0]: r for r in rows[1:]}
    assert sorted(body) == ["a/b/im2.JPEG", "a/im1.png", "a/im4.JPEG", "im0.JPEG", "im0.png", "im3.png"]
    sidecars = {
        "a/b/im2.JPEG": "a/b/im2.txt", "a/im1.png": "a/im1.txt", "a/im4.JPEG": "a/im4.txt",
        "im0.JPEG": "im0.JPEG.txt", "im0.png": "im0.png.txt", "im3.png": "im3.txt",
    }
    assert sorted(p.relative_to(captions).as_posix() for p in captions.rglob("*.txt")) == sorted(sidecars.values())
    for rel, row in body.items():
        scores = {c: float(v) for c, v in zip(CLASSES, row[2:], strict=True)}
        top2 = sorted(CLASSES, key=lambda c: -scores[c])[:2]  # threshold 0: every class passes, top-k cuts
        assert row[1] == " | ".join(top2)
        assert (captions / sidecars[rel]).read_text() == " | ".join(top2) + "\n"
    assert not list(folder.rglob("*.txt")) and not temp_leftovers(captions, out.parent)


def test_existing_policies_skip_append_overwrite(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    from serve.outputs.sidecars import SidecarSpec
    from serve.tagging import tag_folder

    _, onnx_path, _ = model
    runtime = OnnxRuntimeBackend.load(onnx_path)
    folder = tmp_path / "pics"
    make_images(folder, 4, seed=8)
    out = tmp_path / "tags.jsonl"
    spec = SidecarSpec()
    kw = {"progress": False, "sidecar": spec, "threshold": 0.0}
    first = tag_folder(folder, runtime, out, max_tags=1, **kw)
    assert first.tagged == 4 and first.skipped == 0
    records = {r["path"]: r for r in map(json.loads, out.read_text().splitlines())}
    ranked = {p: sorted(CLASSES, key=lambda c: -r["scores"][c]) for p, r in records.items()}
    (folder / "im0.txt").write_text("mine, " + ranked["im0.JPEG"][0] + "\n")  # the user's own caption
    (folder / "a" / "im1.txt").unlink()

    skip = tag_folder(folder, runtime, out, max_tags=1, existing="skip", **kw)
    assert (skip.tagged, skip.skipped) == (1, 3)
    assert (folder / "im0.txt").read_text() == "mine, " + ranked["im0.JPEG"][0] + "\n"  # untouched
    assert (folder / "a" / "im1.txt").read_text() == ranked["a/im1.png"][0] + "\n"
    assert {r["path"]: r for r in map(json.loads, out.read_text().splitlines())} == records  # kept + redone

    append = tag_folder(folder, runtime, out, max_tags=2, existing="append", **kw)
    assert (append.tagged, append.skipped) == (4, 0)
    assert (folder / "im0.txt").read_text() == ", ".join(["mine", *ranked["im0.JPEG"][:2]]) + "\n"
    assert (folder / "im3.txt").read_text() == ", ".join(ranked["im3.png"][:2]) + "\n"  # no duplicate

    overwrite = tag_folder(folder, runtime, out, max_tags=1, existing="overwrite", **kw)
    assert overwrite.tagged == 4 and (folder / "im0.txt").read_text() == ranked["im0.JPEG"][0] + "\n"

    # without sidecars, "done" means: the path is in the run file
    plain = tmp_path / "plain.jsonl"
    assert tag_folder(folder, runtime, plain, progress=False).tagged == 4
    again = tag_folder(folder, runtime, plain, progress=False)
    assert (again.tagged, again.skipped) == (0, 4) and not again.failed
    assert {r["path"] for r in map(json.loads, plain.read_text().splitlines())} == set(records)


def test_per_class_thresholds_file(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 3, seed=4)
    as_json, as_lines = tmp_path / "t.json", tmp_path / "t.tsv"
    as_json.write_text(json.dumps({"cat": 0.0, "boat": 1.0}))
    as_lines.write_text("# class, threshold\ncat\t0.0\nboat,1.0\n")
    for i, file in enumerate((as_json, as_lines)):
        out = tmp_path / f"out{i}.jsonl"
        assert tag_main(folder, "--model", onnx_path, "--thresholds", file, "--output", out) == 0
        for rec in map(json.loads, out.read_text().splitlines()):
            want = [c for c, t in zip(CLASSES, [0.0, *THRESHOLDS[1:4], 1.0], strict=True) if rec["scores"][c] >= t]
            assert "cat" in rec["tags"] and "boat" not in rec["tags"] and sorted(rec["tags"]) == sorted(want)
    capsys.readouterr()
    bad = tmp_path / "bad.tsv"
    bad.write_text("cat\t0.2\nzebra\t0.5\nunicorn,0.1\n")
    assert tag_main(folder, "--model", onnx_path, "--thresholds", bad, "--output", tmp_path / "x.jsonl") == 2
    err = capsys.readouterr().err
    assert "unknown class" in err and "unicorn" in err and "zebra" in err and not (tmp_path / "x.jsonl").exists()
    bad.write_text("cat\t1.5\n")
    assert tag_main(folder, "--model", onnx_path, "--thresholds", bad) == 2


def test_bad_inputs_go_to_the_errors_file(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    good = make_images(folder, 2, seed=3)
    (folder / "empty.jpg").write_bytes(b"")
    full = good[0].read_bytes()
    (folder / "cut.jpg").write_bytes(full[: len(full) // 2])
    (folder / "text.jpg").write_text("hello, I am not a JPEG\n")
    png_header_only(folder / "bomb.png", 100_000, 100_000)
    out = tmp_path / "out" / "run.jsonl"
    done = run_tag(folder, "--model", onnx_path, "--output", out, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert [json.loads(line)["path"] for line in out.read_text().splitlines()] == ["a/im1.png", "im0.JPEG"]
    errors = dict(line.split("\t") for line in (tmp_path / "out" / "run.errors.tsv").read_text().splitlines())
    assert sorted(errors) == ["bomb.png", "cut.jpg", "empty.jpg", "text.jpg"]
    assert "empty" in errors["empty.jpg"] and "truncated" in errors["cut.jpg"]
    assert "not an image" in errors["text.jpg"] and "too large" in errors["bomb.png"]
    assert all(name in done.stderr for name in errors) and "4 failed" in done.stderr
    # --max-pixels refuses ordinary images above the limit too
    assert tag_main(good[0].parent, "--model", onnx_path, "--max-pixels", "100", "--output", tmp_path / "s.jsonl",
                    "--errors", tmp_path / "s.tsv") == 1
    assert "too large" in (tmp_path / "s.tsv").read_text()


def test_crash_mid_run_leaves_outputs_intact(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 6, seed=5)
    out = tmp_path / "out" / "tags.jsonl"
    assert tag_main(folder, "--model", onnx_path, "--sidecar", "--output", out, "--top-k", "1", "--threshold", "0") == 0
    before = {p: p.read_bytes() for p in [out, *folder.rglob("*.txt")]}
    original = OnnxRuntimeBackend.predict_logits
    calls = []

    def fail_on_second_batch(self: OnnxRuntimeBackend, batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return original(self, batch)

    monkeypatch.setattr(OnnxRuntimeBackend, "predict_logits", fail_on_second_batch)
    code = tag_main(folder, "--model", onnx_path, "--sidecar", "--output", out, "--existing", "overwrite",
                    "--batch-size", "2", "--threshold", "0", "--separator", ";")
    assert code == 1 and len(calls) == 2
    after = {p: p.read_bytes() for p in [out, *folder.rglob("*.txt")]}
    assert after.keys() == before.keys() and after[out] == before[out]  # the run file was not touched
    changed = sorted(p.relative_to(folder).as_posix() for p in after if p != out and after[p] != before[p])
    assert changed == ["a/b/im2.txt", "a/b/im5.txt"]  # only the first batch (sorted order)'s sidecars, each complete
    assert all(after[folder / rel].count(b";") >= 1 for rel in changed)
    assert not temp_leftovers(folder, out.parent) and not (out.parent / "tags.errors.tsv").exists()


def test_help_documents_policies_and_exit_codes() -> None:
    from serve.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["tag"].format_help()
    for needle in ("symlinked folders are not", "--existing", "skip", "append", "errors.tsv", "exit status",
                   "  2  usage error", "--dry-run", ".csv", "--select MODE", "--max-tags", "--min-score",
                   "--caption-rules", "--sidecar-format", "--sort-into", "--sort-mode", "--untagged", "manifest.json"):
        assert needle in text, needle
    assert "--top-k" not in text  # the deprecated alias of --max-tags works, hidden from the help


# --------------------------------------------------------------------------------------------------------
# Nothing lost: the journal, a real SIGKILL, resuming, dry runs, foreign journals; the light command line


def assert_same_run_file(got: Path, want: Path) -> None:
    """Same rows in the same (sorted) order, same tags, scores within 1e-6 (batches may differ)."""
    a = [json.loads(line) for line in got.read_text().splitlines()]
    b = [json.loads(line) for line in want.read_text().splitlines()]
    assert [r["path"] for r in a] == [r["path"] for r in b] == sorted(r["path"] for r in b)
    for x, y in zip(a, b, strict=True):
        assert x["tags"] == y["tags"], x["path"]
        assert max(abs(x["scores"][c] - y["scores"][c]) for c in CLASSES) <= 1e-6, x["path"]


def test_sigkilled_run_resumes_with_nothing_lost_or_doubled(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tag_slowly import run_until_journaled

    checkpoint, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 24, seed=11)
    reference = tmp_path / "reference.jsonl"
    assert tag_main(folder, "--model", onnx_path, "--output", reference, "--batch-size", "2") == 0
    out = tmp_path / "out" / "tags.jsonl"
    args = [str(folder), "--model", str(onnx_path), "--output", str(out), "--batch-size", "2", "--no-progress"]
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    journaled = run_until_journaled(["0.25", *args], out, 4, env)
    assert 4 <= len(journaled) < 24 and not out.exists()
    capsys.readouterr()
    # a dry run counts what the journal holds
    assert tag_main(folder, "--model", onnx_path, "--output", out, "--dry-run") == 0
    captured = capsys.readouterr()
    assert f"24 images found, {len(journaled)} already done ({len(journaled)} in the journal" in captured.err
    assert sorted(captured.out.split()) == sorted(set(find_keys(folder)) - {r["path"] for r in journaled})
    # another model (the checkpoint: same classes, other file) does not merge into this journal
    assert tag_main(folder, "--model", checkpoint, "--output", out) == 2
    assert "written by another model" in capsys.readouterr().err and not out.exists()
    # resuming tags only what the journal lacks, and writes the uninterrupted run's file
    assert tag_main(folder, "--model", onnx_path, "--output", out, "--batch-size", "2") == 0
    assert f"tagged {24 - len(journaled)} images" in capsys.readouterr().err
    assert_same_run_file(out, reference)
    assert not (out.parent / "tags.jsonl.partial").exists()


def find_keys(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in find_images(folder)]


def test_journal_header_cut_line_and_other_models(tmp_path: Path) -> None:
    from serve.outputs.records import OutputConflictError
    from serve.tagging.journal import Journal, JournalHeader, read_journal

    path = tmp_path / "tags.jsonl.partial"
    header = JournalHeader("m.onnx", "a" * 64, ("cat", "dog"))
    journal = Journal(path, header)
    rec = {"path": "x.jpg", "scores": {"cat": 0.5, "dog": 0.25}, "tags": ["cat"]}
    journal.write([rec, {**rec, "path": "y.jpg"}], [("z.jpg", "not an image")])
    journal.close(remove=False)
    with open(path, "a") as fh:
        fh.write('{"path": "w.jpg", "sco')  # cut short by a kill
    contents = read_journal(path)
    assert contents.header == header and sorted(contents.offsets) == ["x.jpg", "y.jpg"]
    assert contents.errors == {"z.jpg": "not an image"}
    again = Journal(path, header, contents)  # continues: the cut line is dropped
    again.write([{**rec, "path": "w.jpg"}])
    assert [r["path"] for r in again.records(["w.jpg", "x.jpg"])] == ["w.jpg", "x.jpg"]
    again.close(remove=False)
    assert path.read_text().count("\n") == 5 and '"sco\n' not in path.read_text()
    for other, why in ((JournalHeader("m.onnx", "b" * 64, ("cat", "dog")), "another model"),
                       (JournalHeader("m.onnx", "a" * 64, ("cat",)), "other classes")):
        with pytest.raises(OutputConflictError, match=why):
            other.refuse_other(read_journal(path).header, path)  # type: ignore[arg-type]
    path.write_text('{"path": "x.jpg", "scores": {}, "tags": []}\n')  # no header: an older journal
    with pytest.raises(OutputConflictError, match="no header"):
        read_journal(path)


def test_bomb_check_is_on_by_default_in_the_python_api(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    from serve import DEFAULT_MAX_PIXELS
    from serve.images import ImagePreprocessor
    from serve.predictor import Predictor
    from serve.tagging import TagJob, tag_folder

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 2, seed=3)
    png_header_only(folder / "bomb.png", 100_000, 100_000)
    assert TagJob(folder, onnx_path).max_pixels == DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS
    summary = tag_folder(folder, onnx_path, tmp_path / "t.jsonl", progress=False, warn=lambda _: None)
    assert summary.tagged == 2 and [k for k, _ in summary.failed] == ["bomb.png"]
    assert "image too large" in summary.failed[0][1]
    predictor = Predictor.load(onnx_path)
    assert predictor.max_pixels == DEFAULT_MAX_PIXELS
    assert ImagePreprocessor(predictor.transform).max_pixels == DEFAULT_MAX_PIXELS
    # turning it off is explicit: None
    small = tag_folder(folder, onnx_path, tmp_path / "s.jsonl", max_pixels=100, progress=False, warn=lambda _: None)
    assert small.tagged == 0 and len(small.failed) == 3
    off = tag_folder(folder / "a", onnx_path, tmp_path / "o.jsonl", max_pixels=None, progress=False)
    assert off.tagged == 1 and not off.failed


def test_help_and_usage_errors_without_torch(model: tuple[Path, Path, ModelMeta], tmp_path: Path) -> None:
    """``--help`` and usage errors answer without importing torch or a runtime (and quickly)."""
    _, onnx_path, _ = model
    code = f"""
import contextlib, io, sys
from serve.__main__ import main
codes = []
with contextlib.redirect_stdout(io.StringIO()) as out:
    for argv in (['tag', '--help'], ['--help']):
        try:
            main(argv)
        except SystemExit as exc:
            codes.append(exc.code)
for argv in (['tag', {str(tmp_path / 'missing')!r}, '-m', {str(onnx_path)!r}],
             ['tag', {str(tmp_path)!r}, '-m', {str(tmp_path / 'nope.onnx')!r}],
             ['tag', {str(tmp_path)!r}, '-m', {str(onnx_path)!r}, '--batch-size', '0'],
             ['tag', {str(tmp_path)!r}, '-m', {str(onnx_path)!r}, '--device', 'gpu7'],
             ['tag', {str(tmp_path)!r}, '-m', {str(onnx_path)!r}, '--cpus-per-worker', '2']):
    codes.append(main(argv))
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'onnxruntime', 'ray'))
print(codes, heavy, 'symlinked folders' in out.getvalue())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.stdout.strip() == "[0, 0, 2, 2, 2, 2, 2] [] True", done.stdout + done.stderr
    for message in ("folder not found", "model not found", "batch_size (--batch-size) must be >= 1",
                    "unknown device 'gpu7'", "--cpus-per-worker need(s) --engine ray"):
        assert message in done.stderr, message


# --------------------------------------------------------------------------------------------------------
# Tags the way their users want them (issue 35): selection modes, caption rules, sidecar formats, tag folders,
# the manifest and summary of a run, resuming with other options


def ranked(rec: dict) -> list[str]:
    """A record's classes, highest stored score first (ties: class order)."""
    return sorted(CLASSES, key=lambda c: (-rec["scores"][c], CLASSES.index(c)))


def mcut_by_hand(rec: dict) -> list[str]:
    """MCut written out: the classes above the largest gap between neighbouring sorted scores."""
    order = ranked(rec)
    values = [rec["scores"][c] for c in order]
    gaps = [values[i] - values[i + 1] for i in range(len(values) - 1)]
    return order[: gaps.index(max(gaps)) + 1]


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_selection_modes_through_the_cli_and_the_manifest(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from serve.outputs.run_manifest import read_manifest

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 5, seed=21)
    runs = {
        "mcut": (["--select", "mcut"], mcut_by_hand),
        "top2": (["--select", "top-k:2"], lambda r: ranked(r)[:2]),
        "mcut-cap1": (["--select", "mcut", "--max-tags", "1"], lambda r: mcut_by_hand(r)[:1]),
        "floor": (["--threshold", "0", "--min-score", "0.5"],
                  lambda r: [c for c in ranked(r) if r["scores"][c] >= 0.5]),
        "calibrated-cap": (["--max-tags", "2"],
                           lambda r: [c for c in ranked(r) if r["scores"][c] >= THRESHOLDS[CLASSES.index(c)]][:2]),
    }
    sizes = set()
    for name, (options, want) in runs.items():
        out = tmp_path / f"{name}.jsonl"
        assert tag_main(folder, "--model", onnx_path, "--output", out, "--no-summary", *options) == 0, name
        lines = read_lines(out)
        assert len(lines) == 5
        for rec in lines:
            assert rec["tags"] == want(rec), (name, rec)
            sizes.add(len(rec["tags"]))
        manifest = read_manifest(out)
        assert manifest is not None and manifest["images"] == 5 and manifest["model"]["classes"] == CLASSES
        tagging = manifest["tagging"]
        assert tagging["selection"]["mode"] == ("thresholds" if name in ("floor", "calibrated-cap") else
                                                options[1].split(":")[0])
        assert (tagging["thresholds"] is None) == (tagging["selection"]["mode"] != "thresholds")
    assert read_manifest(tmp_path / "top2.jsonl")["tagging"]["selection"] == {  # type: ignore[index]
        "mode": "top-k", "k": 2, "max_tags": None, "min_score": 0.0}
    assert read_manifest(tmp_path / "floor.jsonl")["tagging"]["thresholds"] == dict.fromkeys(CLASSES, 0.0)  # type: ignore[index]
    assert read_manifest(tmp_path / "calibrated-cap.jsonl")["thresholds_source"].startswith("the model's")  # type: ignore[index]
    assert len(sizes) > 1  # the modes chose different numbers of tags on these images
    capsys.readouterr()
    # --top-k: the deprecated name of --max-tags, same tags, with a note
    old = tmp_path / "old.jsonl"
    assert tag_main(folder, "--model", onnx_path, "--output", old, "--top-k", "2", "--no-summary") == 0
    assert "--top-k is deprecated" in capsys.readouterr().err
    assert read_lines(old) == read_lines(tmp_path / "calibrated-cap.jsonl")
    for bad, message in ((["--select", "top-k:0"], "top-k:K"), (["--select", "best"], "invalid selection mode"),
                         (["--max-tags", "0"], "max_tags"), (["--min-score", "1.5"], "min_score"),
                         (["--top-k", "2", "--max-tags", "3"], "old name of --max-tags")):
        with contextlib.suppress(SystemExit):  # argparse type errors exit 2 by SystemExit
            assert tag_main(folder, "--model", onnx_path, "--output", tmp_path / "bad.jsonl", *bad) == 2, bad
        assert message in capsys.readouterr().err, bad
    assert not (tmp_path / "bad.jsonl").exists()
    # the Python API: the same options; top_k is the deprecated name of max_tags
    from serve.tagging import TagJob

    with pytest.warns(DeprecationWarning, match="max_tags"):
        job = TagJob(folder, onnx_path, top_k=2)
    assert job.mode.max_tags == 2 and TagJob(folder, onnx_path, selection="top-k:3", min_score=0.1).mode.describe() \
        == "top-3, score >= 0.1"


def test_caption_rules_flags_file_and_sidecar_formats(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from serve.outputs.sidecar_formats import xmp_keywords

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 4, seed=22)
    common = ["--model", onnx_path, "--threshold", "0", "--no-summary", "--sidecar-format", "txt,json,xmp"]
    flags = ["--first", "sks", "--exclude", "dog", "--exclude-re", "^tr", "--replace", "cat=big_cat", "--spaces",
             "--escape", "--weights"]
    out = tmp_path / "flags.jsonl"
    assert tag_main(folder, *common, "--sidecar-dir", tmp_path / "a", "--output", out, *flags) == 0
    for rec in read_lines(out):
        kept = [c for c in ranked(rec) if c not in ("dog", "tree")]  # threshold 0: every class, then the rules
        texts = ["sks"] + [f"({'big cat' if c == 'cat' else c}:{rec['scores'][c]:.2f})" for c in kept]
        assert rec["tags"] == texts, rec
        stem = Path(rec["path"]).with_suffix("")
        assert (tmp_path / "a" / f"{stem}.txt").read_text() == ", ".join(texts) + "\n"
        doc = json.loads((tmp_path / "a" / f"{stem}.json").read_text())
        assert doc["tags"] == texts and doc["scores"] == rec["scores"] and doc["selected"] == ranked(rec)
        assert xmp_keywords((tmp_path / "a" / f"{rec['path']}.xmp").read_text()) == texts
    # the same rules from a rules file (flags add to it): the same outputs
    rules = tmp_path / "lora.rules"
    rules.write_text("# captions for a LoRA\nfirst sks\nexclude dog\nexclude-re ^tr\nreplace cat=big_cat\nspaces\n")
    again = tmp_path / "file.jsonl"
    assert tag_main(folder, *common, "--sidecar-dir", tmp_path / "b", "--output", again, "--caption-rules", rules,
                    "--escape", "--weights") == 0
    assert read_lines(again) == read_lines(out)
    assert sorted(p.read_bytes() for p in (tmp_path / "b").rglob("*.*")) == \
        sorted(p.read_bytes() for p in (tmp_path / "a").rglob("*.*"))
    # --existing append: txt appends new tags, json merges its tags and keeps its other fields, xmp merges keywords
    some = tmp_path / "a" / "im0.json"
    some.write_text(json.dumps({**json.loads(some.read_text()), "tags": ["mine"], "rating": 5}))
    assert tag_main(folder, *common, "--sidecar-dir", tmp_path / "a", "--output", out, "--existing", "append",
                    "--select", "top-k:1") == 0
    doc = json.loads(some.read_text())
    top = ranked(read_lines(out)[-1])[0]  # im0.JPEG sorts last
    assert doc["rating"] == 5 and doc["tags"] == ["mine", top]
    capsys.readouterr()
    # bad rules: exit 2 naming the rule, before the model is read (a broken model file is never reached)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    bad_file = tmp_path / "bad.rules"
    bad_file.write_text("spaces\nfrist sks\n")
    for bad, named in ((["--exclude-re", "([a-z"], "([a-z"), (["--replace", "cat"], "cat"),
                       (["--caption-rules", bad_file], "bad.rules:2")):
        assert tag_main(folder, "--model", broken, "--output", tmp_path / "x.jsonl", *bad) == 2, bad
        err = capsys.readouterr().err
        assert named in err and "cannot load" not in err, err
    # a rule naming a class the model does not have: exit 2, nothing written
    assert tag_main(folder, "--model", onnx_path, "--output", tmp_path / "x.jsonl", "--replace", "zebra=z") == 2
    assert "zebra" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


def test_sort_into_tag_folders_without_duplicates(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 4, seed=23)
    by_tag, out = tmp_path / "by-tag", tmp_path / "tags.jsonl"
    args = [folder, "--model", onnx_path, "--output", out, "--no-summary", "--sort-into", by_tag,
            "--select", "top-k:2", "--replace", "cat=kitty"]

    def entries() -> list[str]:
        return sorted(p.relative_to(by_tag).as_posix() for p in by_tag.rglob("*") if not p.is_dir())

    assert tag_main(*args) == 0
    want = sorted(f"{'kitty' if c == 'cat' else c}/{r['path']}" for r in read_lines(out) for c in ranked(r)[:2])
    assert entries() == want and len(want) == 8
    for entry in by_tag.rglob("*"):
        if not entry.is_dir():
            assert entry.is_symlink() and entry.resolve() == (folder / entry.relative_to(by_tag).relative_to(
                entry.relative_to(by_tag).parts[0])).resolve()
    assert tag_main(*args) == 0 and entries() == want  # a plain re-run: nothing added
    assert tag_main(*args, "--existing", "overwrite") == 0 and entries() == want  # re-tagged: no duplicate
    # copies, and an untagged folder for images without tags
    copies = tmp_path / "copies"
    assert tag_main(folder, "--model", onnx_path, "--output", tmp_path / "c.jsonl", "--no-summary", "--sort-into",
                    copies, "--sort-mode", "copy", "--min-score", "1", "--untagged", "none") == 0
    placed = sorted(p.relative_to(copies).as_posix() for p in copies.rglob("*") if p.is_file())
    assert placed == sorted(f"none/{k}" for k in find_keys(folder))
    assert not any(p.is_symlink() for p in copies.rglob("*"))
    assert (copies / "none" / "im0.JPEG").read_bytes() == (folder / "im0.JPEG").read_bytes()
    capsys.readouterr()
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(str(p) for p in find_images(folder)) + "\n")
    assert tag_main(listing, "--model", onnx_path, "--output", tmp_path / "l.jsonl", "--sort-into", by_tag) == 2
    assert "--sort-into needs a folder SOURCE" in capsys.readouterr().err
    assert tag_main(folder, "--model", onnx_path, "--output", tmp_path / "i.jsonl", "--sort-into", folder / "x") == 2
    assert "inside SOURCE" in capsys.readouterr().err and not (folder / "x").exists()


def test_summary_after_a_run_counts_the_run_file(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from collections import Counter

    from serve.__main__ import main

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 6, seed=24)
    out = tmp_path / "run" / "tags.csv"
    assert tag_main(folder, "--model", onnx_path, "--output", out, "--select", "top-k:2", "--replace", "cat=kitty",
                    "--first", "sks", "--weights", "--separator", "; ") == 0
    printed = capsys.readouterr().out
    report = json.loads((out.parent / "tags.summary.json").read_text())
    assert (out.parent / "tags.summary.md").is_file() and (out.parent / "tags.manifest.json").is_file()
    import csv

    rows = list(csv.DictReader(out.open(newline="")))
    chosen = [ranked({"scores": {c: float(r[c]) for c in CLASSES}})[:2] for r in rows]
    names = Counter(("kitty" if c == "cat" else c) for two in chosen for c in two)
    assert report["images"] == 6 and report["per_tag"] == dict(names)  # by name: no weights, no trigger word
    assert report["tags_per_image"] == {"2": 6}
    assert report["never_predicted"] == [c for c in CLASSES if all(c not in two for two in chosen)]
    assert all(row["tags"].split("; ")[0] == "sks" for row in rows)
    assert "6 images" in printed and f"{len(report['never_predicted'])} of 5 classes never predicted" in printed
    # python -m serve summary RUNFILE reads the manifest: the same numbers
    (out.parent / "tags.summary.json").unlink()
    assert main(["summary", str(out)]) == 0
    assert json.loads((out.parent / "tags.summary.json").read_text()) == report
    # --no-summary: no report
    quiet = tmp_path / "quiet" / "tags.jsonl"
    assert tag_main(folder, "--model", onnx_path, "--output", quiet, "--no-summary") == 0
    assert sorted(p.name for p in quiet.parent.iterdir()) == ["tags.jsonl", "tags.manifest.json"]


def test_resume_with_other_options_reselects_records_and_refuses_sidecars(
    model: tuple[Path, Path, ModelMeta], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serve.outputs.caption_rules import make_rules
    from serve.outputs.run_manifest import read_manifest
    from serve.outputs.sidecars import SidecarSpec
    from serve.tagging import TagJob, tag

    _, onnx_path, _ = model
    folder = tmp_path / "pics"
    make_images(folder, 6, seed=25)
    out = tmp_path / "tags.jsonl"
    assert tag_main(folder, "--model", onnx_path, "--output", out, "--no-summary", "--batch-size", "2") == 0
    first = read_lines(out)
    # a re-run with other options: nothing is scored again; the kept records' tags are chosen again from their
    # stored scores (exact), and the manifest says so
    calls: list[int] = []
    original = OnnxRuntimeBackend.predict_logits
    monkeypatch.setattr(OnnxRuntimeBackend, "predict_logits", lambda self, b: calls.append(len(b)) or original(self, b))
    capsys.readouterr()
    assert tag_main(folder, "--model", onnx_path, "--output", out, "--no-summary", "--select", "mcut",
                    "--exclude", "boat") == 0
    assert "chosen again" in capsys.readouterr().err and calls == []
    again = read_lines(out)
    assert [r["scores"] for r in again] == [r["scores"] for r in first]
    assert [r["tags"] for r in again] == [[c for c in mcut_by_hand(r) if c != "boat"] for r in first]
    assert read_manifest(out)["tagging"]["selection"]["mode"] == "mcut"  # type: ignore[index]
    # the Python API takes the same options, and with the first run's options the first run file comes back
    summary = tag(TagJob(folder, onnx_path, out, progress=False, summary=False))
    assert summary.tagged == 0 and read_lines(out) == first
    # an interrupted run resumed with other options: the journaled records are re-selected too
    monkeypatch.setattr(OnnxRuntimeBackend, "predict_logits", original)
    fresh = tmp_path / "fresh.jsonl"

    def crash_on_second(self: OnnxRuntimeBackend, batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return original(self, batch)

    monkeypatch.setattr(OnnxRuntimeBackend, "predict_logits", crash_on_second)
    assert tag_main(folder, "--model", onnx_path, "--output", fresh, "--batch-size", "2", "--no-summary") == 1
    assert (tmp_path / "fresh.jsonl.partial").is_file() and not fresh.exists()
    monkeypatch.setattr(OnnxRuntimeBackend, "predict_logits", original)
    job = TagJob(folder, onnx_path, fresh, selection="top-k:1", rules=make_rules(first=["sks"]), progress=False,
                 summary=False, batch_size=2)
    assert tag(job).tagged == 4
    assert [r["tags"] for r in read_lines(fresh)] == [["sks", ranked(r)[0]] for r in first]
    # sidecars already written with other options are refused (they would not match): exit 2, nothing changed
    side = tmp_path / "side.jsonl"
    tag(TagJob(folder, onnx_path, side, progress=False, summary=False, sidecar=SidecarSpec(formats=("json",))))
    before = sorted((p, p.read_bytes()) for p in folder.rglob("*.json"))
    capsys.readouterr()
    assert tag_main(folder, "--model", onnx_path, "--output", side, "--sidecar-format", "json",
                    "--select", "top-k:1") == 2
    err = capsys.readouterr().err
    assert "written with other tag options (selection" in err and "--existing overwrite" in err
    assert sorted((p, p.read_bytes()) for p in folder.rglob("*.json")) == before
    assert tag_main(folder, "--model", onnx_path, "--output", side, "--sidecar-format", "json", "--no-summary",
                    "--select", "top-k:1", "--existing", "overwrite") == 0
    assert all(len(json.loads(p.read_text())["tags"]) == 1 for p in folder.rglob("*.json"))
