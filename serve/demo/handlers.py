"""What the demo page does, one method per event (score, re-filter, ``/predict``, batch, change model). Imports
gradio."""

from __future__ import annotations

import html
import tempfile
import time
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from models.checkpoint import ModelMeta
from models.runtimes import ModelLoadError
from serve import DEFAULT_BATCH_SIZE, DEFAULT_THRESHOLD
from serve.demo.catalog import ExampleSet
from serve.demo.model_store import ModelStore, model_markdown
from serve.demo.results import (
    EMPTY_HTML,
    BatchRow,
    batch_outputs,
    file_bytes,
    payload_image,
    result_document,
    scores_html,
    tag_choice,
)
from serve.images import ImageError, ImagePreprocessor
from serve.outputs.stage import TagSelector
from serve.predictor import Prediction, Predictor
from serve.tagging.scoring import score_items
from serve.tagging.sources import Item


def payload_name(payload: Any) -> str:
    """The file name of an uploaded payload (a gradio file dict or a path), for messages."""
    if isinstance(payload, dict):
        return str(payload.get("orig_name") or Path(str(payload.get("path") or "image")).name)
    return Path(str(payload)).name


def error_html(message: str) -> str:
    """The result panel showing ``message`` as an error."""
    return f'<div class="spml-res" style="color:rgb(200,60,60)">{html.escape(message)}</div>'


def calibrated_info(meta: ModelMeta) -> str:
    """The note under the calibrated-thresholds box: whether the model has its own per-class thresholds."""
    if meta.thresholds is not None:
        return "the model's own per-class thresholds"
    return f"this model has none: {DEFAULT_THRESHOLD} for every class"


