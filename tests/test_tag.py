"""Folder tagging: JSONL content equals sigmoid(PyTorch logits), thresholds, failures and exit codes."""

from __future__ import annotations

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
from serve.records import tag_record
from serve.runtimes import OnnxRuntimeBackend, TorchBackend, runtime_for
from serve.sources import find_images
from serve.thresholds import class_thresholds

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
    assert class_thresholds(meta).tolist() == [0.2, 0.5, 0.9]
    assert class_thresholds(meta, 0.4).tolist() == [0.4] * 3
    meta.thresholds = None
    assert class_thresholds(meta).tolist() == [0.5] * 3
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
    from serve.sidecars import SidecarSpec
    from serve.tag import tag_folder

    _, onnx_path, _ = model
    runtime = OnnxRuntimeBackend.load(onnx_path)
    folder = tmp_path / "pics"
    make_images(folder, 4, seed=8)
    out = tmp_path / "tags.jsonl"
    spec = SidecarSpec()
    kw = {"progress": False, "sidecar": spec, "threshold": 0.0}
    first = tag_folder(folder, runtime, out, top_k=1, **kw)
    assert first.tagged == 4 and first.skipped == 0
    records = {r["path"]: r for r in map(json.loads, out.read_text().splitlines())}
    ranked = {p: sorted(CLASSES, key=lambda c: -r["scores"][c]) for p, r in records.items()}
    (folder / "im0.txt").write_text("mine, " + ranked["im0.JPEG"][0] + "\n")  # the user's own caption
    (folder / "a" / "im1.txt").unlink()

    skip = tag_folder(folder, runtime, out, top_k=1, existing="skip", **kw)
    assert (skip.tagged, skip.skipped) == (1, 3)
    assert (folder / "im0.txt").read_text() == "mine, " + ranked["im0.JPEG"][0] + "\n"  # untouched
    assert (folder / "a" / "im1.txt").read_text() == ranked["a/im1.png"][0] + "\n"
    assert {r["path"]: r for r in map(json.loads, out.read_text().splitlines())} == records  # kept + redone

    append = tag_folder(folder, runtime, out, top_k=2, existing="append", **kw)
    assert (append.tagged, append.skipped) == (4, 0)
    assert (folder / "im0.txt").read_text() == ", ".join(["mine", *ranked["im0.JPEG"][:2]]) + "\n"
    assert (folder / "im3.txt").read_text() == ", ".join(ranked["im3.png"][:2]) + "\n"  # no duplicate

    overwrite = tag_folder(folder, runtime, out, top_k=1, existing="overwrite", **kw)
    assert overwrite.tagged == 4 and (folder / "im0.txt").read_text() == ranked["im0.JPEG"][0] + "\n"

    # without sidecars, "done" means: the path is in the run file
    plain = tmp_path / "plain.jsonl"
    assert tag_folder(folder, runtime, plain, progress=False).tagged == 4
    again = tag_folder(folder, runtime, plain, progress=False)
    assert (again.tagged, again.skipped) == (0, 4) and again.ok
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
    from serve.journal import Journal, JournalHeader, read_journal
    from serve.records import OutputConflictError

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
    from serve.predictor import ImagePreprocessor, Predictor
    from serve.tag import TagJob, tag_folder

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
