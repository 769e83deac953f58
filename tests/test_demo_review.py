"""The demo's *Review* tab (``python -m serve demo --review FILE``): the queue's logic (answer, skip, undo, progress,
resume), the tab through the launched app, answers surviving a killed server, the page in headless Chromium at
1366x768 (the answer tabs above the fold, their keys), and the command line's errors. The browser client and the
port finder are test_demo's."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from test_demo import CHROMIUM, REPO, DevTools, free_port, make_run

from models.data.review_file import AnswerLog, ReviewItem, read_review
from models.data.types import DataError
from serve.demo.review import ReviewQueue, claim_log, default_log_path, display_image, load_review

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
gradio_client = pytest.importorskip("gradio_client")

#: (image, label, score, given): 6 suggestions over 3 images, ranked best first.
ROWS = [
    ("a", "dog", 0.9, "cat"),
    ("b", "car", 0.8, "person"),
    ("a", "person", 0.7, "cat"),
    ("c", "bird", 0.6, ""),
    ("b", "dog", 0.5, "person"),
    ("c", "tree", 0.4, ""),
]
COLOURS = {"a": (200, 40, 40), "b": (40, 200, 40), "c": (40, 40, 200)}


def make_review(folder: Path, answers: dict[tuple[str, str], str] | None = None, extra: str = "") -> Path:
    """``folder/review.csv`` over three 32x32 images ``folder/{a,b,c}.png`` (absolute paths), with ``answers``
    (``(image letter, label) -> word``) filled in."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, colour in COLOURS.items():
        Image.new("RGB", (32, 32), colour).save(folder / f"{name}.png")
    answers = answers or {}
    lines = ["image,label,score,given,answer"]
    lines += [f"{folder / f'{i}.png'},{label},{score},{given},{answers.get((i, label), '')}"
              for i, label, score, given in ROWS]
    path = folder / "review.csv"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def pair(folder: Path, image: str, label: str) -> tuple[str, str]:
    """The (image, label) pair of image letter ``image`` as the review file names it."""
    return str(folder / f"{image}.png"), label


def log_rows(path: Path) -> list[tuple[str, str, bool | None]]:
    """Every line of an answer log, in order: (image file name, label, answer)."""
    return [(Path(i.image).stem, i.label, i.answer) for i in read_review(path)] if path.is_file() else []


def shown(view: Any) -> tuple[str, str] | None:
    """(image letter, label) of the pair a view asks about (None: all answered)."""
    return (Path(view.item.image).stem, view.item.label) if view.item is not None else None


# ---- the queue, without gradio


def test_answer_skip_undo_and_progress(tmp_path: Path) -> None:
    review = make_review(tmp_path)
    queue = ReviewQueue.open(review)
    log = default_log_path(review)
    assert log == tmp_path / "review.answers.jsonl" and queue.log.path == log
    view = queue.view()
    assert shown(view) == ("a", "dog") and view.item.given == ("cat",) and view.item.score == pytest.approx(0.9)
    assert [o.label for o in view.others] == ["person"] and view.progress() == "0 of 6 answered (0 yes, 0 no)"
    assert shown(queue.answer(*pair(tmp_path, "a", "dog"), True)) == ("b", "car")
    assert log_rows(log) == [("a", "dog", True)]  # in the log when answer() returns
    view = queue.answer(*pair(tmp_path, "b", "car"), False)
    assert shown(view) == ("a", "person") and view.answered_labels == (("dog", True),) and view.others == ()
    assert shown(queue.skip(*pair(tmp_path, "a", "person"))) == ("c", "bird")
    assert shown(queue.skip(*pair(tmp_path, "c", "bird"))) == ("b", "dog")
    assert shown(queue.answer(*pair(tmp_path, "b", "dog"), True)) == ("c", "tree")
    view = queue.answer(*pair(tmp_path, "c", "tree"), False)
    assert shown(view) == ("a", "person"), "skipped pairs come back after the end, in the order skipped"
    assert view.progress() == "4 of 6 answered (2 yes, 2 no)" and len(log_rows(log)) == 4
    # a second press on a pair already answered the same way records nothing
    assert queue.answer(*pair(tmp_path, "c", "tree"), False).note.endswith("already answered no")
    assert len(log_rows(log)) == 4
    # undo takes back the last answers one by one, each shown again
    view = queue.undo()
    assert shown(view) == ("c", "tree") and view.progress() == "3 of 6 answered (2 yes, 1 no)"
    assert log_rows(log)[-1] == ("c", "tree", None)
    assert shown(queue.undo()) == ("b", "dog")
    assert shown(queue.undo()) == ("b", "car")
    view = queue.undo()
    assert shown(view) == ("a", "dog") and view.progress() == "0 of 6 answered (0 yes, 0 no)"
    assert queue.undo().note == "nothing to undo in this session"
    assert AnswerLog(log).read() == {} and len(log_rows(log)) == 8
    with pytest.raises(KeyError, match="not a suggestion"):
        queue.answer(str(tmp_path / "a.png"), "zebra", True)
    # answer everything: done
    while (view := queue.view()).item is not None:
        queue.answer(view.item.image, view.item.label, view.item.label == "dog")
    assert view.done and view.progress() == "6 of 6 answered (2 yes, 4 no)"
    assert AnswerLog(log).read() == {pair(tmp_path, i, label): label == "dog" for i, label, _, _ in ROWS}
    from serve.demo.review_tab import card_html

    card = card_html(view, str(log))
    assert "All 6 suggestions answered" in card and f"python -m train ... --review {log}</pre>" in card
    card = card_html(view, str(log), review_path=str(review), from_file=2)  # the file's own answers: it too
    assert f"python -m train ... --review {review} --review {log}</pre>" in card


