"""``python -m serve demo``: a Gradio web demo over a :class:`~serve.predictor.Predictor`.

Layout: a model picker (runs and exports found under the runs folder, or ``--model``) with the model's facts;
threshold controls shared by every tab (calibrated per-class thresholds, or one global slider); an *Image* tab
(upload / webcam / clipboard, examples from the built-in dataset with their true labels) showing every class's
score against its own threshold; a *Batch* tab (several files -> table, CSV and JSONL downloads); an *API* tab.

The model runs once per image: its scores are kept in ``gr.State`` and moving a threshold control only
re-filters them (no queue, no model call). ``/predict`` returns every class score as JSON, with the thresholds
used and the tags. Images are decoded by the same code as ``python -m serve tag`` (the original uploaded file,
EXIF orientation applied, alpha composited onto white), so the demo, the tagger and evaluation agree.

Importing this module is cheap: gradio and torch are imported inside the functions that need them, so
``python -m serve --help`` and usage errors answer at once.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import csv
import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gradio as gr

    from models.checkpoint import ModelMeta
    from serve.predictor import Prediction, Predictor

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_FILE_SIZE = "20mb"
DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_QUEUE_SIZE = 32
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_BATCH_FILES = 64
DEFAULT_EXAMPLES = 8
DEFAULT_MAX_LOADED = 2
NEAR_MISS = 0.1  # below the threshold by at most this much: shown as a near miss
SEARCH_DEPTH = 3  # how deep under the runs folder to look for run folders (runs/compare/<run>/ is depth 2)


_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_size(text: str | int) -> int:
    """``"20mb"`` / ``"500kb"`` / ``"1.5gb"`` / ``"1000"`` (bytes) -> bytes, with 1kb = 1024 b (``ValueError``)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?b)?", str(text).strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"expected a size such as 20mb, 500kb or 1gb, got {text!r}")
    return max(1, int(float(match.group(1)) * _UNITS[match.group(2) or ""]))


# --------------------------------------------------------------------------------------------------------
# Finding models and example images (no gradio, no torch)


def find_models(runs_dir: str | Path, max_depth: int = SEARCH_DEPTH) -> dict[str, Path]:
    """Model files under ``runs_dir``: every run folder's ``best.pt`` and exports (``export/*.onnx`` and any other
    registered suffix, e.g. ``.engine``), keyed by their path relative to ``runs_dir``; newest run first."""
    from serve.predictor import models_in_folder

    root = Path(runs_dir)
    if not root.is_dir():
        return {}
    folders: list[tuple[float, Path]] = []
    for current, dirs, _files in os.walk(root):
        here = Path(current)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "export") if depth < max_depth else []
        models = models_in_folder(here)
        if models:
            folders.append((max(p.stat().st_mtime for p in models), here))
    found: dict[str, Path] = {}
    for _mtime, folder in sorted(folders, key=lambda item: (-item[0], str(item[1]))):
        for path in models_in_folder(folder):
            found[path.relative_to(root).as_posix()] = path
    return found


@dataclass
class ExampleSet:
    """Example images for the demo, the true labels of those that have them (by file content), and a note."""

    images: list[Path] = field(default_factory=list)
    labels: dict[str, list[str]] = field(default_factory=dict)  # sha1 of the file -> true labels
    note: str = ""

    def truth_for(self, data: bytes) -> list[str] | None:
        """The true labels of an example image given its bytes (``None`` for any other image)."""
        if not self.labels:
            return None
        return self.labels.get(hashlib.sha1(data).hexdigest())


