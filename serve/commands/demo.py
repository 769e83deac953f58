"""``python -m serve demo``: the command line of the Gradio web demo (the page itself: :mod:`serve.demo.app`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.command_line import CommandFailed, UsageError, run_command
from serve import BACKEND_HELP, DEVICE_HELP
from serve.commands.tag import add_max_pixels

if TYPE_CHECKING:
    import gradio as gr

    from serve.demo.catalog import ExampleSet
    from serve.demo.model_store import ModelStore
    from serve.demo.review import ReviewQueue
    from serve.demo.review_rounds import ReviewRounds

DEMO_EPILOG = """\
The page shows every class's score against that class's own threshold. Thresholds are the model's
calibrated per-class ones (0.5 where it has none), or one global value from the slider; moving them
re-filters the scores already computed, without running the model again. The Batch tab tags several files
into a table with CSV and JSONL downloads (JSONL lines as written by `serve tag`). The same results are an
HTTP API: /predict returns every class score, the thresholds used and the tags as JSON (see the API tab
and the page footer).

models: the picker lists best.pt and export/ files (.onnx, and other registered runtimes' files) of every
run folder under --runs-dir; --model picks the one shown first (a file, a run folder, or a run name).
examples: --examples DIR, else test images of the model's built-in dataset when it is already generated
in the cache ($SPML_CACHE or ~/.cache/spml); the demo never generates data.

review: --review FILE adds a Review tab to check the labels `python -m train suggest` proposes (labels the
model sees in an image that you never gave), one at a time: Yes (present), No (absent), Skip, Undo, or the
keys y n s u. Each answer is saved at once to the answer log (--answers, default FILE's name with
.answers.jsonl, beside it), and a restarted demo continues where you stopped; train again with
`--review LOG` added to your training command. The page opens on the Review tab, the image and the question
large; the model's controls fold into a panel above the tabs (one click opens it). --review works without a
model: with no --model and no model under --runs-dir, the page has only the Review tabs. The Review by image
tab beside the Review tab shows an image with its most likely suggestions (at most --per-image-toggles) as
toggles, keys 1-9: Save (Enter) answers them all, unticked = no, into the same log.

rounds: every --rounds N answers the demo runs `python -m train suggest` again in the background, the answers
joined to the labels, and the pairs still to answer take the new order (the review file is rewritten with it).
It needs FILE's .suggest.json, written beside it by `train suggest`, and the run folder it names; without
them the order stays fixed. Default: every 100 answers; --rounds 0: one fixed order.

audit: --audit FILE (from `python -m train suggest RUN --audit 50 -o FILE`) adds an Audit tab to label a few
validation images completely: each image with every class as a toggle, the most likely first and its given
label ticked, a filter box for long lists; Save (Enter) answers them all at once (unticked = absent), and the
answers go to FILE's .answers.jsonl beside it, image by image, so a restarted demo continues. Then
`python -m train ... --method auto --audit LOG` chooses the method on them (docs/choosing.md).

The server listens on 127.0.0.1 only, unless --host says otherwise; --share (off by default) asks Gradio
for a public link. Ctrl-C stops it.

exit status:
  0  the server ran and was stopped
  1  the model could not be loaded (missing runtime or GPU provider, broken file), or the server could not
     start (port in use, gradio missing)
  2  usage error: MODEL not found, no model found under --runs-dir, unsupported model file, bad option value,
     a review file that is missing, unreadable, empty or names missing images, an answer log in use, --rounds N
     for a review file without its .suggest.json

examples:
  python -m serve demo                                    # newest run under ./runs (or $SPML_RUNS)
  python -m serve demo --model runs/voc-an/export/model.onnx --port 8080
  python -m serve demo --model runs/voc-an --backend onnxruntime --device cuda
  python -m serve demo --review review.csv                # answers go to review.answers.jsonl
  python -m serve demo --audit audit.csv                  # label 50 images completely
"""


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand's options (defaults from :mod:`serve.demo.app`, which imports nothing heavy)."""
    from serve.demo import app as d
    from serve.demo.review_rounds import DEFAULT_ROUND

    demo = sub.add_parser(
        "demo",
        help="start the web demo (Gradio) for a model",
        description="Start a local web page to try a model on images (scores, thresholds, batch, API) or to "
        "review suggested labels.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--model", "-m", metavar="MODEL",
                      help="model file (.pt checkpoint, .onnx export, ...), run folder, or run name under --runs-dir "
                      "(default: the newest model found under --runs-dir)")
    demo.add_argument("--runs-dir", type=Path, metavar="DIR",
                      help="where to look for runs (default: $SPML_RUNS, else ./runs)")
    demo.add_argument("--backend", metavar="NAME", help=BACKEND_HELP)
    demo.add_argument("--device", metavar="DEV", help=DEVICE_HELP)
    demo.add_argument("--examples", type=Path, metavar="DIR",
                      help="folder of example images (default: built-in dataset test images)")
    demo.add_argument("--host", default=d.DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    demo.add_argument("--port", type=int, metavar="N",
                      help="port (default: the first free one from 7860, or $GRADIO_SERVER_PORT)")
    demo.add_argument("--share", action="store_true", help="also create a public gradio.live link (default: off)")
    demo.add_argument("--max-file-size", default=d.DEFAULT_MAX_FILE_SIZE, metavar="SIZE",
                      help="largest upload accepted, e.g. 5mb, 500kb or 1gb (default: %(default)s)")
    add_max_pixels(demo)
    demo.add_argument("--queue-size", type=int, default=d.DEFAULT_QUEUE_SIZE, metavar="N",
                      help="requests that may wait in the queue; more are refused (default: %(default)s)")
    demo.add_argument("--concurrency", type=int, default=d.DEFAULT_CONCURRENCY, metavar="N",
                      help="model calls run at the same time (default: %(default)s)")
    demo.add_argument("--max-batch-files", type=int, default=d.DEFAULT_MAX_BATCH_FILES, metavar="N",
                      help="files tagged per batch request (default: %(default)s)")
    demo.add_argument("--review", type=Path, metavar="FILE",
                      help="add a Review tab to answer the suggested labels of FILE (CSV or .jsonl, from `python -m "
                      "train suggest`) one at a time, yes or no; works without a model")
    demo.add_argument("--answers", type=Path, metavar="LOG",
                      help="the .jsonl file the review answers are appended to, and read back on start to continue "
                      "(default: FILE with the suffix .answers.jsonl); pass it to training as --review LOG")
    demo.add_argument("--per-image-toggles", type=int, default=5, metavar="M",
                      help="the Review by image tab shows at most M suggestions of an image at a time, the most "
                      "likely first (default: %(default)s)")
    demo.add_argument("--rounds", type=int, metavar="N",
                      help="re-rank the pairs still to review every N answers: `train suggest` runs again in the "
                      "background with the answers, as the review file's .suggest.json (written beside it by `train "
                      f"suggest`) says; 0: one fixed order (default: {DEFAULT_ROUND}, measured: docs/label-review.md)")
    demo.add_argument("--audit", type=Path, metavar="FILE",
                      help="add an Audit tab to label the images of FILE (from `python -m train suggest RUN --audit "
                      "N`) completely, an image at a time; answers go to FILE with the suffix .answers.jsonl; works "
                      "without a model")


def run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``demo`` with parsed arguments: load the model, build the page, serve until Ctrl-C."""
    return run_command(f"{parser.prog} demo", lambda: _demo(args))


def _demo(args: argparse.Namespace) -> None:
    """Check the options, load the model, serve (the exceptions of :func:`models.command_line.run_command`)."""
    _check_options(args)
    made, no_rounds = _rounds_source(args)
    review = _open_review(args.review, args.answers)  # before any model: a bad file fails at once
    if no_rounds:
        print(f"review {args.review}: one fixed order, no rounds: {no_rounds}", file=sys.stderr)
    audit = _open_review(args.audit, None, "audit")
    if review is not None:
        review.per_image = args.per_image_toggles
    from models.files.run_folder import default_runs_dir
    from serve.demo.review_rounds import ReviewRounds

    rounds = ReviewRounds(review, made, args.rounds) if review is not None and made is not None else None
    runs_dir = args.runs_dir if args.runs_dir is not None else default_runs_dir()
    if args.model is not None and not Path(args.model).exists() and not (runs_dir / args.model).is_dir():
        raise UsageError(f"model not found: {args.model} (not a file, a run folder, or a run under {runs_dir})")
    if args.model is None and not runs_dir.is_dir() and review is None and audit is None:
        raise UsageError(f"no runs folder {runs_dir.resolve()}; pass --model FILE or --runs-dir DIR")
    try:
        import gradio  # noqa: F401 - checked here for a clear message
    except ImportError as exc:
        raise CommandFailed(f"the demo needs gradio ({exc}); install it with: pip install gradio") from None
    from serve.demo.app import build_demo
    from serve.demo.catalog import find_models

    if (review is not None or audit is not None) and args.model is None and not find_models(runs_dir):
        names = ["Review", "Review by image"] * (review is not None) + ["Audit"] * (audit is not None)
        tabs = f"{', '.join(names[:-1])} and {names[-1]} tabs" if len(names) > 1 else f"{names[0]} tab"
        print(f"no model under {runs_dir.resolve()}: the page has only the {tabs}", file=sys.stderr)
        _serve(args, build_demo(None, None, review=review, audit=audit), rounds)
        return
    store, key, examples = _load_models(args, runs_dir)
    _serve(args, build_demo(store, key, examples, max_batch_files=args.max_batch_files, review=review, audit=audit),
           rounds)


def _check_options(args: argparse.Namespace) -> None:
    """The option values that need no file (``UsageError``)."""
    for name in ("queue_size", "concurrency", "max_batch_files"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_pixels < 0:
        raise UsageError("--max-pixels must be >= 0 (0 turns the check off)")
    args.max_pixels = args.max_pixels or None
    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    from serve.demo.app import parse_size

    try:
        parse_size(args.max_file_size)
    except ValueError as exc:
        raise UsageError(f"--max-file-size: {exc}") from None
    if args.examples is not None and not args.examples.is_dir():
        raise UsageError(f"examples folder not found: {args.examples}")
    if args.per_image_toggles < 1:
        raise UsageError("--per-image-toggles must be >= 1")
    for option in ("answers", "rounds"):
        if getattr(args, option) is not None and args.review is None:
            raise UsageError(f"--{option} goes with --review FILE")
    if args.rounds is not None and args.rounds < 0:
        raise UsageError("--rounds must be >= 0 (0: one fixed order)")


def _rounds_source(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    """The review file's ``.suggest.json`` for rounds every ``args.rounds`` answers (None: none, and why where it
    lacks); ``UsageError`` for ``--rounds N`` without it."""
    from serve.demo.review_rounds import DEFAULT_ROUND, read_sidecar

    every = DEFAULT_ROUND if args.rounds is None else args.rounds
    if args.review is None or not args.review.is_file() or every == 0:
        return None, ""
    made, why = read_sidecar(args.review)
    if made is None and args.rounds is not None:
        raise UsageError(f"--rounds {every}: {why}")
    args.rounds = every
    return made, why


def _open_review(review: Path | None, answers: Path | None, option: str = "review") -> ReviewQueue | None:
    """The locked queue of ``--review`` / ``--audit`` (None without them); a bad file or busy log: ``UsageError``."""
    if review is None:
        return None
    from models.data.types import DataError
    from serve.demo.review import ReviewQueue, default_log_path

    log = answers if answers is not None else default_log_path(review)
    if log.suffix.lower() != ".jsonl":
        raise UsageError(f"--answers {log}: an answer log is a .jsonl file")
    try:
        queue = ReviewQueue.open(review, log, claim=True)
    except DataError as exc:
        raise UsageError(str(exc)) from None
    progress = queue.view().progress() if option == "review" else queue.image_view().progress()
    print(f"{option} {review}: {progress}; answers go to {log}", file=sys.stderr)
    return queue


def _load_models(args: argparse.Namespace, runs_dir: Path) -> tuple[ModelStore, str, ExampleSet]:
    """The picker's models with the first one loaded, its key and the examples (``UsageError`` / ``CommandFailed``)."""
    from models.runtimes import ModelSpecError
    from serve.demo.catalog import find_examples, find_models
    from serve.demo.model_store import ModelStore
    from serve.model_files import resolve_model_path
    from serve.predictor import Predictor

    choices = find_models(runs_dir)
    if args.model is None and not choices:
        raise UsageError(f"no model found under {runs_dir.resolve()}; pass --model FILE (or train one)")
    try:
        path = resolve_model_path(args.model, args.backend, runs_dir) if args.model is not None else \
            next(iter(choices.values()))
        key = next((k for k, p in choices.items() if p.resolve() == path.resolve()), str(path))
        if args.backend is not None:  # the picker only offers what the chosen runtime reads
            from models.runtimes import runtime_named

            suffixes = runtime_named(args.backend).suffixes
            choices = {k: p for k, p in choices.items() if p.suffix.lower() in suffixes}
        predictor = Predictor.load(path, args.backend, args.device, max_pixels=args.max_pixels)
    except ModelSpecError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # ModelLoadError and anything a runtime raises: one line, no traceback
        raise CommandFailed(f"cannot load model: {exc}") from None
    store = ModelStore({key: path, **choices}, backend=args.backend, device=args.device, max_pixels=args.max_pixels,
                       loaded={key: predictor})
    examples = find_examples(predictor.meta, args.examples)
    print(f"model {key}: {predictor.device_description}; examples: {examples.note}", file=sys.stderr)
    return store, key, examples


def _serve(args: argparse.Namespace, demo: gr.Blocks, rounds: ReviewRounds | None = None) -> None:
    """Launch ``demo`` and serve until Ctrl-C (``CommandFailed`` when the server cannot start); then stop
    ``rounds``."""
    from serve.demo.app import launch_demo

    try:
        launch_demo(demo, host=args.host, port=args.port, share=args.share, max_file_size=args.max_file_size,
                    queue_size=args.queue_size, concurrency=args.concurrency)
    except OSError as exc:
        raise CommandFailed(f"cannot start the server: {exc}") from None
    except KeyboardInterrupt:
        pass  # Ctrl-C stops the server: done
    finally:
        if rounds is not None:
            rounds.close()