def test_resume_from_the_log_and_the_file_own_answers(tmp_path: Path) -> None:
    duplicate = f"{tmp_path / 'a.png'},dog,0.1,cat,\n"  # listed twice: shown once, where it first appears
    review = make_review(tmp_path, {("c", "bird"): "no"}, extra=duplicate)
    log = AnswerLog(tmp_path / "answers" / "log.jsonl")
    log.record(*pair(tmp_path, "a", "dog"), True)
    log.record(*pair(tmp_path, "b", "car"), True)
    log.record(*pair(tmp_path, "b", "car"), None)  # undone before the restart: asked again
    with open(log.path, "a") as fh:
        fh.write('{"image": "cut short by a kill')  # a last line half written
    queue = ReviewQueue.open(review, log.path)
    view = queue.view()
    assert shown(view) == ("b", "car") and view.progress() == "2 of 6 answered (1 yes, 1 no)"
    assert queue.from_file == 1 and len(queue.items) == 6
    # the half line is dropped, so the next answer is a line of its own and the log still reads
    queue.answer(*pair(tmp_path, "b", "car"), False)
    assert log_rows(log.path)[-1] == ("b", "car", False) and len(log_rows(log.path)) == 4
    assert shown(ReviewQueue.open(review, log.path).view()) == ("a", "person")  # a second restart continues
    assert queue.undo().note == "car: answer taken back"  # this session's answers only
    assert queue.undo().note == "nothing to undo in this session"


def test_rerank_replaces_the_order_and_keeps_every_answer(tmp_path: Path) -> None:
    """A round's ranking replaces the pending order; a pair answered before it or while it was computed is never
    pending again; undo still works; the review file is rewritten so a restarted demo opens the same queue."""
    review = make_review(tmp_path)
    queue = ReviewQueue.open(review)
    told: list[int] = []
    queue.on_answers = told.append
    queue.answer(*pair(tmp_path, "a", "dog"), True)
    queue.answer(*pair(tmp_path, "b", "car"), False)
    ranked = [ReviewItem(*pair(tmp_path, i, label), score) for i, label, score in
              [("c", "tree", 0.95), ("c", "cat", 0.9), ("a", "dog", 0.85), ("b", "dog", 0.5), ("a", "person", 0.3)]]
    queue.answer(*pair(tmp_path, "c", "tree"), False)  # while the round computed
    queue.answer_image(str(tmp_path / "c.png"), ["bird"], ["bird"])  # a whole image: one call, one pair here
    queue.rerank(ranked)
    assert told == [1, 1, 1, 1]
    answered = [pair(tmp_path, "a", "dog"), pair(tmp_path, "b", "car"), pair(tmp_path, "c", "bird"),
                pair(tmp_path, "c", "tree")]  # in the file's order
    # the image on screen (a, its person pair) stays first, so the page's next answer is still a pending pair
    fresh = [pair(tmp_path, "a", "person"), pair(tmp_path, "c", "cat"), pair(tmp_path, "b", "dog")]
    assert queue.pending == fresh and list(queue.items) == [*answered, *fresh]
    assert queue.items[pair(tmp_path, "b", "dog")].score == pytest.approx(0.5)  # the new round's item
    assert queue.by_image[str(tmp_path / "c.png")] == [answered[2], answered[3], fresh[1]]
    view = queue.view()
    assert shown(view) == ("a", "person") and view.progress() == "4 of 7 answered (2 yes, 2 no)"
    assert [(i.image, i.label) for i in read_review(review)] == list(queue.items)  # the file: answered, then new
    reopened = ReviewQueue.open(review, queue.log.path)
    assert (reopened.items, reopened.answers, reopened.pending, reopened.by_image) == \
        (queue.items, queue.answers, queue.pending, queue.by_image)
    # undo reaches an answer given before the round: its pair is in front again
    assert shown(queue.undo()) == ("c", "bird") and shown(queue.undo()) == ("c", "tree")
    assert queue.pending[:3] == [answered[3], answered[2], fresh[0]]
    queue.answer(*pair(tmp_path, "c", "tree"), False)
    queue.rerank([ReviewItem(*p) for p in [*answered, fresh[2]]])  # answered pairs never come back
    assert queue.pending == [answered[2], fresh[1], fresh[2]] and len(queue.items) == 6
    assert AnswerLog(queue.log.path).read() == {answered[0]: True, answered[1]: False, answered[3]: False}
    queue.status = "round 2 re-ranked 2 pairs in 9 s"
    assert queue.view().progress().endswith("answered (1 yes, 2 no) · round 2 re-ranked 2 pairs in 9 s")
    assert queue.image_view().progress() == "1 of 3 images answered · round 2 re-ranked 2 pairs in 9 s"
    # a round asks for the file's size less the answers; the pairs of the image on screen come on top, so the tail
    # is cut to keep the size, never those pairs
    queue.rerank([ReviewItem(*p) for p in [fresh[2], fresh[0]]], total=6)
    assert queue.pending == [answered[2], fresh[1], fresh[2]] and len(queue.items) == 6
    queue.rerank([ReviewItem(*fresh[0])], total=4)
    assert queue.pending == [answered[2], fresh[1]] and len(queue.items) == 5