def _read_labels_csv(folder: Path) -> list[tuple[Path, list[str], str]]:
    """``(image path, labels, split)`` rows of a dataset folder's ``labels.csv`` (the package's CSV format)."""
    rows = []
    with open(folder / "labels.csv", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            labels = [x for x in (row.get("labels") or "").split(";") if x]
            rows.append((folder / row["image"], labels, (row.get("split") or "train").strip()))
    return rows


def _pick_covering(rows: list[tuple[Path, list[str], str]], limit: int) -> list[tuple[Path, list[str]]]:
    """Up to ``limit`` rows chosen greedily so that together they show as many different classes as possible."""
    chosen: list[tuple[Path, list[str]]] = []
    seen: set[str] = set()
    pool = [(p, labels) for p, labels, _ in rows if p.is_file()]
    while pool and len(chosen) < limit:
        best = max(range(len(pool)), key=lambda i: (len(set(pool[i][1]) - seen), -i))
        path, labels = pool.pop(best)
        chosen.append((path, labels))
        seen.update(labels)
    return chosen


def _builtin_folders(meta: ModelMeta | None) -> list[Path]:
    """Generated built-in dataset folders in the cache, the model's own dataset first; nothing is generated."""
    from train.data.builtin import GENERATOR_VERSION, cache_root
    from train.data.registry import parse_builtin_argument

    parent = cache_root() / "builtin"
    folders = []
    source = str((meta.data or {}).get("source", "")) if meta is not None else ""
    if source.startswith("builtin"):
        try:
            preset, seed = parse_builtin_argument(source.partition(":")[2])
            folders.append(parent / f"{preset}-seed{seed}-v{GENERATOR_VERSION}")
        except ValueError:
            pass
    if parent.is_dir():
        folders += sorted(parent.glob(f"*-v{GENERATOR_VERSION}"), key=lambda p: (not p.name.startswith("default"), p))
    classes = list(meta.classes) if meta is not None else None
    usable = []
    for folder in dict.fromkeys(folders):
        if not (folder / ".complete").is_file():
            continue
        if classes is not None and (folder / "classes.txt").read_text().split() != classes:
            continue
        usable.append(folder)
    return usable


def find_examples(
    meta: ModelMeta | None, folder: str | Path | None = None, limit: int = DEFAULT_EXAMPLES
) -> ExampleSet:
    """Example images: the first ``limit`` images of ``folder`` if given (with true labels when it holds a
    ``labels.csv``), else test images of the model's built-in dataset if it is already generated in the cache
    (``$SPML_CACHE``), chosen to cover many classes. Never generates data; the note says what was found."""
    from serve.sources import find_images

    if limit <= 0:
        return ExampleSet(note="examples disabled")
    if folder is not None:
        folder = Path(folder)
        if (folder / "labels.csv").is_file():
            rows = _read_labels_csv(folder)
            picked = _pick_covering([r for r in rows if r[2] == "test"] or rows, limit)
        else:
            picked = [(p, []) for p in find_images(folder)[:limit]]
        return _example_set(picked, f"from {folder}")
    for dataset in _builtin_folders(meta):
        rows = [r for r in _read_labels_csv(dataset) if r[2] == "test"][: 40 * limit]
        picked = _pick_covering(rows, limit)
        if picked:
            return _example_set(picked, f"test images of the built-in dataset ({dataset.name})")
    from train.data.builtin import cache_root

    return ExampleSet(
        note=f"no example images: the built-in dataset is not generated under {cache_root()} "
        "(`python -m train.data.builtin --preset default` makes it in about a minute), or pass --examples DIR"
    )


def _example_set(picked: list[tuple[Path, list[str]]], where: str) -> ExampleSet:
    labels = {hashlib.sha1(p.read_bytes()).hexdigest(): names for p, names in picked if names}
    note = f"{len(picked)} {where}" + ("; their true labels are shown with the scores" if labels else "")
    return ExampleSet(images=[p for p, _ in picked], labels=labels, note=note)


# --------------------------------------------------------------------------------------------------------
# Models, loaded lazily and kept in a small LRU


class ModelStore:
    """The models the picker offers (key -> file), loaded on first use; at most ``max_loaded`` kept in memory."""

    def __init__(
        self,
        choices: dict[str, Path],
        *,
        backend: str | None = None,
        device: str | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        max_loaded: int = DEFAULT_MAX_LOADED,
        loaded: dict[str, Predictor] | None = None,
    ) -> None:
        self.choices = dict(choices)
        self.backend = backend
        self.device = device
        self.max_pixels = max_pixels
        self.max_loaded = max(1, max_loaded)
        self._loaded: OrderedDict[str, Predictor] = OrderedDict()
        self._metas: dict[str, ModelMeta] = {}
        self._lock = threading.Lock()
        for key, predictor in (loaded or {}).items():
            self.choices.setdefault(key, predictor.path or Path(key))
            self._loaded[key] = predictor
            self._metas[key] = predictor.meta

    def get(self, key: str) -> Predictor:
        """The predictor of ``key`` (loading it if needed); ``KeyError`` for keys the picker does not offer."""
        from serve.predictor import Predictor

        if key not in self.choices:
            raise KeyError(f"unknown model {key!r}")
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            predictor = Predictor.load(self.choices[key], self.backend, self.device, max_pixels=self.max_pixels)
            self._loaded[key] = predictor
            self._metas[key] = predictor.meta
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
            return predictor

    def meta(self, key: str) -> ModelMeta:
        """The metadata of a model that has been loaded at least once (kept after it is unloaded)."""
        if key not in self._metas:
            return self.get(key).meta
        return self._metas[key]


# --------------------------------------------------------------------------------------------------------
# Pure helpers: thresholds, results, HTML, batch files


def threshold_choice(meta: ModelMeta, use_calibrated: bool, threshold: float) -> tuple[Any, str, str]:
    """``(thresholds (C,), mode, description)`` for the demo's controls, via
    :func:`serve.thresholds.resolve_thresholds`. ``mode`` is ``calibrated``, ``default`` or ``global``."""
    from serve import DEFAULT_THRESHOLD
    from serve.thresholds import resolve_thresholds

    if use_calibrated:
        if meta.thresholds is not None:
            return resolve_thresholds(meta), "calibrated", "calibrated per-class thresholds"
        return (
            resolve_thresholds(meta),
            "default",
            f"{DEFAULT_THRESHOLD} for every class (this model has no calibrated thresholds)",
        )
    value = float(threshold)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    return resolve_thresholds(meta, value), "global", f"global threshold {value:.2f}"


def result_document(prediction: Prediction, model: str, mode: str, seconds: float | None = None) -> dict[str, Any]:
    """What ``/predict`` returns: every class score (model order, full precision), thresholds used, tags."""
    doc: dict[str, Any] = {"model": model, "threshold_mode": mode, **prediction.to_dict()}
    if seconds is not None:
        doc["seconds"] = round(seconds, 4)
    return doc


_CSS = """
<style>
.spml-res{font-size:14px;line-height:1.35}
.spml-res .spml-sum{margin:0 0 6px 0}
.spml-res .spml-tag{display:inline-block;padding:1px 8px;margin:2px 4px 2px 0;border-radius:10px;
  background:rgba(34,160,80,.18);border:1px solid rgba(34,160,80,.55)}
.spml-res .spml-sub{opacity:.75;font-size:12px;margin-bottom:6px}
.spml-res table{border-collapse:collapse;width:100%}
.spml-res td,.spml-res th{padding:3px 8px;text-align:left;white-space:nowrap}
.spml-res th{font-weight:600;border-bottom:1px solid rgba(128,128,128,.5)}
.spml-res td{border-bottom:1px solid rgba(128,128,128,.15)}
.spml-res td.num{text-align:right;font-variant-numeric:tabular-nums}
.spml-res .bar{position:relative;width:140px;height:12px;background:rgba(128,128,128,.18);border-radius:3px}
.spml-res .fill{position:absolute;left:0;top:0;bottom:0;border-radius:3px;background:rgba(128,128,128,.55)}
.spml-res tr.above .fill{background:rgba(34,160,80,.85)}
.spml-res tr.near .fill{background:rgba(230,150,20,.85)}
.spml-res .mark{position:absolute;top:-3px;bottom:-3px;width:2px;background:currentColor}
.spml-res tr.above td.name{font-weight:600}
.spml-res .truth{color:rgb(40,120,220)}
.spml-res .miss{color:rgb(200,60,60)}
</style>
"""


def scores_html(
    prediction: Prediction,
    *,
    description: str,
    truth: Sequence[str] | None = None,
    caption: str = "",
) -> str:
    """Every class as a row: a bar for the score with its own threshold marked, score, threshold, margin and
    status (tag / near miss), highest score first; true labels marked when known."""
    scores, thresholds = prediction.scores, prediction.thresholds
    truth_set = set(truth or [])
    tags = prediction.tags
    esc = html.escape
    if tags:
        chips = "".join(f'<span class="spml-tag">{esc(c)} {scores[c]:.3f}</span>' for c in tags)
        summary = f"<b>{len(tags)} tag{'s' if len(tags) != 1 else ''}:</b> {chips}"
    else:
        top = max(scores, key=lambda c: scores[c] - thresholds[c])
        summary = (
            f"<b>No tag:</b> no class reaches its threshold (closest: {esc(top)} {scores[top]:.3f} "
            f"vs {thresholds[top]:.3f})"
        )
    sub = [esc(description)]
    if caption:
        sub.insert(0, esc(caption))
    if truth is not None:
        missed = [c for c in truth if c not in tags]
        extra = [c for c in tags if c not in truth_set]
        sub.append(
            f'<span class="truth">true labels: {esc(", ".join(truth) or "none")}</span>'
            + (f' · <span class="miss">missed: {esc(", ".join(missed))}</span>' if missed else "")
            + (f' · <span class="miss">not true: {esc(", ".join(extra))}</span>' if extra else "")
        )
    header = "<tr><th>class</th><th>score (| = threshold)</th><th>score</th><th>threshold</th><th>margin</th>"
    header += "<th>status</th>" + ("<th>true</th>" if truth is not None else "") + "</tr>"
    rows = []
    for name in sorted(scores, key=lambda c: (-scores[c], c)):
        s, t = scores[name], thresholds[name]
        above = name in tags
        state = "above" if above else ("near" if t - s <= NEAR_MISS else "below")
        status = {"above": "tag", "near": "near miss", "below": ""}[state]
        true_cell = f"<td>{'✓' if name in truth_set else ''}</td>" if truth is not None else ""
        rows.append(
            f'<tr class="{state}" data-class="{esc(name)}"><td class="name">{esc(name)}</td>'
            f'<td><div class="bar"><div class="fill" style="width:{100 * s:.1f}%"></div>'
            f'<div class="mark" style="left:calc({100 * t:.1f}% - 1px)"></div></div></td>'
            f'<td class="num">{s:.3f}</td><td class="num">{t:.3f}</td><td class="num">{s - t:+.3f}</td>'
            f"<td>{status}</td>{true_cell}</tr>"
        )
    return (
        f'{_CSS}<div class="spml-res"><div class="spml-sum">{summary}</div>'
        f'<div class="spml-sub">{" · ".join(sub)}</div>'
        f"<table>{header}{''.join(rows)}</table></div>"
    )


EMPTY_HTML = (
    '<div class="spml-res" style="opacity:.7">Upload an image, take a webcam shot, paste one, or pick an example.</div>'
)


@dataclass
class BatchRow:
    """One file of a batch: its display name and scores ``(C,)``, or the reason it could not be read."""

    name: str
    probs: list[float] | None
    error: str = ""


def batch_outputs(
    rows: Sequence[BatchRow], classes: Sequence[str], thresholds: Any, folder: Path
) -> tuple[Any, Path, Path]:
    """Table (pandas DataFrame: file, tags, error, one column per class) and the CSV / JSONL files written into
    ``folder``; the JSONL lines have the format of ``python -m serve tag`` (``{"path", "scores", "tags"}``),
    unreadable files ``{"path", "error"}``."""
    import numpy as np
    import pandas as pd

    from serve.records import tag_record

    classes = list(classes)
    table, csv_rows, lines = [], [], []
    for row in rows:
        if row.probs is None:
            table.append([row.name, "", row.error, *([None] * len(classes))])
            csv_rows.append([row.name, "", row.error, *([""] * len(classes))])
            lines.append({"path": row.name, "error": row.error})
            continue
        rec = tag_record(row.name, np.asarray(row.probs, dtype=np.float64), classes, np.asarray(thresholds))
        table.append([row.name, ", ".join(rec["tags"]), "", *(round(rec["scores"][c], 3) for c in classes)])
        csv_rows.append([row.name, ";".join(rec["tags"]), "", *(f"{rec['scores'][c]:.6f}" for c in classes)])
        lines.append(rec)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path = folder / "tags.csv", folder / "tags.jsonl"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["file", "tags", "error", *classes])
        writer.writerows(csv_rows)
    jsonl_path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    frame = pd.DataFrame(table, columns=["file", "tags", "error", *classes])
    return frame, csv_path, jsonl_path


