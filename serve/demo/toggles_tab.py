"""A tab that answers a whole image at a time (``--audit FILE``): its pending labels as toggles; Save, Skip, Undo (keys
Enter, ``1``-``9``, ``s``, ``u``), over a :class:`serve.demo.review.ReviewQueue`; the events are also an API."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from serve.demo.review import ImageView, ReviewQueue, display_image
from serve.demo.review_tab import CSS, IMAGE_HEIGHT, labels_html, progress_html

#: Keys for the toggles tab shown (only one is: the others' parts have no offsetParent), found by their classes.
KEYS_JS = """
if (!window.spmlTogglesKeys) {
  window.spmlTogglesKeys = true;
  const shown = (selector) => [...document.querySelectorAll(selector)].filter((e) => e.offsetParent !== null);
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target;
    if (target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))
        && target.type !== "checkbox") return;
    if (!shown(".spml-toggles-save").length) return;
    const key = (event.key || "").toLowerCase();
    const classes = {enter: ".spml-toggles-save", s: ".spml-toggles-skip", u: ".spml-toggles-undo"};
    let button = classes[key] && shown(classes[key])[0];
    if (!button && /^[1-9]$/.test(key)) button = shown(".spml-toggles-labels input[type=checkbox]")[Number(key) - 1];
    if (!button || button.disabled) return;
    event.preventDefault();
    button.click();
  });
}
"""


#: The filter box, in the page: hides the toggles whose label does not contain the text (ticked ones stay shown).
FILTER_JS = """
(text) => {
  const needle = (text || "").trim().toLowerCase();
  for (const label of document.querySelectorAll("#spml-toggles-labels label")) {
    const box = label.querySelector("input");
    const name = (box?.name || label.innerText || "").toLowerCase();
    label.style.display = !needle || name.includes(needle) || box?.checked ? "" : "none";
  }
  return [];
}
"""


@dataclass
class TogglesTab:
    """The tab's parts: the image, the card, the filter, the toggles, the progress line and the buttons."""

    image: gr.Image
    card: gr.HTML
    filter: gr.Textbox
    labels: gr.CheckboxGroup
    progress: gr.HTML
    shown: gr.Textbox
    save: gr.Button
    skip: gr.Button
    undo: gr.Button

    @property
    def outputs(self) -> list[Any]:
        """What a handler that moves to another image returns, in order."""
        return [self.image, self.card, self.filter, self.labels, self.progress, self.shown]


def done_html(total: int, log_path: str, command: str) -> str:
    """The card once every image is answered: that message and the option to use the answers with."""
    return (f'<div class="spml-review"><div class="done">All {total} images answered.</div>'
            f"<div>Use the answers with <code>{html.escape(f'--audit {log_path}')}</code>:</div>"
            f"<pre>{html.escape(command.format(log=log_path))}</pre></div>")


def card_html(view: ImageView, image_note: str = "") -> str:
    """The card: the question, the image's name, the labels it has and the note."""
    assert view.image is not None
    lines = ['<div class="question">Which labels are in the image?</div>',
             f'<div class="muted">{html.escape(view.image)}</div>', f"<div>has: {labels_html(view.given)}</div>",
             f'<div style="color:rgb(200,60,60)">{html.escape(image_note)}</div>' if image_note else "",
             f'<div class="muted">{html.escape(view.note)}</div>' if view.note else ""]
    return '<div class="spml-review">' + "".join(lines) + "</div>"


def choices(view: ImageView) -> list[tuple[str, str]]:
    """The toggles: the image's pending labels with their scores, in the queue's order (the most likely first)."""
    return [(f"{item.label}  {item.score:.2f}" if item.score is not None else item.label, item.label)
            for item in view.pending]