def test_a_failed_round_keeps_the_order_and_close_ends_its_process(tmp_path: Path) -> None:
    """A round whose ``train suggest`` fails leaves the order as it was and says why in the status; ``close()``
    ends a round's running process and leaves no temporary file."""
    from serve.demo.review_rounds import ReviewRounds, read_sidecar

    review = make_review(tmp_path)
    (tmp_path / "not-a-run").mkdir()
    made = {"run": str(tmp_path / "not-a-run"), "runs_dir": None, "top": 6, "per_image": 0, "order": "balanced",
            "split": "train", "review": []}
    review.with_suffix(".suggest.json").write_text(json.dumps(made))
    assert read_sidecar(review) == (made, "")
    queue = ReviewQueue.open(review)
    rounds = ReviewRounds(queue, made, every=2)
    assert queue.view().progress().endswith(" · re-ranks every 2 answers")
    queue.answer(*pair(tmp_path, "a", "dog"), True)
    assert rounds.thread is None
    order = list(queue.pending)
    queue.answer(*pair(tmp_path, "b", "car"), True)
    assert rounds.thread is not None and queue.status == "re-ranking in the background..."
    deadline = time.monotonic() + 120
    while rounds.thread is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert queue.status.startswith("re-ranking failed: ") and "config.json" in queue.status, queue.status
    assert queue.pending == order[1:] and rounds.round == 1
    queue.answer_image(str(tmp_path / "c.png"), [])  # one call, two more answers: the next round
    process = None
    while process is None and time.monotonic() < deadline:
        process = rounds.process
        time.sleep(0.01)
    assert process is not None
    rounds.close()
    assert process.poll() is not None and rounds.thread is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bad_review_files_and_logs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such review file"):
        load_review(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("image,label\n")
    with pytest.raises(DataError, match="no suggestions"):
        load_review(tmp_path / "empty.csv")
    lines = ["image,label"] + [f"/nowhere/{n}.png,dog" for n in range(5)]
    (tmp_path / "gone.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"5 image\(s\) not found: /nowhere/0.png, /nowhere/1.png, /nowhere/2.png "
                                        r"and 2 more"):
        load_review(tmp_path / "gone.csv")
    review = make_review(tmp_path / "ok")
    with pytest.raises(DataError, match="must not be the review file"):
        ReviewQueue.open(review, review)
    handle = claim_log(tmp_path / "held.jsonl")
    try:
        with pytest.raises(DataError, match="another demo"):
            ReviewQueue.open(review, tmp_path / "held.jsonl", claim=True)
    finally:
        handle.close()
    queue = ReviewQueue.open(review, tmp_path / "held.jsonl", claim=True)  # free again
    with pytest.raises(DataError, match="another demo"):
        claim_log(tmp_path / "held.jsonl")
    queue.close()
    claim_log(tmp_path / "held.jsonl").close()
    image, note = display_image(review)
    assert image is None and note.startswith("cannot show review.csv")
    image, note = display_image(tmp_path / "ok" / "a.png")
    assert image.size == (32, 32) and note == ""


#: An audit file: every class of two images, the most likely first, the given label among them.
AUDIT_CLASSES = ["bird", "car", "cat", "dog", "person", "tree"]
AUDIT_SCORES = {"a": [0.1, 0.2, 0.9, 0.8, 0.3, 0.05], "b": [0.6, 0.1, 0.2, 0.3, 0.7, 0.4]}
AUDIT_GIVEN = {"a": "cat", "b": "person"}


def make_audit(folder: Path) -> Path:
    """``folder/audit.csv``: every class of images a and b (as ``train suggest --audit`` writes it)."""
    make_review(folder)  # the images
    lines = ["image,label,score,given,answer"]
    for image, scores in AUDIT_SCORES.items():
        order = sorted(zip(AUDIT_CLASSES, scores, strict=True), key=lambda p: -p[1])
        lines += [f"{folder / f'{image}.png'},{label},{score},{AUDIT_GIVEN[image]}," for label, score in order]
    path = folder / "audit.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_image_at_a_time_and_the_audit_list_it_makes(tmp_path: Path) -> None:
    from models.data.audit_list import load_audit

    audit = make_audit(tmp_path)
    queue = ReviewQueue.open(audit)
    view = queue.image_view()
    assert Path(view.image).stem == "a" and view.given == ("cat",) and view.progress() == "0 of 2 images answered"
    assert [i.label for i in view.pending] == ["cat", "dog", "person", "car", "bird", "tree"]  # likely first
    with pytest.raises(KeyError, match="zebra"):
        queue.answer_image(view.image, ["zebra"])
    view = queue.skip_image(view.image)
    assert Path(view.image).stem == "b" and "skipped" in queue.image_view(view.note).note
    view = queue.answer_image(view.image, ["person", "tree"])
    assert Path(view.image).stem == "a" and view.progress() == "1 of 2 images answered" and "2 yes, 4 no" in view.note
    assert len(log_rows(queue.log.path)) == 6  # one write of six answers
    restarted = ReviewQueue.open(audit).image_view()  # a restarted demo continues from the log
    assert Path(restarted.image).stem == "a" and restarted.progress() == "1 of 2 images answered"
    with pytest.raises(DataError, match="no image has an answer for every one"):
        load_audit(str(tmp_path / "audit.csv"), AUDIT_CLASSES)
    listed = load_audit(str(queue.log.path), AUDIT_CLASSES)
    assert [p.stem for p in listed.paths] == ["b"] and listed.partial == 0
    assert listed.labels.tolist() == [[0, 0, 0, 0, 1, 1]]
    assert queue.undo().note == "b.png: its 6 answers taken back"
    assert Path(queue.image_view().image).stem == "b" and len(log_rows(queue.log.path)) == 12
    queue.answer_image(str(tmp_path / "b.png"), ["person"])
    view = queue.answer_image(str(tmp_path / "a.png"), ["cat", "dog"])
    assert view.image is None and view.progress() == "2 of 2 images answered"
    listed = load_audit(str(queue.log.path), AUDIT_CLASSES)
    assert {p.stem: row.tolist() for p, row in zip(listed.paths, listed.labels, strict=True)} == {
        "a": [0, 0, 1, 1, 0, 0], "b": [0, 0, 0, 0, 1, 0]}
    assert listed.mean_positives == pytest.approx(1.5)
    # an image answered in part is left out and counted; a class the model does not know is refused
    AnswerLog(tmp_path / "part.jsonl").record(str(tmp_path / "c.png"), "dog", True)
    with open(tmp_path / "part.jsonl", "a") as fh, open(queue.log.path) as log:
        fh.write(log.read())
    listed = load_audit(str(tmp_path / "part.jsonl"), AUDIT_CLASSES)
    assert len(listed) == 2 and listed.partial == 1
    with pytest.raises(DataError, match="classes the model does not know: tree"):
        load_audit(str(queue.log.path), AUDIT_CLASSES[:-1])


def test_review_by_image_handlers(tmp_path: Path) -> None:
    """The *Review by image* tab's handlers without a browser: one Save answers the labels shown (unticked: no) in
    the Review tab's log, a label answered meanwhile in the Review tab keeps its answer, restart, cap, undo, done."""
    import gradio as gr

    from serve.demo.review_by_image import ImageReviewHandlers

    review = make_review(tmp_path)
    log = default_log_path(review)
    queue = ReviewQueue.open(review)
    queue.per_image = 5
    handlers = ImageReviewHandlers(queue)
    image, card, _, toggles, progress, shown_a = handlers.show()
    assert image.size == (32, 32) and "Which labels are in the image?" in card and "has: cat" in card
    assert toggles.choices == [("dog  0.90", "dog"), ("person  0.70", "person")] and toggles.value == []
    assert json.loads(shown_a) == [str(tmp_path / "a.png"), ["dog", "person"]]
    assert "0 of 6 answered (0 yes, 0 no)" in progress
    _, card, _, toggles, progress, shown_b = handlers.save(shown_a, ["dog"])
    assert log_rows(log) == [("a", "dog", True), ("a", "person", False)]  # unticked: no, in the log on return
    assert "a.png: 1 yes, 1 no" in card and "2 of 6 answered (1 yes, 1 no)" in progress
    assert json.loads(shown_b)[1] == ["car", "dog"] and shown(queue.view()) == ("b", "car")
    assert handlers.refresh(shown_b, progress)[3] == gr.skip()  # picking the tab again keeps the page's ticks
    assert handlers.refresh("", "") == (gr.skip(),) * 6  # picked as the page loads: the page load shows it
    queue.answer(*pair(tmp_path, "b", "car"), True)  # the Review tab answers one of the labels shown meanwhile
    assert Path(json.loads(handlers.refresh(shown_b, progress)[5])[0]).stem == "c"  # picked again: the queue now
    handlers.save(shown_b, ["dog"])  # car keeps that answer: not asked, not written again
    handlers.save(shown_b, ["dog"])  # a second press: nothing new
    assert log_rows(log)[2:] == [("b", "car", True), ("b", "dog", True)]
    with pytest.raises(gr.Error, match="not an image shown"):
        handlers.save("nonsense", [])
    # a restarted demo continues at the next image, capped at per_image labels; undo takes back a whole image
    restarted = ReviewQueue.open(review)
    restarted.per_image = 1
    handlers = ImageReviewHandlers(restarted)
    *_, progress, shown_c = handlers.show()
    assert json.loads(shown_c) == [str(tmp_path / "c.png"), ["bird"]] and "4 of 6 answered" in progress
    assert "nothing to undo" in handlers.undo()[1]
    assert json.loads(handlers.skip(shown_c)[5]) == [str(tmp_path / "c.png"), ["bird"]]  # the only image left
    _, _, _, toggles, _, shown_c2 = handlers.save(shown_c, [])
    assert log_rows(log)[-1] == ("c", "bird", False) and json.loads(shown_c2)[1] == ["tree"]
    _, card, _, _, progress, again = handlers.undo()
    assert again == shown_c and "bird: answer taken back" in card and "4 of 6 answered" in progress
    assert log_rows(log)[-1] == ("c", "bird", None)
    handlers.save(shown_c, ["bird"])
    _, card, _, toggles, progress, last = handlers.save(handlers.show()[5], [])
    assert last == "" and toggles.choices == [] and "6 of 6 answered (4 yes, 2 no)" in progress
    assert "All 6 suggestions answered" in card and f"python -m train ... --review {log.resolve()}</pre>" in card
    # what training reads (--review LOG): the last answer of each pair
    assert AnswerLog(log).read() == {pair(tmp_path, "a", "dog"): True, pair(tmp_path, "a", "person"): False,
                                     pair(tmp_path, "b", "car"): True, pair(tmp_path, "b", "dog"): True,
                                     pair(tmp_path, "c", "bird"): True, pair(tmp_path, "c", "tree"): False}


# ---- the tab in the launched app (with a model: the page's other tabs beside it)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The demo with a model, ``--review`` and ``--audit``, launched on a free loopback port; yields url, folder,
    log, queue, client and the audit queue."""
    from serve.demo.app import build_demo, launch_demo
    from serve.demo.catalog import ExampleSet
    from serve.demo.model_store import ModelStore
    from serve.predictor import Predictor

    root = tmp_path_factory.mktemp("review-app")
    review = make_review(root / "data")
    queue = ReviewQueue.open(review, root / "answers.jsonl")
    queue.per_image = 5  # as the command sets it
    audit = ReviewQueue.open(make_audit(root / "audit"))
    ckpt = make_run(root / "runs", "r", ["bird", "car", "cat", "dog", "person", "tree"], "csv:x")
    store = ModelStore({"r": ckpt}, device="cpu", loaded={"r": Predictor.load(ckpt, device="cpu")})
    demo = build_demo(store, "r", ExampleSet(note="none"), review=queue, audit=audit)
    _, url, _ = launch_demo(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        yield {"url": url, "folder": root / "data", "log": queue.log.path, "queue": queue, "client": client,
               "audit": audit}
    finally:
        demo.close()


#: A laptop screen: the answer tabs' image, question and buttons must fit in it without scrolling.
VIEWPORT = (1366, 768)


def open_browser(url: str, profile: Path) -> DevTools:
    """Headless Chromium showing ``url`` in a :data:`VIEWPORT` window."""
    browser = DevTools(str(CHROMIUM), profile, size=VIEWPORT)
    try:
        browser.open_page(url)
        browser.send("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": VIEWPORT[1],
                                                            "deviceScaleFactor": 1, "mobile": False})
    except BaseException:
        browser.close()
        raise
    return browser


def settle(browser: DevTools, element: str, seconds: float = 1.0, timeout: float = 30) -> None:
    """Wait until the JavaScript expression ``element`` names one and the same element for ``seconds``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        browser.evaluate(f"window.settled = {element}")
        time.sleep(seconds)
        if browser.evaluate(f"window.settled !== null && {element} === window.settled"):
            return
    raise TimeoutError(f"{element} kept changing for {timeout} s")


def press(browser: DevTools, key: str, code: str | None = None) -> None:
    """Press and release ``key`` (``code``: its key's name, ``Key<KEY>`` by default)."""
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": code or f"Key{key.upper()}",
                                                **({"text": key} if len(key) == 1 else {})})


