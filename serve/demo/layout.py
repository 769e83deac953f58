"""The demo page's parts, in order, and the events that connect them to :class:`serve.demo.handlers.DemoHandlers`."""

from __future__ import annotations

import contextlib
import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr

from serve import DEFAULT_THRESHOLD
from serve.demo.catalog import ExampleSet
from serve.demo.handlers import DemoHandlers, calibrated_info
from serve.demo.model_store import model_markdown
from serve.demo.results import EMPTY_HTML
from serve.outputs.selection_modes import MODES
from serve.predictor import Predictor

if TYPE_CHECKING:
    from serve.demo.review import ReviewQueue

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

#: The closed accordion that holds the model's controls when the page is made for answering (``--review``, ``--audit``).
SETTINGS_LABEL = "Model, thresholds, tag selection, caption rules"


@dataclass
class Controls:
    """The model picker and the controls every tab shares."""

    model_box: gr.Dropdown
    model_info: gr.Markdown
    use_calibrated: gr.Checkbox
    threshold: gr.Slider
    mode_box: gr.Dropdown
    k_box: gr.Number
    max_tags_box: gr.Number
    min_score_box: gr.Slider
    rules_box: gr.Textbox

    @property
    def thresholds(self) -> list[Any]:
        """The threshold controls, in the handlers' argument order."""
        return [self.use_calibrated, self.threshold]

    @property
    def tagging(self) -> list[Any]:
        """The tag selection and caption controls, in the handlers' argument order."""
        return [self.mode_box, self.k_box, self.max_tags_box, self.min_score_box, self.rules_box]


@dataclass
class ImageTab:
    """The *Image* tab: one image in, its scores and tags out."""

    image: gr.Image
    tag_button: gr.Button
    clear_button: gr.ClearButton
    result_html: gr.HTML
    result_json: gr.JSON


@dataclass
class BatchTab:
    """The *Batch* tab: several files in, a table and downloads out."""

    files: gr.File
    batch_button: gr.Button
    batch_table: gr.Dataframe
    csv_file: gr.DownloadButton
    jsonl_file: gr.DownloadButton
    zip_file: gr.DownloadButton

    @property
    def outputs(self) -> list[Any]:
        """The table and the three downloads, in the handlers' result order."""
        return [self.batch_table, self.csv_file, self.jsonl_file, self.zip_file]


@dataclass
class Page:
    """Every part of the page, with the state kept per session and the hidden ``/predict`` button."""

    controls: Controls
    image_tab: ImageTab
    batch_tab: BatchTab
    single_state: gr.State
    batch_state: gr.State
    api_button: gr.Button
    api_result: gr.JSON


def shared_controls(choices: list[str], default_model: str, default: Predictor) -> Controls:
    """The model picker with its facts, the thresholds, the tag selection and the caption rules."""
    with gr.Row(equal_height=True):
        model_box = gr.Dropdown(choices=choices, value=default_model, label="Model", scale=1, elem_id="spml-model")
        model_info = gr.Markdown(model_markdown(default_model, default))
    with gr.Row():
        use_calibrated = gr.Checkbox(value=True, label="Use calibrated per-class thresholds",
                                     info=calibrated_info(default.meta), elem_id="spml-calibrated")
        threshold = gr.Slider(0.0, 1.0, value=DEFAULT_THRESHOLD, step=0.01, label="Global threshold",
                              info="applies to every class when the box on the left is unticked; re-filters instantly",
                              elem_id="spml-threshold")
    with gr.Row():
        mode_box = gr.Dropdown(MODES.names(), value="thresholds", label="Tag selection", elem_id="spml-mode",
                               info="thresholds: per class (above); mcut: above the largest gap between scores; "
                               "top-k: the K best")
        k_box = gr.Number(5, precision=0, minimum=1, label="K (top-k)", elem_id="spml-k")
        max_tags_box = gr.Number(0, precision=0, minimum=0, label="At most N tags (0: no cap)", elem_id="spml-max")
        min_score_box = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="Minimum score", info="a floor, with any mode",
                                  elem_id="spml-min-score")
    rules_box = gr.Textbox("", lines=2, label="Caption rules", elem_id="spml-rules",
                           placeholder="first sks\nexclude-re ^rating_\nreplace cat=kitty\nspaces",
                           info="one per line, as in `serve tag --caption-rules FILE`: exclude NAME, exclude-re REGEX, "
                           "replace OLD=NEW, first WORD, spaces, escape, weights")
    return Controls(model_box, model_info, use_calibrated, threshold, mode_box, k_box, max_tags_box, min_score_box,
                    rules_box)


