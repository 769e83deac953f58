"""The run summary: counts against the run file, the reports, and `python -m serve summary`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from serve.outputs.records import write_run_file
from serve.outputs.run_summary import summarize, summary_paths

CLASSES = ["cat", "dog", "car", "tree"]


def _records() -> list[dict]:
    tags = [["cat", "dog"], ["cat"], [], ["cat", "tree", "dog"], ["dog"]]
    return [{"path": f"img{i}.jpg", "scores": {c: 0.5 for c in CLASSES}, "tags": t} for i, t in enumerate(tags)]


def test_counts() -> None:
    summary = summarize(_records())
    assert summary.images == 5
    assert summary.per_tag == {"cat": 3, "dog": 3, "tree": 1}
    assert list(summary.per_tag) == ["cat", "dog", "tree"]  # most frequent first, then by name
    assert summary.tags_per_image == {0: 1, 1: 2, 2: 1, 3: 1}
    assert summary.never_predicted == ["car"]
    assert summary.mean_tags == 7 / 5
    # with caption rules the tags are texts; the selected classes decide what was never predicted
    renamed = [dict(r, tags=[t.upper() for t in r["tags"]], scores={c: float(c in r["tags"]) for c in CLASSES})
               for r in _records()]
    assert summarize(renamed, CLASSES, lambda scores: [c for c, p in scores.items() if p > 0.5]).never_predicted \
        == ["car"]
    assert summarize(renamed, CLASSES).never_predicted == CLASSES
    # with the selection known, tags are counted by name (here: the class names again), not as written
    by_name = summarize(renamed, CLASSES, lambda scores: [c for c, p in scores.items() if p > 0.5], lambda cs: cs)
    assert by_name.per_tag == summary.per_tag and by_name.tags_per_image == summary.tags_per_image


def test_cli_writes_reports_that_match_the_run_file(tmp_path: Path) -> None:
    run_file = tmp_path / "tags.csv"
    write_run_file(run_file, _records(), CLASSES, ", ")
    proc = subprocess.run([sys.executable, "-m", "serve", "summary", str(run_file)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("5 images, 1.40 tags per image, 3 distinct tags; 1 of 4 classes")
    md, js, png = summary_paths(run_file)
    assert [p.name for p in (md, js, png)] == ["tags.summary.md", "tags.summary.json", "tags.summary.png"]
    doc = json.loads(js.read_text())
    assert doc["per_tag"] == {"cat": 3, "dog": 3, "tree": 1} and doc["never_predicted"] == ["car"]
    assert doc["tags_per_image"] == {"0": 1, "1": 2, "2": 1, "3": 1}
    assert "| cat | 3 | 60.0% |" in md.read_text() and png.read_bytes()[:4] == b"\x89PNG"
    missing = subprocess.run([sys.executable, "-m", "serve", "summary", str(tmp_path / "nope.jsonl")],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "run file not found" in missing.stderr