def boxes_in_view(browser: DevTools, selectors: list[str]) -> dict[str, dict[str, float]]:
    """Each selector's bounding box (``getBoundingClientRect``), asserted not empty and fully inside the viewport
    of the page scrolled to its top."""
    box = ("(s => { const e = document.querySelector(s); const r = e && e.getBoundingClientRect(); "
           "return r && {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; })")
    script = f"[window.innerWidth, window.innerHeight, window.scrollY, ...{json.dumps(selectors)}.map({box})]"
    width, height, scrolled, *found = browser.evaluate(script)
    assert (width, height, scrolled) == (*VIEWPORT, 0)
    boxes = dict(zip(selectors, found, strict=True))
    for selector, box in boxes.items():
        assert box is not None, f"no {selector} on the page"
        inside = 0 <= box["left"] < box["right"] <= width and 0 <= box["top"] < box["bottom"] <= height
        assert inside, f"{selector} is not inside the {width}x{height} viewport: {box}"
    return boxes


def shows_colour(shot: Path, box: dict[str, float], colour: tuple[int, int, int], share: float) -> bool:
    """Whether at least ``share`` of the screenshot's pixels inside ``box`` (2 px in from its edges) are ``colour``
    (within 40 per channel)."""
    with Image.open(shot) as img:
        crop = img.convert("RGB").crop((int(box["left"]) + 2, int(box["top"]) + 2, int(box["right"]) - 2,
                                        int(box["bottom"]) - 2))
        pixels = list(crop.getdata())
    close = sum(all(abs(a - b) <= 40 for a, b in zip(pixel, colour, strict=True)) for pixel in pixels)
    return close >= share * len(pixels) > 0


