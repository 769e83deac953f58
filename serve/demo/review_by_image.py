"""The *Review by image* tab (``--review FILE``, beside the *Review* tab): an image with its most likely pending
suggestions as toggles (at most ``queue.per_image``), one Save answering them all (unticked: no) into the same
answer log; a :mod:`serve.demo.toggles_tab` over the Review tab's own queue (API ``/review_image_*``)."""

from __future__ import annotations

import json

import gradio as gr

from serve.demo.review import ImageView, ReviewQueue
from serve.demo.review_tab import done_html, progress_html
from serve.demo.toggles_tab import TogglesHandlers, TogglesTab, toggles_tab


class ImageReviewHandlers(TogglesHandlers):
    """The toggles' handlers for suggestions: the page keeps the labels it asks about (``["image", [labels]]`` as
    JSON), so a label answered meanwhile in the Review tab is not answered twice; progress and done card in pairs."""

    def done(self, view: ImageView) -> str:
        """The Review tab's done card: the retraining command."""
        source = str(self.queue.source.resolve()) if self.queue.source is not None else ""
        return done_html(self.queue.view(), self.log_path, source, self.queue.from_file)

    def progress(self, view: ImageView) -> str:
        """The Review tab's progress line (pairs answered, yes, no)."""
        return progress_html(self.queue.view(), self.log_path)

    def shown(self, view: ImageView) -> str:
        """The image and the labels asked about, as JSON."""
        return json.dumps([view.image, [item.label for item in view.pending]]) if view.image else ""

    def parse(self, shown: str) -> tuple[str, list[str] | None]:
        """(image, labels asked about) from :meth:`shown`; ``gr.Error`` when malformed."""
        try:
            image, labels = json.loads(shown)
            return str(image), [str(label) for label in labels]
        except (ValueError, TypeError):
            raise gr.Error(f"not an image shown by the Review by image tab: {shown[:100]!r}",
                           print_exception=False) from None


def review_by_image_tab(queue: ReviewQueue) -> TogglesTab:
    """Lay out the *Review by image* tab over the Review tab's ``queue`` (its parts ``spml-byimage-*``)."""
    return toggles_tab(ImageReviewHandlers(queue), "Review by image", "review_image", "byimage")