class DemoHandlers:
    """The page's event handlers over the picker's models ``store``, the ``examples`` and batch limits."""

    def __init__(self, store: ModelStore, examples: ExampleSet, max_batch_files: int, work_root: Path) -> None:
        self.store = store
        self.examples = examples
        self.max_batch_files = max_batch_files
        self.work_root = work_root

    def predictor_for(self, key: str) -> Predictor:
        """The picker's model ``key``, loaded; ``gr.Error`` for an unknown key or a model that does not load."""
        try:
            return self.store.get(key)
        except KeyError:
            raise gr.Error(f"unknown model {key!r}; choose one of the picker's entries") from None
        except ModelLoadError as exc:
            raise gr.Error(f"cannot load model {key}: {exc}") from None

    def choice_for(self, meta: ModelMeta, use_calibrated: bool, threshold: float,
                   *tagging: Any) -> tuple[TagSelector, str, str]:
        """The pipeline's selection for the controls (:func:`serve.demo.results.tag_choice`); ``gr.Error``."""
        try:
            return tag_choice(meta, bool(use_calibrated), float(threshold), *tagging)
        except (TypeError, ValueError) as exc:
            raise gr.Error(str(exc), title="Bad option", print_exception=False) from None

    # ---- single image

    def score_one(self, payload: Any, model: str) -> dict:
        """Run the model on one image: the state kept for re-filtering; ``gr.Error`` if unreadable."""
        predictor = self.predictor_for(model)
        try:
            image, name = payload_image(payload)
            start = time.perf_counter()
            probs = predictor.scores([image])[0]
            seconds = time.perf_counter() - start
        except ImageError as exc:
            message = f"Cannot read {payload_name(payload)}: {exc.reason}"
            raise gr.Error(message, title="Bad image", print_exception=False) from None
        except (ValueError, TypeError) as exc:
            raise gr.Error(f"Cannot read the image: {exc}", title="Bad image", print_exception=False) from None
        truth = self.examples.truth_for(file_bytes(image)) if self.examples.labels else None
        return {"model": model, "name": name, "probs": [float(p) for p in probs], "truth": truth, "seconds": seconds}

    def document(self, state: dict, use_calibrated: bool, threshold: float,
                 *tagging: Any) -> tuple[dict, Prediction, str]:
        """(API document, prediction, description) of kept scores under the controls; ``gr.Error`` on a bad one."""
        meta = self.store.meta(state["model"])
        select, mode, description = self.choice_for(meta, use_calibrated, threshold, *tagging)
        probs = np.asarray(state["probs"])
        prediction = Prediction.from_probabilities(list(meta.classes), probs, select.thresholds, select.mode)
        return result_document(prediction, state["model"], mode, state["seconds"], select), prediction, description

    def predict(self, payload: Any, use_calibrated: bool, threshold: float, model: str,
                *tagging: Any) -> tuple[dict, dict]:
        """The ``/predict`` endpoint: every class score, the thresholds, the tags and the caption, as JSON."""
        if payload is None:
            raise gr.Error("No image given.")
        self.predictor_for(model)
        # a bad option fails before the model runs
        self.choice_for(self.store.meta(model), use_calibrated, threshold, *tagging)
        state = self.score_one(payload, model)
        return self.document(state, use_calibrated, threshold, *tagging)[0], state

    def predict_ui(self, payload: Any, model: str) -> dict | None:
        """The page's own call: the model's scores to show; an unreadable image is reported in the panel."""
        if payload is None:
            return None
        try:
            return self.score_one(payload, model)
        except gr.Error as exc:
            gr.Warning(exc.message)
            return {"error": exc.message}

    def render(self, state: dict | None, use_calibrated: bool, threshold: float, *tagging: Any) -> tuple[Any, str]:
        """Re-filter the kept scores with the controls (no model call): (API document, HTML)."""
        if not state:
            return None, EMPTY_HTML
        if "error" in state:
            return None, error_html(state["error"])
        try:
            doc, prediction, description = self.document(state, use_calibrated, threshold, *tagging)
        except gr.Error as exc:
            return None, error_html(exc.message)
        caption = f"{state['name']} · {state['model']} · {1000 * state['seconds']:.0f} ms"
        written = doc["caption"] if doc["caption"] != ", ".join(prediction.tags) else None
        body = scores_html(prediction, description=description, truth=state["truth"], caption=caption, written=written)
        return doc, body

    # ---- batch

    def predict_batch(
        self, payloads: Any, use_calibrated: bool, threshold: float, model: str, mode: str = "thresholds",
        k: float | None = None, max_tags: float | None = None, min_score: float | None = None, rules: str = "",
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio's way to ask for a progress tracker
    ) -> tuple[Any, Any, Any, Any, Any]:
        """Score several images: table, CSV file, JSONL file, captions zip (+ state kept for re-filtering)."""
        tagging = (mode, k, max_tags, min_score, rules)
        items = payloads if isinstance(payloads, list) else ([payloads] if payloads else [])
        if not items:
            raise gr.Error("Add one or more image files first.")
        if len(items) > self.max_batch_files:
            gr.Warning(f"{len(items)} files given; only the first {self.max_batch_files} are tagged.")
            items = items[: self.max_batch_files]
        predictor = self.predictor_for(model)
        select, _, _ = self.choice_for(predictor.meta, use_calibrated, threshold, *tagging)
        rows: list[BatchRow] = []
        work: list[Item] = []  # the tagging pipeline's items: key = the row's index
        for i, item in enumerate(items):
            try:
                image, name = payload_image(item)
                rows.append(BatchRow(name, None))
                work.append(Item(str(i), image) if isinstance(image, str) else Item(str(i), data=image))
            except ValueError as exc:
                rows.append(BatchRow(payload_name(item), None, str(exc)))
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
        folder = Path(tempfile.mkdtemp(prefix="batch-", dir=self.work_root))
        frame, *files = batch_outputs(rows, select, folder)
        state = {"model": model, "rows": rows, "folder": str(folder)}
        return frame, *map(str, files), state

    def refilter_batch(self, state: dict | None, use_calibrated: bool, threshold: float,
                       *tagging: Any) -> tuple[Any, ...]:
        """Re-filter the batch's kept scores with the current controls (nothing changes while one is invalid)."""
        if not state:
            return (gr.skip(),) * 4
        try:
            select, _, _ = self.choice_for(self.store.meta(state["model"]), use_calibrated, threshold, *tagging)
        except gr.Error:
            return (gr.skip(),) * 4
        frame, *files = batch_outputs(state["rows"], select, Path(state["folder"]))
        return frame, *map(str, files)

    # ---- model picker

    def change_model(self, model: str) -> tuple[str, Any]:
        """The header and the calibrated box's note for the newly picked model."""
        predictor = self.predictor_for(model)
        return model_markdown(model, predictor), gr.update(info=calibrated_info(predictor.meta))