class TogglesHandlers:
    """The tab's event handlers over the server's one :class:`ReviewQueue`; the hooks (done card, progress line, what
    the page keeps of the image shown) are the *Audit* tab's."""

    def __init__(self, queue: ReviewQueue, command: str = "") -> None:
        self.queue = queue
        self.command = command
        self.log_path = str(queue.log.path.resolve())

    def done(self, view: ImageView) -> str:
        """The card once every image is answered."""
        return done_html(view.images_total, self.log_path, self.command)

    def progress(self, view: ImageView) -> str:
        """The progress line."""
        return progress_html(view, self.log_path)

    def shown(self, view: ImageView) -> str:
        """What the page keeps of the image shown, to answer it (here its name)."""
        return view.image or ""

    def parse(self, shown: str) -> tuple[str, list[str] | None]:
        """(image, the labels asked about: None for all those shown) from :meth:`shown`."""
        return shown, None

    def render(self, view: ImageView) -> tuple[Any, ...]:
        """(image, card, filter, toggles, progress, image shown) of a view."""
        if view.image is None:
            return None, self.done(view), "", gr.CheckboxGroup(choices=[], value=[]), self.progress(view), ""
        image, note = display_image(self.queue.image_file(view.image))
        ticked = [item.label for item in view.pending if item.label in view.given]
        return (image, card_html(view, note), "", gr.CheckboxGroup(choices=choices(view), value=ticked),
                self.progress(view), self.shown(view))

    def show(self) -> tuple[Any, ...]:
        """The current image (on page load)."""
        return self.render(self.queue.image_view())

    def refresh(self, shown: str, progress: str) -> tuple[Any, ...]:
        """On picking the tab: the current image if another tab moved the queue on, else only the progress line (so
        that a tick or filter text already given stays); nothing while the page loads (no progress yet)."""
        view = self.queue.image_view()
        if progress and self.shown(view) != shown:
            return self.render(view)
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), self.progress(view) if progress else gr.skip(), gr.skip()

    def save(self, shown: str, ticked: list[str] | None) -> tuple[Any, ...]:
        """Answer every label shown of the image (ticked: yes, else no), in the log before returning; the next."""
        if not shown:
            return self.render(self.queue.image_view("nothing to answer"))
        image, asked = self.parse(shown)
        try:
            return self.render(self.queue.answer_image(image, list(ticked or []), asked))
        except KeyError as exc:
            raise gr.Error(str(exc.args[0]), print_exception=False) from None

    def skip(self, shown: str) -> tuple[Any, ...]:
        """Leave the image shown for later; the next."""
        return self.render(self.queue.skip_image(self.parse(shown)[0]) if shown else self.queue.image_view())

    def undo(self) -> tuple[Any, ...]:
        """Take back the last answers of this session and show that image again."""
        note = self.queue.undo().note
        return self.render(self.queue.image_view(note))


def toggles_tab(handlers: TogglesHandlers, title: str, name: str, ids: str = "toggles") -> TogglesTab:
    """Lay out the tab (``name``: its id and API prefix; ``ids``: its parts' ``spml-IDS-*``) and connect it to
    ``handlers``; the filter box only where every label of an image is shown."""
    with gr.Tab(title, id=name, elem_id=f"spml-{name}-tab") as page_tab, gr.Row():
        with gr.Column(scale=3):
            image = gr.Image(type="pil", format="jpeg", interactive=False, label="Image", height=IMAGE_HEIGHT,
                             buttons=["fullscreen"], elem_id=f"spml-{ids}-image")
        with gr.Column(scale=2):
            card = gr.HTML("", elem_id=f"spml-{ids}-card", js_on_load=KEYS_JS, css_template=CSS)
            with gr.Row():
                save = gr.Button("Save (Enter)", variant="primary", elem_id=f"spml-{ids}-save",
                                 elem_classes="spml-toggles-save")
                skip = gr.Button("Skip (s)", elem_id=f"spml-{ids}-skip", elem_classes="spml-toggles-skip")
                undo = gr.Button("Undo (u)", elem_id=f"spml-{ids}-undo", elem_classes="spml-toggles-undo")
            search = gr.Textbox("", label="Filter the labels", placeholder="type part of a label",
                                elem_id=f"spml-{ids}-filter", visible=handlers.queue.per_image is None)
            labels = gr.CheckboxGroup([], label="Present (ticked, keys 1-9) - the rest are saved as absent",
                                      elem_id=f"spml-{ids}-labels", elem_classes="spml-toggles-labels")
            progress = gr.HTML("", elem_id=f"spml-{ids}-progress", css_template=CSS)
            shown = gr.Textbox("", visible=False, elem_id=f"spml-{ids}-shown")
    tab = TogglesTab(image, card, search, labels, progress, shown, save, skip, undo)
    events = {"outputs": tab.outputs, "concurrency_id": name, "show_progress": "hidden"}
    gr.on(None, handlers.show, None, api_name=f"{name}_show", **events)
    page_tab.select(handlers.refresh, [shown, progress], api_visibility="private", **events)
    save.click(handlers.save, [shown, labels], api_name=f"{name}_save", **events)
    skip.click(handlers.skip, [shown], api_name=f"{name}_skip", **events)
    undo.click(handlers.undo, None, api_name=f"{name}_undo", **events)
    search.change(None, [search], None, js=FILTER_JS.replace("spml-toggles", f"spml-{ids}"), api_name=False)
    return tab