def check_review_page(browser: DevTools, shot: Path, letter: str, label: str) -> dict[str, dict[str, float]]:
    """At the top of the Review tab asking about ``label`` of image ``letter``: the image, the question and the four
    buttons inside the viewport, the image large and left of the question, and a screenshot of the viewport that
    shows the image's colour at the image's centre and the Yes button's colour in its box; returns the boxes."""
    browser.wait_for(f"document.querySelector('#spml-review-card .question')?.innerText === {json.dumps(label + '?')}"
                     " && document.querySelector('#spml-review-image img')?.complete", timeout=60)
    buttons = [f"#spml-review-{b}" for b in ("yes", "no", "skip", "undo")]
    boxes = boxes_in_view(browser, ["#spml-review-image", "#spml-review-image img", "#spml-review-card .question",
                                    *buttons])
    image, question = boxes["#spml-review-image"], boxes["#spml-review-card .question"]
    assert image["bottom"] - image["top"] >= 0.6 * VIEWPORT[1] and image["right"] <= question["left"]
    data = browser.send("Page.captureScreenshot", {"format": "png"})["data"]
    shot.write_bytes(base64.b64decode(data))
    with Image.open(shot) as img:
        assert img.size == VIEWPORT
    yes = browser.evaluate("getComputedStyle(document.querySelector('#spml-review-yes')).backgroundColor")
    assert shows_colour(shot, boxes["#spml-review-yes"], tuple(int(v) for v in yes[4:-1].split(",")[:3]), 0.5)
    shown_box = boxes["#spml-review-image img"]  # the image, not scaled up, sits at its centre
    x, y = (shown_box["left"] + shown_box["right"]) / 2, (shown_box["top"] + shown_box["bottom"]) / 2
    assert shows_colour(shot, {"left": x - 8, "top": y - 8, "right": x + 8, "bottom": y + 8}, COLOURS[letter], 0.9)
    return boxes


def test_tab_answers_through_the_api(app: dict[str, Any]) -> None:
    client, log, folder = app["client"], app["log"], app["folder"]
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/predict", "/review_show", "/review_yes", "/review_no", "/review_skip", "/review_undo",
            "/review_image_show", "/review_image_save", "/review_image_skip", "/review_image_undo"} <= set(api)
    image, card, progress, first = client.predict(api_name="/review_show")
    assert json.loads(first) == list(pair(folder, "a", "dog")) and image is not None
    assert "dog?" in card and "has: cat" in card and "also suggested: person 0.70" in card
    assert "0 of 6 answered (0 yes, 0 no)" in progress and str(log) in progress
    _, card, progress, second = client.predict(first, api_name="/review_yes")
    assert log_rows(log) == [("a", "dog", True)] and "1 of 6 answered (1 yes, 0 no)" in progress
    assert json.loads(second) == list(pair(folder, "b", "car")) and "car?" in card
    _, _, progress, third = client.predict(second, api_name="/review_no")
    assert log_rows(log) == [("a", "dog", True), ("b", "car", False)] and "(1 yes, 1 no)" in progress
    _, card, progress, again = client.predict(api_name="/review_undo")
    assert log_rows(log) == [("a", "dog", True), ("b", "car", False), ("b", "car", None)]
    assert again == second and "1 of 6 answered (1 yes, 0 no)" in progress and "answer taken back" in card
    _, _, _, after_skip = client.predict(again, api_name="/review_skip")
    assert after_skip == third and len(log_rows(log)) == 3  # a skip writes nothing
    with pytest.raises(Exception, match="not a pair"):
        client.predict("nonsense", api_name="/review_yes")
    assert len(log_rows(log)) == 3


