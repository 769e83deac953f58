"""The *Review* tab (``--review FILE``): one suggested label at a time, Yes / No / Skip / Undo (keys ``y n s u``), over
a :class:`serve.demo.review.ReviewQueue`; its events are also an API (``/review_*``)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

import gradio as gr

from serve.demo.review import ImageView, ReviewQueue, ReviewView, display_image

#: Answers a key press when focus is not in a text field and the Review tab is shown (its buttons visible).
KEYS_JS = """
if (!window.spmlReviewKeys) {
  window.spmlReviewKeys = true;
  const ids = {y: "spml-review-yes", n: "spml-review-no", s: "spml-review-skip", u: "spml-review-undo"};
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target;
    if (target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))) return;
    const id = ids[(event.key || "").toLowerCase()];
    const button = id && document.getElementById(id);
    if (!button || button.offsetParent === null || button.disabled) return;
    event.preventDefault();
    button.click();
  });
}
"""

CSS = """
.spml-review { font-size: 1rem; line-height: 1.6; }
.spml-review .question { font-size: 2rem; font-weight: 600; }
.spml-review .done { font-size: 1.4rem; font-weight: 600; }
.spml-review pre { white-space: pre-wrap; word-break: break-all; }
.spml-review .muted { opacity: 0.7; }
"""

#: The answer tabs' image: the viewport's height less the page's title, folded controls and tab bar above it (the
#: question and the buttons sit beside it), so that a 1366x768 screen shows all of it without scrolling.
IMAGE_HEIGHT = "max(320px, calc(100vh - 230px))"


@dataclass
class ReviewTab:
    """The *Review* tab's parts: the image, the card, the progress line, the pair shown and the four buttons."""

    image: gr.Image
    card: gr.HTML
    progress: gr.HTML
    pair: gr.Textbox
    yes: gr.Button
    no: gr.Button
    skip: gr.Button
    undo: gr.Button

    @property
    def outputs(self) -> list[Any]:
        """What every handler returns, in order."""
        return [self.image, self.card, self.progress, self.pair]


def labels_html(names: list[str] | tuple[str, ...], empty: str = "none listed") -> str:
    """``names`` joined for a card, or ``empty`` greyed out."""
    return html.escape(", ".join(names)) if names else f'<span class="muted">{empty}</span>'


def done_html(view: ReviewView, log_path: str, review_path: str = "", from_file: int = 0) -> str:
    """The card once every pair is answered: that message and the retraining command."""
    files = f"--review {review_path} --review {log_path}" if from_file and review_path else f"--review {log_path}"
    in_file = (f'<div class="muted">{from_file} answers were filled in the review file itself: pass it too, '
               "before the log.</div>") if from_file and review_path else ""
    return (f'<div class="spml-review"><div class="done">All {view.total} suggestions answered.</div>'
            f"<div>To retrain with the answers, add <code>{html.escape(files)}</code> to the training command "
            f"you used:</div><pre>{html.escape(f'python -m train ... {files}')}</pre>{in_file}</div>")


def card_html(view: ReviewView, log_path: str, image_note: str = "", review_path: str = "", from_file: int = 0) -> str:
    """The card: the label asked about, its score, the image's labels and answers, the note."""
    note = f'<div class="muted">{html.escape(view.note)}</div>' if view.note else ""
    if view.item is None:
        return done_html(view, log_path, review_path, from_file)
    item = view.item
    score = f"score {item.score:.3f} · " if item.score is not None else ""
    answered = [f"{label} ({'yes' if yes else 'no'})" for label, yes in view.answered_labels]
    others = [f"{o.label} {o.score:.2f}" if o.score is not None else o.label for o in view.others]
    lines = [
        f'<div class="question">{html.escape(item.label)}?</div>',
        f'<div class="muted">{score}{html.escape(item.image)}</div>',
        f"<div>has: {labels_html(item.given)}</div>",
        f"<div>answered: {labels_html(answered, 'none yet')}</div>" if answered else "",
        f"<div>also suggested: {labels_html(others, 'nothing else')}</div>",
        f'<div style="color:rgb(200,60,60)">{html.escape(image_note)}</div>' if image_note else "",
        note,
    ]
    return '<div class="spml-review">' + "".join(lines) + "</div>"


def progress_html(view: ReviewView | ImageView, log_path: str) -> str:
    """The progress line (``view.progress()``) and where the answers go."""
    return (f'<div class="spml-review"><b>{view.progress()}</b> <span class="muted">· answers in '
            f"{html.escape(log_path)}</span></div>")