def _payload_image(payload: Any) -> tuple[str | bytes, str]:
    """A gradio file payload (dict with ``path`` / ``url`` / ``orig_name``) or a path -> (image input, name)."""
    if isinstance(payload, (str, Path)):
        return str(payload), Path(payload).name
    if isinstance(payload, dict):
        path = payload.get("path")
        name = payload.get("orig_name") or (Path(path).name if path else "image")
        if path:
            return str(path), str(name)
        url = str(payload.get("url") or "")
        if url.startswith("data:") and "," in url:
            try:
                return base64.b64decode(url.split(",", 1)[1], validate=True), str(name)
            except (binascii.Error, ValueError):
                pass
    raise ValueError("no readable image in the request")


def _file_bytes(image: str | bytes) -> bytes:
    if isinstance(image, bytes):
        return image
    with open(image, "rb") as fh:
        return fh.read()


# --------------------------------------------------------------------------------------------------------
# The Gradio app


def model_markdown(key: str, predictor: Predictor) -> str:
    """One-paragraph description of a loaded model for the header."""
    info = predictor.describe()
    metrics = predictor.meta.metrics or {}
    val = metrics.get("val") if isinstance(metrics.get("val"), dict) else {}
    parts = [
        f"**{key}**",
        info["device"],
        f"{info['arch']} at {info['image_size']} px",
        *([str(precision)] if (precision := getattr(predictor.meta, "precision", "fp32")) != "fp32" else []),
        f"{info['classes']} classes",
    ]
    if info["method"]:
        parts.append(f"method {info['method']}")
    if isinstance(val, dict) and isinstance(val.get("mAP"), (int, float)):
        parts.append(f"val mAP {val['mAP']:.1f}")
    if info["dataset"]:
        parts.append(f"data {info['dataset']}")
    parts.append("calibrated per-class thresholds" if info["calibrated_thresholds"] else "no calibrated thresholds")
    return " · ".join(parts)