def test_audit_keys_and_filter_in_headless_chromium(app: dict[str, Any], tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    log = app["audit"].log.path
    before = len(log_rows(log))
    browser = open_browser(app["url"], tmp_path / "profile")
    boxes = ("[...document.querySelectorAll('#spml-toggles-labels label')].filter(l => l.offsetParent !== null)"
             ".map(l => l.innerText.trim())")
    try:
        browser.wait_for("(t => t ? (t.click(), true) : false)([...document.querySelectorAll('[role=tab]')]"
                         ".find(t => t.innerText.trim() === 'Audit'))", timeout=60)
        browser.wait_for("document.querySelector('#spml-toggles-card .question')?.innerText", timeout=60)
        assert [b.split()[0] for b in browser.wait_for(f"{boxes}.length === 6 && {boxes}")] == [
            "cat", "dog", "person", "car", "bird", "tree"]
        # at 1366x768 the image, the question, the toggles and the buttons are all in view
        in_view = boxes_in_view(browser, ["#spml-toggles-image", "#spml-toggles-card .question", "#spml-toggles-labels",
                                          "#spml-toggles-save", "#spml-toggles-skip", "#spml-toggles-undo"])
        print("audit boxes at 1366x768:", json.dumps({k: round(v["bottom"]) for k, v in in_view.items()}))
        image = in_view["#spml-toggles-image"]
        assert image["bottom"] - image["top"] >= 0.6 * VIEWPORT[1]
        # the filter narrows the toggles (the ticked given label stays)
        browser.evaluate("document.querySelector('#spml-toggles-filter textarea, #spml-toggles-filter input').focus()")
        browser.send("Input.insertText", {"text": "do"})
        assert [b.split()[0] for b in browser.wait_for(f"{boxes}.length === 2 && {boxes}")] == ["cat", "dog"]
        press(browser, "2", "Digit2")  # in the text box: typed, not a toggle
        assert browser.evaluate("document.activeElement.value") == "do2"
        assert browser.evaluate("document.querySelectorAll('#spml-toggles-labels input:checked').length") == 1
        browser.evaluate("document.activeElement.select()")
        browser.send("Input.insertText", {"text": "do"})
        browser.wait_for(f"{boxes}.length === 2")
        browser.evaluate("document.activeElement.blur()")
        press(browser, "2", "Digit2")  # ticks the second label shown: dog
        browser.wait_for("document.querySelectorAll('#spml-toggles-labels input:checked').length === 2")
        press(browser, "Enter", "Enter")
        progress = "document.querySelector('#spml-toggles-progress').innerText"
        browser.wait_for(f"{progress}.includes('1 of 2 images answered')")
        assert sorted(r for r in log_rows(log)[before:] if r[2]) == [("a", "cat", True), ("a", "dog", True)]
        press(browser, "u")
        browser.wait_for(f"{progress}.includes('0 of 2 images answered')")
        assert len(log_rows(log)) == before + 12 and app["audit"].image_view().images_done == 0
    finally:
        browser.close()


def test_audit_tab_answers_an_image_at_a_time_through_the_api(app: dict[str, Any]) -> None:
    client, audit = app["client"], app["audit"]
    log = audit.log.path
    before = len(log_rows(log))  # the browser test above answers and takes back one image

    def rows() -> list[tuple[str, str, bool | None]]:
        return log_rows(log)[before:]

    image, card, search, labels, progress, shown_image = client.predict(api_name="/audit_show")
    assert Path(shown_image).stem == "a" and image is not None
    assert "Which labels are in the image?" in card and "has: cat" in card and "0 of 2 images answered" in progress
    assert search == "" and labels["value"] == ["cat"] and str(log) in progress
    assert [label for _, label in labels["choices"]] == ["cat", "dog", "person", "car", "bird", "tree"]
    _, card, _, labels, progress, second = client.predict(shown_image, ["cat", "dog"], api_name="/audit_save")
    assert Path(second).stem == "b" and labels["value"] == ["person"] and "1 of 2 images answered" in progress
    assert sorted(r for r in rows() if r[2]) == [("a", "cat", True), ("a", "dog", True)]
    assert len(rows()) == 6 and "a.png: 2 yes, 4 no" in card
    back = client.predict(api_name="/audit_undo")
    assert Path(back[5]).stem == "a" and "taken back" in back[1] and len(rows()) == 12
    skipped = client.predict(back[5], api_name="/audit_skip")
    assert Path(skipped[5]).stem == "b" and len(rows()) == 12  # a skip writes nothing
    with pytest.raises(Exception, match="zebra"):  # not a label of the image: refused, nothing written
        client.predict(skipped[5], ["zebra"], api_name="/audit_save")
    assert len(rows()) == 12
    client.predict(skipped[5], ["person"], api_name="/audit_save")
    last = client.predict(str(app["folder"].parent / "audit" / "a.png"), ["cat"], api_name="/audit_save")
    assert last[5] == "" and "All 2 images answered" in last[1]
    assert f"python -m train ... --method auto --audit {log.resolve()}" in last[1]


def test_review_tab_above_the_fold_and_its_keys_in_headless_chromium(app: dict[str, Any], tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    log, queue = app["log"], app["queue"]
    before = len(log_rows(log))
    first = shown(queue.view())  # the app's state after the tests above, if they ran
    browser = open_browser(app["url"], tmp_path / "profile")
    tab = "[...document.querySelectorAll('[role=tab]')].find(t => t.innerText.trim() === '{}').click()"
    progress = "document.querySelector('#spml-review-progress').innerText"
    question = "document.querySelector('#spml-review-card .question')?.innerText === '{}?'"
    try:
        # the Review tab comes first and is shown; the model's tabs after it, its controls folded away
        tabs = browser.wait_for("[...document.querySelectorAll('[role=tab]')].map(t => t.innerText.trim())")
        assert tabs[:3] == ["Review", "Review by image", "Audit"] and {"Image", "Batch", "API"} <= set(tabs)
        boxes = check_review_page(browser, tmp_path / "review.png", *first)
        print("review boxes at 1366x768:", json.dumps({k: round(v["bottom"]) for k, v in boxes.items()}))
        assert browser.evaluate("(e => !e || e.offsetParent === null)(document.querySelector('#spml-rules'))")
        done = queue.view().answered
        press(browser, "y")
        browser.wait_for(f"{progress}.includes('{done + 1} of 6 answered')")
        second = shown(queue.view())
        browser.wait_for(question.format(second[1]))
        press(browser, "n")
        browser.wait_for(f"{progress}.includes('{done + 2} of 6 answered')")
        press(browser, "u")  # takes back the No: the pair is asked again
        browser.wait_for(f"{progress}.includes('{done + 1} of 6 answered')")
        browser.wait_for(question.format(second[1]))
        assert "taken back" in browser.evaluate("document.querySelector('#spml-review-card').innerText")
        assert log_rows(log)[before:] == [(*first, True), (*second, False), (*second, None)]
        # while another tab is shown the keys do nothing: the "n" below is not an answer
        browser.evaluate(tab.format("Image"))
        browser.wait_for("document.querySelector('#spml-review-yes')?.offsetParent === null")
        press(browser, "n")
        browser.evaluate(tab.format("Review"))
        browser.wait_for("document.querySelector('#spml-review-yes')?.offsetParent !== null")
        # the model's controls are one click away; a key typed into one of their text fields is text, not an answer
        browser.evaluate("document.querySelector('#spml-settings .label-wrap').click()")
        browser.wait_for("document.querySelector('#spml-rules textarea')?.offsetParent !== null")
        rules = "document.querySelector('#spml-rules textarea')"
        settle(browser, rules)  # the opened panel may mount its fields again: the same textarea for a second
        browser.evaluate("window.typed = ''; document.addEventListener('input', e => { "
                         "if (e.target.closest('#spml-rules')) window.typed += e.data || ''; }, true)")
        browser.wait_for(f"({rules}.focus(), document.activeElement === {rules})")  # focused before the key
        press(browser, "n")
        browser.wait_for("window.typed === 'n'")  # typed into the field as text (Gradio's state may reset it later)
        time.sleep(0.5)  # a key taken as an answer would be in the log by now
        assert log_rows(log)[before:] == [(*first, True), (*second, False), (*second, None)]
        browser.evaluate("document.activeElement.blur()")
        press(browser, "u")  # takes back the Yes: the page is back where it started
        browser.wait_for(question.format(first[1]))
        assert log_rows(log)[before:] == [(*first, True), (*second, False), (*second, None), (*first, None)]
        assert queue.view().answered == done
        check_review_by_image_keys(browser, queue, log)
    finally:
        browser.close()


def test_rounds_status_shows_without_an_answer_in_headless_chromium(tmp_path: Path) -> None:
    """With ``--rounds`` the page polls the progress line: two answers by key start a round, the line says so, and
    the round's end (here its ``train suggest`` fails: the sidecar names a folder that is no run) shows with no
    further event from the reviewer."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    from serve.demo.app import build_demo, launch_demo
    from serve.demo.review_rounds import ReviewRounds

    review = make_review(tmp_path / "data")
    (tmp_path / "not-a-run").mkdir()
    made = {"run": str(tmp_path / "not-a-run"), "runs_dir": None, "top": 6, "per_image": 0, "order": "rare",
            "split": "train", "review": []}
    queue = ReviewQueue.open(review)
    rounds = ReviewRounds(queue, made, every=2)
    demo = build_demo(None, None, review=queue)
    _, url, _ = launch_demo(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    browser = open_browser(url, tmp_path / "profile")
    progress = "document.querySelector('#spml-review-progress').innerText"
    try:
        browser.wait_for(f"{progress}.includes('0 of 6 answered') && {progress}.includes('re-ranks every 2 answers')")
        press(browser, "y")
        browser.wait_for(f"{progress}.includes('1 of 6 answered')")
        press(browser, "n")
        line = browser.wait_for(f"{progress}.includes('2 of 6 answered') && {progress}")
        assert "re-ranking in the background..." in line  # the answer's own reply: the round has just started
        line = browser.wait_for(f"{progress}.includes('re-ranking failed: ') && {progress}", timeout=120)
        assert "2 of 6 answered (1 yes, 1 no)" in line and "config.json" in line, line
        assert len(log_rows(queue.log.path)) == 2 and rounds.round == 1
    finally:
        browser.close()
        rounds.close()
        demo.close()


def check_review_by_image_keys(browser: DevTools, queue: ReviewQueue, log: Path) -> None:
    """In the *Review by image* tab (the model's controls, opened before, folded again): its parts in view, ``1`` ticks
    the first label, Enter saves the image (the rest: no); the Review tab, picked again, asks about a pair still
    pending, and its ``u`` takes back the whole image."""
    before, view, answered = len(log_rows(log)), queue.image_view(), queue.view().answered
    labels = [item.label for item in view.pending]
    assert labels, "the tests before left nothing to answer"
    progress = "document.querySelector('#spml-{}-progress').innerText.includes('{} of 6 answered')"
    boxes = ("[...document.querySelectorAll('#spml-byimage-labels label')].filter(l => l.offsetParent !== null)"
             ".map(l => l.innerText.trim().split(/\\s+/)[0])")
    browser.evaluate("document.querySelector('#spml-settings .label-wrap').click()")  # the model's controls folded
    browser.wait_for("document.querySelector('#spml-rules textarea')?.offsetParent === null")
    browser.evaluate("[...document.querySelectorAll('[role=tab]')].find(t => t.innerText.trim() === "
                     "'Review by image').click()")
    assert browser.wait_for(f"{boxes}.length === {len(labels)} && {boxes}") == labels
    parts = ["image", "card .question", "labels", "save", "skip", "undo"]  # all in view at 1366x768
    boxes_in_view(browser, [f"#spml-byimage-{part}" for part in parts])
    press(browser, "1", "Digit1")
    browser.wait_for("document.querySelectorAll('#spml-byimage-labels input:checked').length === 1")
    press(browser, "Enter", "Enter")
    browser.wait_for(progress.format("byimage", answered + len(labels)))
    image = Path(view.image).stem
    assert log_rows(log)[before:] == [(image, labels[0], True), *((image, label, False) for label in labels[1:])]
    browser.evaluate("[...document.querySelectorAll('[role=tab]')].find(t => t.innerText.trim() === 'Review')"
                     ".click()")
    following = queue.view().item  # the tab shows it on being picked, not the pair it showed before
    browser.wait_for(f"document.querySelector('#spml-review-card .question')?.innerText === '{following.label}?' && "
                     f"document.querySelector('#spml-review-card').innerText.includes({json.dumps(following.image)})")
    press(browser, "u")
    browser.wait_for(progress.format("review", answered))
    assert log_rows(log)[before + len(labels):] == [(image, label, None) for label in labels]


# ---- the command line


def serve_review(review: Path, port: int) -> subprocess.Popen[str]:
    """``python -m serve demo --review REVIEW --port PORT`` (no model under $SPML_RUNS: only the Review tabs),
    once it answers."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False"}
    cmd = [sys.executable, "-m", "serve", "demo", "--review", str(review), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/config", timeout=2).status_code == 200:
                return proc
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"the demo did not start: {proc.communicate()[0]}")


def test_answers_survive_a_killed_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from serve.__main__ import main

    review = make_review(tmp_path)
    log = default_log_path(review)
    port = free_port()
    proc = serve_review(review, port)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        first = client.predict(api_name="/review_show")[3]
        second = client.predict(first, api_name="/review_yes")[3]
        client.predict(second, api_name="/review_no")
        by_image = client.predict(api_name="/review_image_show")[5]  # the Review by image tab: a's last suggestion
        assert json.loads(by_image) == [str(tmp_path / "a.png"), ["person"]]
        client.predict(by_image, [], api_name="/review_image_save")  # unticked: no
        # a second demo on the same answer log is refused while this one runs
        assert main(["demo", "--review", str(review), "--model", str(tmp_path / "no-model.pt")]) == 2
        assert "another demo is reviewing into this answer log" in capsys.readouterr().err
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log_rows(log) == [("a", "dog", True), ("b", "car", False), ("a", "person", False)]
    proc = serve_review(review, port)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        _, card, progress, fourth = client.predict(api_name="/review_show")
        assert json.loads(fourth) == list(pair(tmp_path, "c", "bird"))
        assert "3 of 6 answered (1 yes, 2 no)" in progress and "bird?" in card
        assert json.loads(client.predict(api_name="/review_image_show")[5]) == [str(tmp_path / "c.png"),
                                                                              ["bird", "tree"]]
        config = httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).json()
        assert not any(d.get("api_name") == "predict" for d in config["dependencies"])  # no model: Review only
        if CHROMIUM is not None:  # the page too continues at the next pair, and its next answer is the 4th line
            browser = open_browser(f"http://127.0.0.1:{port}/", tmp_path / "profile")
            try:
                check_review_page(browser, tmp_path / "restarted.png", "c", "bird")
                press(browser, "y")
                browser.wait_for("document.querySelector('#spml-review-card .question')?.innerText === 'dog?'")
                assert "4 of 6 answered (2 yes, 2 no)" in browser.evaluate(
                    "document.querySelector('#spml-review-progress').innerText")
            finally:
                browser.close()
            assert log_rows(log) == [("a", "dog", True), ("b", "car", False), ("a", "person", False),
                                     ("c", "bird", True)]
    finally:
        proc.kill()
        out = proc.communicate()[0]
    assert "only the Review and Review by image tabs" in out and "3 of 6 answered" in out


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from serve.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "--review FILE" in out and "--answers LOG" in out and "Review tab" in out
    assert "--per-image-toggles M" in out and "Review by image" in out
    assert "--rounds N" in out and "every N answers" in out and "0: one fixed order" in out
    review = make_review(tmp_path / "ok")
    gone = make_review(tmp_path / "gone-run")
    gone.with_suffix(".suggest.json").write_text(json.dumps(
        {"run": "/nowhere/run", "runs_dir": None, "top": 6, "per_image": 0, "order": "balanced", "split": "train",
         "review": []}))
    (tmp_path / "empty.csv").write_text("image,label,score\n")
    (tmp_path / "gone.csv").write_text("image,label\n/nowhere/x.png,dog\n")
    cases = [
        (["--review", str(tmp_path / "missing.csv")], "no such review file"),
        (["--review", str(tmp_path / "empty.csv")], "no suggestions"),
        (["--review", str(tmp_path / "gone.csv")], "1 image(s) not found: /nowhere/x.png"),
        (["--review", str(review), "--answers", str(tmp_path / "log.txt")], "an answer log is a .jsonl file"),
        (["--answers", str(tmp_path / "log.jsonl")], "--answers goes with --review"),
        (["--review", str(review), "--per-image-toggles", "0"], "--per-image-toggles must be >= 1"),
        (["--rounds", "5"], "--rounds goes with --review"),
        (["--review", str(review), "--rounds", "-1"], "--rounds must be >= 0"),
        (["--review", str(review), "--rounds", "5"],
         f"--rounds 5: no {review.with_suffix('.suggest.json')} beside it (a file from an older `train suggest`"),
        (["--review", str(gone), "--rounds", "5"], "the run folder /nowhere/run that "),
    ]
    for args, message in cases:
        assert main(["demo", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("python -m serve demo: error: ") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not default_log_path(review).exists()  # nothing written by a refused start
    # without --rounds: rounds of 100 by default, which a file without its sidecar cannot have: one fixed order and
    # why, not a refusal (the start stops at the missing model only)
    assert main(["demo", "--review", str(review), "--model", str(tmp_path / "no-model.pt")]) == 2
    err = capsys.readouterr().err
    assert "model not found" in err and f"one fixed order, no rounds: no {review.with_suffix('.suggest.json')}" in err
    assert main(["demo", "--review", str(review), "--rounds", "0", "--model", str(tmp_path / "no-model.pt")]) == 2
    err = capsys.readouterr().err
    assert "model not found" in err and "rounds" not in err, err
