"""``python -m serve demo``: a Gradio web demo over a :class:`~serve.predictor.Predictor`.

Layout: a model picker (runs and exports found under the runs folder, or ``--model``) with the model's facts;
controls shared by every tab: thresholds (calibrated per-class thresholds, or one global slider), the tag
selection mode (thresholds, MCut, top-k) with its cap and floor, and caption rules (as in a rules file of
``serve tag --caption-rules``); an *Image* tab (upload / webcam / clipboard, examples from the built-in dataset
with their true labels) showing every class's score against its own threshold and the caption as written; a
*Batch* tab (several files -> table, CSV, JSONL and a zip of caption files, scored by the tagging pipeline's loop,
:func:`serve.scoring.score_items`, with its selection of tags, :class:`serve.outputs.Selection`); an *API* tab.

The model runs once per image: its scores are kept in ``gr.State`` and moving a control only re-filters them
(no queue, no model call). ``/predict`` returns every class score as JSON, with the thresholds
used and the tags. Images are decoded by the same code as ``python -m serve tag`` (the original uploaded file,
EXIF orientation applied, alpha composited onto white), so the demo, the tagger and evaluation agree.

The catalogue of models and examples lives in :mod:`serve.demo_catalog`, the pure helpers (thresholds, result
document, score HTML, batch downloads) in :mod:`serve.demo_results`; this module is the Gradio app around them.
Importing this module is cheap: gradio and torch are imported inside the functions that need them, so
``python -m serve --help`` and usage errors answer at once.
"""

from __future__ import annotations

import atexit
import html
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve import DEFAULT_MAX_PIXELS
from serve.demo_catalog import ExampleSet, find_examples, find_models
from serve.demo_results import (
    DEMO_MODES,
    EMPTY_HTML,
    BatchRow,
    batch_outputs,
    file_bytes,
    payload_image,
    result_document,
    scores_html,
    tag_choice,
)

if TYPE_CHECKING:
    import gradio as gr

    from models.checkpoint import ModelMeta
    from serve.outputs import Selection
    from serve.predictor import Prediction, Predictor