class ReviewHandlers:
    """The tab's event handlers over the server's one :class:`ReviewQueue`."""

    def __init__(self, queue: ReviewQueue) -> None:
        self.queue = queue
        self.log_path = str(queue.log.path.resolve())
        self.review_path = str(queue.source.resolve()) if queue.source is not None else ""

    def render(self, view: ReviewView) -> tuple[Any, str, str, str]:
        """(image, card, progress, pair shown as JSON) of a view."""
        image, image_note = (None, "")
        if view.item is not None:
            image, image_note = display_image(self.queue.image_file(view.item.image))
        pair = json.dumps([view.item.image, view.item.label]) if view.item is not None else ""
        card = card_html(view, self.log_path, image_note, self.review_path, self.queue.from_file)
        return image, card, progress_html(view, self.log_path), pair

    @staticmethod
    def parse_pair(pair: str) -> tuple[str, str] | None:
        """The pair a page shows (``["image", "label"]`` as JSON; empty: none); ``gr.Error`` when malformed."""
        if not pair:
            return None
        try:
            image, label = json.loads(pair)
            return str(image), str(label)
        except (ValueError, TypeError):
            raise gr.Error(f"not a pair shown by the Review tab: {pair[:100]!r}", print_exception=False) from None

    def show(self) -> tuple[Any, str, str, str]:
        """The current view (on page load)."""
        return self.render(self.queue.view())

    def refresh(self, pair: str, progress: str) -> tuple[Any, ...]:
        """On picking the tab: the current pair if another tab moved the queue on, else only the progress line;
        nothing while the page loads (no progress yet)."""
        view = self.queue.view()
        if progress and self.parse_pair(pair) != ((view.item.image, view.item.label) if view.item else None):
            return self.render(view)
        return gr.skip(), gr.skip(), progress_html(view, self.log_path) if progress else gr.skip(), gr.skip()

    def _answer(self, pair: str, present: bool) -> tuple[Any, str, str, str]:
        shown = self.parse_pair(pair)
        if shown is None:
            return self.render(self.queue.view("nothing to answer"))
        try:
            return self.render(self.queue.answer(*shown, present))
        except KeyError as exc:
            raise gr.Error(str(exc.args[0]), print_exception=False) from None

    def yes(self, pair: str) -> tuple[Any, str, str, str]:
        """Yes: the label is in the image (written to the log before returning); the next pair."""
        return self._answer(pair, True)

    def no(self, pair: str) -> tuple[Any, str, str, str]:
        """No: the label is not in the image (written to the log before returning); the next pair."""
        return self._answer(pair, False)

    def skip(self, pair: str) -> tuple[Any, str, str, str]:
        """Skip the pair shown (it comes back after the end of the list); the next pair."""
        shown = self.parse_pair(pair)
        return self.render(self.queue.skip(*shown) if shown else self.queue.view())

    def undo(self) -> tuple[Any, str, str, str]:
        """Take back the last answer of this session and show its pair again."""
        return self.render(self.queue.undo())


def review_tab(queue: ReviewQueue) -> ReviewTab:
    """Lay out the *Review* tab and connect it to a :class:`ReviewHandlers` over ``queue``."""
    with gr.Tab("Review", id="review", elem_id="spml-review-tab") as page_tab, gr.Row():
        with gr.Column(scale=3):
            image = gr.Image(type="pil", format="jpeg", interactive=False, label="Image", height=IMAGE_HEIGHT,
                             buttons=["fullscreen"], elem_id="spml-review-image")
        with gr.Column(scale=2):
            card = gr.HTML("", elem_id="spml-review-card", js_on_load=KEYS_JS, css_template=CSS)
            with gr.Row():
                yes = gr.Button("Yes (y)", variant="primary", elem_id="spml-review-yes")
                no = gr.Button("No (n)", variant="stop", elem_id="spml-review-no")
            with gr.Row():
                skip = gr.Button("Skip (s)", elem_id="spml-review-skip")
                undo = gr.Button("Undo (u)", elem_id="spml-review-undo")
            progress = gr.HTML("", elem_id="spml-review-progress", css_template=CSS)
            gr.Markdown("<small>Is the label in the image? Yes and No are saved at once; Skip leaves it for the "
                        "end of the list; Undo takes back the last answer. Keys y n s u work when the cursor is "
                        "not in a text field.</small>")
            pair = gr.Textbox("", visible=False, elem_id="spml-review-pair")
    tab = ReviewTab(image, card, progress, pair, yes, no, skip, undo)
    handlers = ReviewHandlers(queue)
    events = {"outputs": tab.outputs, "concurrency_id": "review", "show_progress": "hidden"}
    gr.on(None, handlers.show, None, api_name="review_show", **events)
    page_tab.select(handlers.refresh, [pair, progress], api_visibility="private", **events)  # the other tab moves
    yes.click(handlers.yes, [pair], api_name="review_yes", **events)
    no.click(handlers.no, [pair], api_name="review_no", **events)
    skip.click(handlers.skip, [pair], api_name="review_skip", **events)
    undo.click(handlers.undo, None, api_name="review_undo", **events)
    return tab


#: Seconds between two looks at the progress line while rounds re-rank in the background.
POLL_SECONDS = 2.0


def poll_progress(queue: ReviewQueue, lines: list[gr.HTML]) -> None:
    """Refresh the progress ``lines`` every :data:`POLL_SECONDS` where they changed (one not shown yet stays)."""
    log_path = str(queue.log.path.resolve())

    def tick(*shown: str) -> list[Any]:
        line = progress_html(queue.view(), log_path)
        return [line if old and old != line else gr.skip() for old in shown]
    gr.Timer(POLL_SECONDS).tick(tick, lines, lines, api_visibility="private", concurrency_id="review_poll",
                                show_progress="hidden")


#: What the Audit tab's done card says to run with the answers.
AUDIT_COMMAND = "python -m train ... --method auto --audit {log}"


def answer_tabs(review: ReviewQueue | None, audit: ReviewQueue | None) -> None:
    """The tabs that answer labels: *Review* and *Review by image* (the suggestions, one label or one image at a
    time) and *Audit* (every label of an image)."""
    from serve.demo.review_by_image import review_by_image_tab
    from serve.demo.toggles_tab import TogglesHandlers, toggles_tab

    if review is not None:
        lines = [review_tab(review).progress, review_by_image_tab(review).progress]
        if review.on_answers is not None:  # rounds (--rounds N): a finished round shows without another answer
            poll_progress(review, lines)
    if audit is not None:
        toggles_tab(TogglesHandlers(audit, AUDIT_COMMAND), "Audit", "audit")
