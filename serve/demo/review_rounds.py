"""Rounds of the demo's label review (``serve demo --rounds N``): every N answers, ``python -m train suggest`` ranks the
pairs again in a background process, the answers joined to the labels, and the queue takes the new order
(:meth:`serve.demo.review.ReviewQueue.rerank`). How the review file was made comes from its ``.suggest.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.data.review_file import read_review

if TYPE_CHECKING:
    from serve.demo.review import ReviewQueue

__all__ = ["DEFAULT_ROUND", "ReviewRounds", "read_sidecar"]

#: Answers between two rankings by default (``--rounds``), 0: one ranking. With ``train suggest``'s ``rare`` order,
#: rounds of 100 closed more of the gap on the hidden validation labels than one ranking over the five development
#: sets, at 500 answers and in 30 reviewer-minutes (bench/README.md, review-minutes and review-oos).
DEFAULT_ROUND = 100
#: The lines of a failed round's stderr kept as its note.
ERROR_LINES = 2


def read_sidecar(review_path: Path) -> tuple[dict[str, Any] | None, str]:
    """How ``train suggest`` made the review file (its ``.suggest.json``) and "", or None and why there is none."""
    path = review_path.with_suffix(".suggest.json")
    if not path.is_file():
        return None, f"no {path} beside it (a file from an older `train suggest`: make it again)"
    try:
        made = json.loads(path.read_text(encoding="utf-8"))
        run = Path(made["run"])
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return None, f"{path} cannot be read ({exc!r}): make the file again with `train suggest`"
    if not run.is_dir():
        return None, f"the run folder {made['run']} that {path} names is gone"
    return made, ""


class ReviewRounds:
    """Re-ranks ``queue`` every ``every`` answers with ``train suggest`` as the sidecar ``made`` says, in a daemon
    thread: an answer never waits; a failed round keeps the order and says why in the progress line."""

    def __init__(self, queue: ReviewQueue, made: dict[str, Any], every: int) -> None:
        self.queue, self.made, self.every = queue, made, every
        self.size = len(queue.items)
        self.given = 0
        self.round = 1  # the review file is the first
        self.thread: threading.Thread | None = None
        self.process: subprocess.Popen[str] | None = None
        self.closed = False
        queue.status = f"re-ranks every {every} answers"
        queue.on_answers = self.answered

    def answered(self, count: int) -> None:
        """Count ``count`` answers (under the queue's lock); start a round after ``every`` when none is running."""
        self.given += count
        if self.given >= self.every and self.thread is None and self.queue.pending and not self.closed:
            self.given = 0
            top = max(1, self.size - len(self.queue.answers))
            self.queue.status = "re-ranking in the background..."
            self.thread = threading.Thread(target=self._run, args=(top,), name="review-round", daemon=True)
            self.thread.start()

    def command(self, output: Path, top: int) -> list[str]:
        """The ``train suggest`` command line of a round of ``top`` pairs written to ``output``."""
        m = self.made
        reviews = [arg for file in m["review"] for arg in ("--review", file)]
        return [sys.executable, "-m", "train", "suggest", m["run"], "-o", str(output), "--top", str(top),
                "--per-image", str(m["per_image"]), "--order", m["order"], "--split", m["split"], "--overwrite",
                "--no-progress", "--review", str(self.queue.log.path.resolve()), *reviews,
                *(["--runs-dir", m["runs_dir"]] if m.get("runs_dir") else [])]

    def _run(self, top: int) -> None:
        started = time.monotonic()
        source = self.queue.source
        assert source is not None
        fd, name = tempfile.mkstemp(prefix=f".{source.stem}.round-", suffix=source.suffix, dir=source.parent)
        os.close(fd)
        output = Path(name)
        try:
            with self.queue.lock:
                if self.closed:
                    return
                process = self.process = subprocess.Popen(self.command(output, top), stdout=subprocess.PIPE,
                                                          stderr=subprocess.PIPE, text=True)
            _, err = process.communicate()
            if process.returncode != 0:
                raise RuntimeError(" ".join(err.strip().splitlines()[-ERROR_LINES:]) or f"exit {process.returncode}")
            items = read_review(output)
            with self.queue.lock:
                if not self.closed:
                    self.queue.rerank(items, self.size)
                    self.round += 1
                    self.queue.status = (f"round {self.round} re-ranked {len(self.queue.pending)} pairs in "
                                         f"{time.monotonic() - started:.0f} s")
        except (OSError, ValueError, RuntimeError, KeyError) as exc:  # KeyError: a sidecar lacking one
            with self.queue.lock:
                self.queue.status = f"re-ranking failed: {exc}"
        finally:
            output.unlink(missing_ok=True)
            output.with_suffix(".suggest.json").unlink(missing_ok=True)
            with self.queue.lock:
                self.thread = self.process = None

    def close(self) -> None:
        """Stop: end a running round's process and wait for its thread (no process left behind)."""
        with self.queue.lock:
            self.closed = True
            process, thread = self.process, self.thread
        if process is not None:
            process.terminate()  # the thread's communicate() reaps it
        if thread is not None:
            thread.join(timeout=30)