# find_models / find_examples (serve.demo_catalog) are part of this module's API: ``python -m serve demo`` uses them
__all__ = ["ExampleSet", "ModelStore", "build_demo", "find_examples", "find_models", "launch_demo", "parse_size"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_FILE_SIZE = "20mb"
DEFAULT_QUEUE_SIZE = 32
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_BATCH_FILES = 64
DEFAULT_MAX_LOADED = 2


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
    if info["boostlu"] is not None:
        parts.append(f"BoostLU {info['boostlu']:g}")
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
result["tags"]        # the classes chosen (by default: at or above their threshold), highest score first
result["caption"]     # the tags as a sidecar holds them (caption rules applied)
result = client.predict(handle_file("cat.jpg"), True, 0.5, "{model}", "mcut", 5, 10, 0.1, "first sks\nspaces",
                        api_name="/predict")   # MCut, at most 10 tags scoring >= 0.1, a trigger word first
```

Parameters of `/predict`: image; use the model's calibrated per-class thresholds (bool); global threshold
(0..1, used when the previous one is false); model (one of the picker's entries); then, optional: selection
mode (thresholds, mcut, top-k), K (top-k), at most N tags (0: no cap), minimum score, caption rules (the text
of a `serve tag --caption-rules` file). `/predict_batch` takes a list of images and the same options, and
returns the table and the CSV, JSONL and captions zip files.
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
    from serve.predictor import ImageError, ImagePreprocessor, ModelLoadError, Prediction
    from serve.scoring import score_items
    from serve.sources import Item

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

    def choice_for(
        meta: ModelMeta, use_calibrated: bool, threshold: float, *tagging: Any
    ) -> tuple[Selection, str, str]:
        """The pipeline's selection for the controls (:func:`serve.demo_results.tag_choice`); ``gr.Error``."""
        try:
            return tag_choice(meta, bool(use_calibrated), float(threshold), *tagging)
        except (TypeError, ValueError) as exc:
            raise gr.Error(str(exc), title="Bad option", print_exception=False) from None

    # ---- single image
    def score_one(payload: Any, model: str) -> dict:
        """Run the model on one image: the state kept for re-filtering; ``gr.Error`` if unreadable."""
        predictor = predictor_for(model)
        try:
            image, name = payload_image(payload)
            start = time.perf_counter()
            probs = predictor.scores([image])[0]
            seconds = time.perf_counter() - start
        except ImageError as exc:
            message = f"Cannot read {_payload_name(payload)}: {exc.reason}"
            raise gr.Error(message, title="Bad image", print_exception=False) from None
        except (ValueError, TypeError) as exc:
            raise gr.Error(f"Cannot read the image: {exc}", title="Bad image", print_exception=False) from None
        truth = examples.truth_for(file_bytes(image)) if examples.labels else None
        return {"model": model, "name": name, "probs": [float(p) for p in probs], "truth": truth, "seconds": seconds}

    def document(state: dict, use_calibrated: bool, threshold: float, *tagging: Any) -> tuple[dict, Prediction, str]:
        """(API document, prediction, description) of kept scores under the controls; ``gr.Error`` on a bad one."""
        meta = store.meta(state["model"])
        select, mode, description = choice_for(meta, use_calibrated, threshold, *tagging)
        probs = np.asarray(state["probs"])
        prediction = Prediction.from_probabilities(list(meta.classes), probs, select.thresholds, select.mode)
        return result_document(prediction, state["model"], mode, state["seconds"], select), prediction, description

    def predict(payload: Any, use_calibrated: bool, threshold: float, model: str, *tagging: Any) -> tuple[dict, dict]:
        """The ``/predict`` endpoint: every class score, the thresholds used, the tags and the caption, as JSON
        (the state, which API clients do not see, lets the same session call ``/refilter``)."""
        if payload is None:
            raise gr.Error("No image given.")
        predictor_for(model)
        choice_for(store.meta(model), use_calibrated, threshold, *tagging)  # a bad option fails before the model runs
        state = score_one(payload, model)
        return document(state, use_calibrated, threshold, *tagging)[0], state

    def predict_ui(payload: Any, model: str) -> dict | None:
        """The page's own call: the model's scores for the page to show (``render``); an unreadable image is
        reported in the result panel."""
        if payload is None:
            return None
        try:
            return score_one(payload, model)
        except gr.Error as exc:
            gr.Warning(exc.message)
            return {"error": exc.message}

    def error_html(message: str) -> str:
        return f'<div class="spml-res" style="color:rgb(200,60,60)">{html.escape(message)}</div>'

    def render(state: dict | None, use_calibrated: bool, threshold: float, *tagging: Any) -> tuple[Any, str]:
        """Re-filter the kept scores with the current controls (no model call): (API document, HTML). A bad
        control value (e.g. a caption rule being typed) is shown in the panel."""
        if not state:
            return None, EMPTY_HTML
        if "error" in state:
            return None, error_html(state["error"])
        try:
            doc, prediction, description = document(state, use_calibrated, threshold, *tagging)
        except gr.Error as exc:
            return None, error_html(exc.message)
        caption = f"{state['name']} · {state['model']} · {1000 * state['seconds']:.0f} ms"
        written = doc["caption"] if doc["caption"] != ", ".join(prediction.tags) else None
        body = scores_html(prediction, description=description, truth=state["truth"], caption=caption, written=written)
        return doc, body

    # ---- batch
    def predict_batch(
        payloads: Any,
        use_calibrated: bool,
        threshold: float,
        model: str,
        mode: str = "thresholds",
        k: float | None = None,
        max_tags: float | None = None,
        min_score: float | None = None,
        rules: str = "",
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio's way to ask for a progress tracker
    ) -> tuple[Any, Any, Any, Any, Any]:
        """Score several images: table, CSV file, JSONL file, captions zip (+ state kept for re-filtering)."""
        tagging = (mode, k, max_tags, min_score, rules)
        items = payloads if isinstance(payloads, list) else ([payloads] if payloads else [])
        if not items:
            raise gr.Error("Add one or more image files first.")
        if len(items) > max_batch_files:
            gr.Warning(f"{len(items)} files given; only the first {max_batch_files} are tagged.")
            items = items[:max_batch_files]
        predictor = predictor_for(model)
        select, _, _ = choice_for(predictor.meta, use_calibrated, threshold, *tagging)
        rows: list[BatchRow] = []
        work: list[Item] = []  # the tagging pipeline's items: key = the row's index
        for i, item in enumerate(items):
            try:
                image, name = payload_image(item)
                rows.append(BatchRow(name, None))
                work.append(Item(str(i), image) if isinstance(image, str) else Item(str(i), data=image))
            except ValueError as exc:
                rows.append(BatchRow(_payload_name(item), None, str(exc)))
        preprocess = ImagePreprocessor(predictor.transform, predictor.max_pixels)
        done = 0
        for batch in score_items(work, predictor.scores_from_inputs, preprocess, DEFAULT_BATCH_SIZE):
            for result in batch:
                row = rows[int(result.key)]
                if result.scores is not None:
                    row.probs = [float(p) for p in result.scores]
                else:
                    row.error = result.error or "unknown error"
            done += len(batch)
            progress((done, len(work)), desc="tagging", unit="images")
        folder = Path(tempfile.mkdtemp(prefix="batch-", dir=work_root))
        frame, *files = batch_outputs(rows, select, folder)
        state = {"model": model, "rows": rows, "folder": str(folder)}
        return frame, *map(str, files), state

    def refilter_batch(state: dict | None, use_calibrated: bool, threshold: float, *tagging: Any) -> tuple[Any, ...]:
        """Re-filter the batch's kept scores with the current controls (nothing changes while one is invalid)."""
        if not state:
            return (gr.skip(),) * 4
        try:
            select, _, _ = choice_for(store.meta(state["model"]), use_calibrated, threshold, *tagging)
        except gr.Error:
            return (gr.skip(),) * 4
        frame, *files = batch_outputs(state["rows"], select, Path(state["folder"]))
        return frame, *map(str, files)

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
        with gr.Row():
            mode_box = gr.Dropdown(
                list(DEMO_MODES),
                value="thresholds",
                label="Tag selection",
                info="thresholds: per class (above); mcut: above the largest gap between scores; top-k: the K best",
                elem_id="spml-mode",
            )
            k_box = gr.Number(5, precision=0, minimum=1, label="K (top-k)", elem_id="spml-k")
            max_tags_box = gr.Number(0, precision=0, minimum=0, label="At most N tags (0: no cap)", elem_id="spml-max")
            min_score_box = gr.Slider(
                0.0, 1.0, value=0.0, step=0.01, label="Minimum score", info="a floor, with any mode",
                elem_id="spml-min-score",
            )
        rules_box = gr.Textbox(
            "",
            lines=2,
            label="Caption rules",
            placeholder="first sks\nexclude-re ^rating_\nreplace cat=kitty\nspaces",
            info="one per line, as in `serve tag --caption-rules FILE`: exclude NAME, exclude-re REGEX, "
            "replace OLD=NEW, first WORD, spaces, escape, weights",
            elem_id="spml-rules",
        )
        tagging = [mode_box, k_box, max_tags_box, min_score_box, rules_box]
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
                    zip_file = gr.DownloadButton("Download captions (zip)", value=None, elem_id="spml-zip")
            with gr.Tab("API"):
                gr.Markdown(API_HELP.format(model=default_model))
        # /predict is its own event (on a button that is never shown) so that the page's calls can report a bad
        # image in the result panel while API callers get the error itself
        api_button = gr.Button(visible=False)
        api_result = gr.JSON(visible=False)
        clear_button.add([image, result_json])

        inputs = [use_calibrated, threshold]
        run = {"concurrency_id": "model", "preprocess": False}
        show = {"fn": render, "inputs": [single_state, *inputs, *tagging], "outputs": [result_json, result_html]}
        for trigger in (tag_button.click, image.change):
            trigger(predict_ui, [image, model_box], [single_state], api_visibility="private", **run).then(
                **show, api_visibility="private", queue=False
            )
        api_button.click(
            predict,
            [image, *inputs, model_box, *tagging],
            [api_result, single_state],
            api_name="predict",
            api_description="Score one image: every class's sigmoid score, the thresholds used, the tags and the "
            "caption.",
            **run,
        )
        batch_button.click(
            predict_batch,
            [files, *inputs, model_box, *tagging],
            [batch_table, csv_file, jsonl_file, zip_file, batch_state],
            api_name="predict_batch",
            api_description="Score several images: a table, and the same results as CSV and JSONL files and a zip "
            "of caption files.",
            **run,
        )
        for control in (*inputs, *tagging):
            control.change(
                **show,
                api_name="refilter" if control is threshold else None,
                api_visibility="undocumented" if control is threshold else "private",
                queue=False,
                trigger_mode="always_last",
            )
            control.change(
                refilter_batch,
                [batch_state, *inputs, *tagging],
                [batch_table, csv_file, jsonl_file, zip_file],
                api_visibility="private",
                queue=False,
                trigger_mode="always_last",
            )
        # moving the slider means "use this global value": untick the calibrated box (which then re-filters)
        threshold.input(lambda: False, None, [use_calibrated], api_visibility="private", queue=False)
        model_box.change(
            change_model, [model_box], [model_info, use_calibrated], api_visibility="private", concurrency_id="model"
        ).then(predict_ui, [image, model_box], [single_state], api_visibility="private", **run).then(
            **show, api_visibility="private", queue=False
        )
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