def image_tab(examples: ExampleSet) -> ImageTab:
    """The *Image* tab: upload / webcam / clipboard, the examples, the result panel and its JSON."""
    with gr.Tab("Image"), gr.Row():
        with gr.Column(scale=2):
            image = gr.Image(type="filepath", image_mode=None, sources=["upload", "webcam", "clipboard"], label="Image",
                             height=320, elem_id="spml-image")
            with gr.Row():
                tag_button = gr.Button("Tag", variant="primary", elem_id="spml-tag")
                clear_button = gr.ClearButton(value="Clear")
            if examples.images:
                gr.Examples(examples=[[str(p)] for p in examples.images], inputs=[image], label="Examples",
                            cache_examples=False, examples_per_page=len(examples.images))
            gr.Markdown(f"<small>Examples: {html.escape(examples.note)}</small>")
        with gr.Column(scale=3):
            result_html = gr.HTML(EMPTY_HTML, elem_id="spml-result", apply_default_css=False)
            with gr.Accordion("JSON (what /predict returns)", open=False):
                result_json = gr.JSON(label="result")
    return ImageTab(image, tag_button, clear_button, result_html, result_json)


def batch_tab() -> BatchTab:
    """The *Batch* tab: files, the table, the CSV / JSONL / captions zip downloads."""
    with gr.Tab("Batch"):
        files = gr.File(file_count="multiple", file_types=["image"], label="Images", elem_id="spml-files")
        batch_button = gr.Button("Tag all", variant="primary")
        batch_table = gr.Dataframe(label="Scores (tags use the thresholds above)", interactive=False, wrap=True)
        with gr.Row():
            csv_file = gr.DownloadButton("Download CSV", value=None)
            jsonl_file = gr.DownloadButton("Download JSONL", value=None)
            zip_file = gr.DownloadButton("Download captions (zip)", value=None, elem_id="spml-zip")
    return BatchTab(files, batch_button, batch_table, csv_file, jsonl_file, zip_file)


def lay_out(title: str, choices: list[str], default_model: str, default: Predictor, examples: ExampleSet,
            review: ReviewQueue | None = None, audit: ReviewQueue | None = None) -> Page:
    """Every part of the page, in order, inside the current ``gr.Blocks``; with answer tabs, they come first and the
    model's controls fold into a closed accordion above the tabs."""
    from serve.demo.review_tab import answer_tabs

    gr.Markdown(f"## {html.escape(title)}")
    answering = review is not None or audit is not None
    with (gr.Accordion(SETTINGS_LABEL, open=False, elem_id="spml-settings") if answering else contextlib.nullcontext()):
        controls = shared_controls(choices, default_model, default)
    single_state = gr.State(None)
    batch_state = gr.State(None)
    with gr.Tabs(selected="review" if review is not None else ("audit" if audit is not None else None)):
        answer_tabs(review, audit)
        images = image_tab(examples)
        batch = batch_tab()
        with gr.Tab("API"):
            gr.Markdown(API_HELP.format(model=default_model))
    # /predict is its own event (on a button that is never shown) so that the page's calls can report a bad
    # image in the result panel while API callers get the error itself
    api_button = gr.Button(visible=False)
    api_result = gr.JSON(visible=False)
    images.clear_button.add([images.image, images.result_json])
    return Page(controls, images, batch, single_state, batch_state, api_button, api_result)


def connect(page: Page, handlers: DemoHandlers) -> None:
    """The page's events: tag an image (``/predict``), a batch (``/predict_batch``), re-filter, pick, clear."""
    c, single, batch = page.controls, page.image_tab, page.batch_tab
    inputs, tagging = c.thresholds, c.tagging
    run = {"concurrency_id": "model", "preprocess": False}
    show = {"fn": handlers.render, "inputs": [page.single_state, *inputs, *tagging],
            "outputs": [single.result_json, single.result_html]}
    for trigger in (single.tag_button.click, single.image.change):
        trigger(handlers.predict_ui, [single.image, c.model_box], [page.single_state], api_visibility="private",
                **run).then(**show, api_visibility="private", queue=False)
    page.api_button.click(handlers.predict, [single.image, *inputs, c.model_box, *tagging],
                          [page.api_result, page.single_state], api_name="predict",
                          api_description="Score one image: every class's sigmoid score, the thresholds used, the tags "
                          "and the caption.", **run)
    batch.batch_button.click(handlers.predict_batch, [batch.files, *inputs, c.model_box, *tagging],
                             [*batch.outputs, page.batch_state], api_name="predict_batch",
                             api_description="Score several images: a table, and the same results as CSV and JSONL "
                             "files and a zip of caption files.", **run)
    for control in (*inputs, *tagging):
        control.change(**show, api_name="refilter" if control is c.threshold else None,
                       api_visibility="undocumented" if control is c.threshold else "private", queue=False,
                       trigger_mode="always_last")
        control.change(handlers.refilter_batch, [page.batch_state, *inputs, *tagging], batch.outputs,
                       api_visibility="private", queue=False, trigger_mode="always_last")
    # moving the slider means "use this global value": untick the calibrated box (which then re-filters)
    c.threshold.input(lambda: False, None, [c.use_calibrated], api_visibility="private", queue=False)
    c.model_box.change(
        handlers.change_model, [c.model_box], [c.model_info, c.use_calibrated], api_visibility="private",
        concurrency_id="model",
    ).then(handlers.predict_ui, [single.image, c.model_box], [page.single_state], api_visibility="private",
           **run).then(**show, api_visibility="private", queue=False)
    single.clear_button.click(lambda: (None, EMPTY_HTML), None, [page.single_state, single.result_html],
                              api_visibility="private")