API_HELP = """\
Every result is also an HTTP API (see *Use via API* at the bottom of the page). From Python:

```python
from gradio_client import Client, handle_file
client = Client("http://127.0.0.1:7860/")  # this page's address
result = client.predict(handle_file("cat.jpg"), True, 0.5, "{model}", api_name="/predict")
result["scores"]      # every class -> probability (sigmoid), full precision
result["thresholds"]  # the threshold used for each class
result["tags"]        # classes at or above their threshold, highest score first
```

Parameters of `/predict`: image; use the model's calibrated per-class thresholds (bool); global threshold
(0..1, used when the previous one is false); model (one of the picker's entries).
`/predict_batch` takes a list of images and returns the table and the CSV and JSONL files.
"""


def build_demo(
    store: ModelStore,
    default_model: str,
    examples: ExampleSet | None = None,
    *,
    max_batch_files: int = DEFAULT_MAX_BATCH_FILES,
    title: str = "spml multi-label tagger",
) -> gr.Blocks:
    """Build the Blocks app (not launched) over ``store``, showing ``default_model`` first."""
    import gradio as gr
    import numpy as np

    from serve import DEFAULT_BATCH_SIZE, DEFAULT_THRESHOLD
    from serve.predictor import ImageError, ModelLoadError, Prediction

    if default_model not in store.choices:
        raise ValueError(f"default model {default_model!r} is not one of the store's choices")
    examples = examples or ExampleSet()
    default = store.get(default_model)
    work_root = Path(tempfile.mkdtemp(prefix="spml-demo-"))
    atexit.register(shutil.rmtree, work_root, True)

    def predictor_for(key: str) -> Predictor:
        try:
            return store.get(key)
        except KeyError:
            raise gr.Error(f"unknown model {key!r}; choose one of the picker's entries") from None
        except ModelLoadError as exc:
            raise gr.Error(f"cannot load model {key}: {exc}") from None

    def thresholds_for(meta: ModelMeta, use_calibrated: bool, threshold: float) -> tuple[Any, str, str]:
        try:
            return threshold_choice(meta, bool(use_calibrated), float(threshold))
        except (TypeError, ValueError) as exc:
            raise gr.Error(str(exc)) from None

    # ---- single image
    def score_one(payload: Any, use_calibrated: bool, threshold: float, model: str) -> tuple[dict, dict]:
        """Run the model on one image: (API document, state kept for re-filtering); ``gr.Error`` if unreadable."""
        predictor = predictor_for(model)
        thresholds, mode, _ = thresholds_for(predictor.meta, use_calibrated, threshold)
        try:
            image, name = _payload_image(payload)
            start = time.perf_counter()
            probs = predictor.scores([image])[0]
            seconds = time.perf_counter() - start
        except ImageError as exc:
            message = f"Cannot read {_payload_name(payload)}: {exc.reason}"
            raise gr.Error(message, title="Bad image", print_exception=False) from None
        except (ValueError, TypeError) as exc:
            raise gr.Error(f"Cannot read the image: {exc}", title="Bad image", print_exception=False) from None
        truth = examples.truth_for(_file_bytes(image)) if examples.labels else None
        prediction = Prediction.from_probabilities(predictor.classes, probs, thresholds)
        state = {"model": model, "name": name, "probs": [float(p) for p in probs], "truth": truth, "seconds": seconds}
        return result_document(prediction, model, mode, seconds), state

    def predict(payload: Any, use_calibrated: bool, threshold: float, model: str) -> tuple[dict, dict]:
        """The ``/predict`` endpoint: every class score, the thresholds used and the tags, as JSON (the state,
        which API clients do not see, lets the same session call ``/refilter``)."""
        if payload is None:
            raise gr.Error("No image given.")
        return score_one(payload, use_calibrated, threshold, model)

    def predict_ui(payload: Any, use_calibrated: bool, threshold: float, model: str) -> tuple[Any, Any]:
        """The page's own call: like ``predict`` but an unreadable image is reported in the result panel."""
        if payload is None:
            return None, None
        try:
            return score_one(payload, use_calibrated, threshold, model)
        except gr.Error as exc:
            gr.Warning(exc.message)
            return None, {"error": exc.message}

    def render(state: dict | None, use_calibrated: bool, threshold: float) -> tuple[Any, str]:
        """Re-filter the kept scores with the current controls (no model call): (API document, HTML)."""
        if not state:
            return None, EMPTY_HTML
        if "error" in state:
            return None, f'<div class="spml-res" style="color:rgb(200,60,60)">{html.escape(state["error"])}</div>'
        meta = store.meta(state["model"])
        thresholds, mode, description = thresholds_for(meta, use_calibrated, threshold)
        prediction = Prediction.from_probabilities(list(meta.classes), np.asarray(state["probs"]), thresholds)
        caption = f"{state['name']} · {state['model']} · {1000 * state['seconds']:.0f} ms"
        body = scores_html(prediction, description=description, truth=state["truth"], caption=caption)
        return result_document(prediction, state["model"], mode, state["seconds"]), body

    # ---- batch
    def predict_batch(
        payloads: Any,
        use_calibrated: bool,
        threshold: float,
        model: str,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio's way to ask for a progress tracker
    ) -> tuple[Any, Any, Any, Any]:
        """Score several images: table, CSV file, JSONL file (+ state kept for re-filtering)."""
        items = payloads if isinstance(payloads, list) else ([payloads] if payloads else [])
        if not items:
            raise gr.Error("Add one or more image files first.")
        if len(items) > max_batch_files:
            gr.Warning(f"{len(items)} files given; only the first {max_batch_files} are tagged.")
            items = items[:max_batch_files]
        predictor = predictor_for(model)
        thresholds, _, _ = thresholds_for(predictor.meta, use_calibrated, threshold)
        rows: list[BatchRow] = []
        pending: list[tuple[int, np.ndarray]] = []

        def flush() -> None:
            probs = predictor.scores_from_inputs(np.stack([x for _, x in pending]))
            for (index, _), row in zip(pending, probs, strict=True):
                rows[index].probs = [float(p) for p in row]
            pending.clear()

        for i, item in enumerate(items):
            progress((i, len(items)), desc="tagging", unit="images")
            name = _payload_name(item)
            rows.append(BatchRow(name, None))
            try:
                image, name = _payload_image(item)
                rows[-1].name = name
                pending.append((i, predictor.preprocess(image)))
            except ImageError as exc:
                rows[-1].error = exc.reason
            except (ValueError, TypeError) as exc:
                rows[-1].error = str(exc)
            if len(pending) == DEFAULT_BATCH_SIZE:
                flush()
        if pending:
            flush()
        folder = Path(tempfile.mkdtemp(prefix="batch-", dir=work_root))
        frame, csv_path, jsonl_path = batch_outputs(rows, predictor.classes, thresholds, folder)
        state = {"model": model, "rows": rows, "folder": str(folder)}
        return frame, str(csv_path), str(jsonl_path), state

    def refilter_batch(state: dict | None, use_calibrated: bool, threshold: float) -> tuple[Any, Any, Any]:
        if not state:
            return gr.skip(), gr.skip(), gr.skip()
        meta = store.meta(state["model"])
        thresholds, _, _ = thresholds_for(meta, use_calibrated, threshold)
        frame, csv_path, jsonl_path = batch_outputs(state["rows"], meta.classes, thresholds, Path(state["folder"]))
        return frame, str(csv_path), str(jsonl_path)

    # ---- model picker
    def calibrated_info(meta: ModelMeta) -> str:
        if meta.thresholds is not None:
            return "the model's own per-class thresholds"
        return f"this model has none: {DEFAULT_THRESHOLD} for every class"

    def change_model(model: str) -> tuple[str, Any]:
        predictor = predictor_for(model)
        return model_markdown(model, predictor), gr.update(info=calibrated_info(predictor.meta))

    with gr.Blocks(title=title, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"## {html.escape(title)}")
        with gr.Row(equal_height=True):
            model_box = gr.Dropdown(
                choices=list(store.choices), value=default_model, label="Model", scale=1, elem_id="spml-model"
            )
            model_info = gr.Markdown(model_markdown(default_model, default))
        with gr.Row():
            use_calibrated = gr.Checkbox(
                value=True,
                label="Use calibrated per-class thresholds",
                info=calibrated_info(default.meta),
                elem_id="spml-calibrated",
            )
            threshold = gr.Slider(
                0.0,
                1.0,
                value=DEFAULT_THRESHOLD,
                step=0.01,
                label="Global threshold",
                info="applies to every class when the box on the left is unticked; re-filters instantly",
                elem_id="spml-threshold",
            )
        single_state = gr.State(None)
        batch_state = gr.State(None)
        with gr.Tabs():
            with gr.Tab("Image"), gr.Row():
                with gr.Column(scale=2):
                    image = gr.Image(
                        type="filepath",
                        image_mode=None,
                        sources=["upload", "webcam", "clipboard"],
                        label="Image",
                        height=320,
                        elem_id="spml-image",
                    )
                    with gr.Row():
                        tag_button = gr.Button("Tag", variant="primary", elem_id="spml-tag")
                        clear_button = gr.ClearButton(value="Clear")
                    if examples.images:
                        gr.Examples(
                            examples=[[str(p)] for p in examples.images],
                            inputs=[image],
                            label="Examples",
                            cache_examples=False,
                            examples_per_page=len(examples.images),
                        )
                    gr.Markdown(f"<small>Examples: {html.escape(examples.note)}</small>")
                with gr.Column(scale=3):
                    result_html = gr.HTML(EMPTY_HTML, elem_id="spml-result", apply_default_css=False)
                    with gr.Accordion("JSON (what /predict returns)", open=False):
                        result_json = gr.JSON(label="result")
            with gr.Tab("Batch"):
                files = gr.File(file_count="multiple", file_types=["image"], label="Images", elem_id="spml-files")
                batch_button = gr.Button("Tag all", variant="primary")
                batch_table = gr.Dataframe(label="Scores (tags use the thresholds above)", interactive=False, wrap=True)
                with gr.Row():
                    csv_file = gr.DownloadButton("Download CSV", value=None)
                    jsonl_file = gr.DownloadButton("Download JSONL", value=None)
            with gr.Tab("API"):
                gr.Markdown(API_HELP.format(model=default_model))
        # /predict is its own event (on a button that is never shown) so that the page's calls can report a bad
        # image in the result panel while API callers get the error itself
        api_button = gr.Button(visible=False)
        api_result = gr.JSON(visible=False)
        clear_button.add([image, result_json])

        inputs = [use_calibrated, threshold]
        run = {"concurrency_id": "model", "preprocess": False}
        show = {"fn": render, "inputs": [single_state, *inputs], "outputs": [result_json, result_html]}
        for trigger in (tag_button.click, image.change):
            trigger(
                predict_ui, [image, *inputs, model_box], [result_json, single_state], api_visibility="private", **run
            ).then(**show, api_visibility="private", queue=False)
        api_button.click(
            predict,
            [image, *inputs, model_box],
            [api_result, single_state],
            api_name="predict",
            api_description="Score one image: every class's sigmoid score, the thresholds used and the tags.",
            **run,
        )
        batch_button.click(
            predict_batch,
            [files, *inputs, model_box],
            [batch_table, csv_file, jsonl_file, batch_state],
            api_name="predict_batch",
            api_description="Score several images: a table, and the same results as CSV and JSONL files.",
            **run,
        )
        for control in (use_calibrated, threshold):
            control.change(
                **show,
                api_name="refilter" if control is threshold else None,
                api_visibility="undocumented" if control is threshold else "private",
                queue=False,
                trigger_mode="always_last",
            )
            control.change(
                refilter_batch,
                [batch_state, *inputs],
                [batch_table, csv_file, jsonl_file],
                api_visibility="private",
                queue=False,
                trigger_mode="always_last",
            )
        # moving the slider means "use this global value": untick the calibrated box (which then re-filters)
        threshold.input(lambda: False, None, [use_calibrated], api_visibility="private", queue=False)
        model_box.change(
            change_model, [model_box], [model_info, use_calibrated], api_visibility="private", concurrency_id="model"
        ).then(
            predict_ui, [image, *inputs, model_box], [result_json, single_state], api_visibility="private", **run
        ).then(**show, api_visibility="private", queue=False)
        clear_button.click(lambda: (None, EMPTY_HTML), None, [single_state, result_html], api_visibility="private")
    return demo


def _payload_name(payload: Any) -> str:
    if isinstance(payload, dict):
        return str(payload.get("orig_name") or Path(str(payload.get("path") or "image")).name)
    return Path(str(payload)).name


def launch_demo(
    demo: gr.Blocks,
    *,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    share: bool = False,
    max_file_size: str | int | None = DEFAULT_MAX_FILE_SIZE,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    concurrency: int = DEFAULT_CONCURRENCY,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
) -> tuple[Any, str, str | None]:
    """Queue (``max_size=queue_size``, ``default_concurrency_limit=concurrency``) and launch on ``host:port``
    (loopback by default; ``port=None`` scans from 7860), uploads bounded by ``max_file_size``; returns
    ``(app, local_url, share_url)``."""
    demo.queue(max_size=queue_size, default_concurrency_limit=concurrency)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=parse_size(max_file_size) if max_file_size is not None else None,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        show_error=False,
        ssr_mode=False,
        footer_links=["api", "gradio"],
    )
