"""``python -m serve demo``: the Gradio demo; the model runs once per image, controls re-filter the kept scores."""

from __future__ import annotations

import atexit
import html
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve import DEFAULT_MAX_PIXELS
from serve.demo.catalog import ExampleSet
from serve.demo.model_store import ModelStore

if TYPE_CHECKING:
    import gradio as gr

    from serve.demo.review import ReviewQueue

__all__ = ["DEFAULT_MAX_PIXELS", "build_demo", "build_review_demo", "launch_demo", "parse_size"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_FILE_SIZE = "20mb"
DEFAULT_QUEUE_SIZE = 32
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_BATCH_FILES = 64

#: The page's own style: the Audit tab's toggles scroll in a box that keeps them in view on a 768 px high screen.
PAGE_CSS = "#spml-toggles-labels { max-height: max(120px, calc(100vh - 600px)); overflow-y: auto; }"

_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_size(text: str | int) -> int:
    """``"20mb"`` / ``"500kb"`` / ``"1.5gb"`` / ``"1000"`` (bytes) -> bytes, with 1kb = 1024 b (``ValueError``)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?b)?", str(text).strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"expected a size such as 20mb, 500kb or 1gb, got {text!r}")
    return max(1, int(float(match.group(1)) * _UNITS[match.group(2) or ""]))


def build_demo(store: ModelStore | None, default_model: str | None, examples: ExampleSet | None = None, *,
               max_batch_files: int = DEFAULT_MAX_BATCH_FILES, title: str = "spml multi-label tagger",
               review: ReviewQueue | None = None, audit: ReviewQueue | None = None) -> gr.Blocks:
    """The Blocks app over ``store`` (first ``default_model``); ``review`` / ``audit`` add their tabs."""
    import gradio as gr

    if store is None or default_model is None:
        if review is None and audit is None:
            raise ValueError("a demo needs a model store, a review or audit queue, or both")
        return build_review_demo(review, audit)

    from serve.demo.handlers import DemoHandlers
    from serve.demo.layout import connect, lay_out

    if default_model not in store.choices:
        raise ValueError(f"default model {default_model!r} is not one of the store's choices")
    examples = examples or ExampleSet()
    default = store.get(default_model)
    work_root = Path(tempfile.mkdtemp(prefix="spml-demo-"))
    atexit.register(shutil.rmtree, work_root, True)
    handlers = DemoHandlers(store, examples, max_batch_files, work_root)
    with gr.Blocks(title=title, delete_cache=(3600, 3600)) as demo:
        connect(lay_out(title, list(store.choices), default_model, default, examples, review, audit), handlers)
    return demo


def build_review_demo(review: ReviewQueue | None, audit: ReviewQueue | None = None,
                      title: str = "spml label review") -> gr.Blocks:
    """The page with only the *Review* and *Audit* tabs (no model, neither torch nor a model file needed)."""
    import gradio as gr

    from serve.demo.review_tab import answer_tabs

    with gr.Blocks(title=title, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"## {html.escape(title)}")
        with gr.Tabs():
            answer_tabs(review, audit)
    return demo


def launch_demo(demo: gr.Blocks, *, host: str = DEFAULT_HOST, port: int | None = None, share: bool = False,
                max_file_size: str | int | None = DEFAULT_MAX_FILE_SIZE, queue_size: int = DEFAULT_QUEUE_SIZE,
                concurrency: int = DEFAULT_CONCURRENCY, prevent_thread_lock: bool = False,
                quiet: bool = False) -> tuple[Any, str, str | None]:
    """Queue and launch on ``host:port`` (``port=None`` scans from 7860); returns ``(app, local_url, share_url)``."""
    demo.queue(max_size=queue_size, default_concurrency_limit=concurrency)
    return demo.launch(server_name=host, server_port=port, share=share, prevent_thread_lock=prevent_thread_lock,
                       max_file_size=parse_size(max_file_size) if max_file_size is not None else None, quiet=quiet,
                       show_error=False, ssr_mode=False, css=PAGE_CSS, footer_links=["api", "gradio"])
