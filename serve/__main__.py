"""``python -m serve tag FOLDER --model MODEL``: tag a folder of images with a trained model.

``python -m serve demo [--model MODEL]``: the Gradio web demo (see :mod:`serve.demo`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve.tag import SidecarSpec, TagPlan

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2
TAG_MAX_PIXELS = 89_478_485  # = serve.tag.DEFAULT_MAX_PIXELS (Pillow's limit); not imported: that loads torch

TAG_EPILOG = """\
outputs:
  run file (--output): every tagged image with the score of every class, in sorted path order.
    JSON Lines (default): {"path": "sub/a.jpg", "scores": {"cat": 0.912345, "dog": 0.01, ...}, "tags": ["cat"]}
    CSV (name ends in .csv): columns path, tags (joined with --separator), then one column per class score.
    path: relative to FOLDER with / separators; scores: sigmoid probability, rounded to 6 decimals; tags:
    classes whose score is >= their threshold, highest score first, at most --top-k.
  sidecars (--sidecar): one text file per image with its tags in score order, joined with --separator:
    photos/sub/a.jpg -> photos/sub/a.txt, or DIR/sub/a.txt with --sidecar-dir DIR (mirrors the tree).
    Images sharing a name stem (a.jpg, a.png) get a.jpg.txt and a.png.txt.
  errors file (--errors, default <output stem>.errors.tsv beside the run file): path<TAB>reason for
    every image that could not be used; also printed on stderr. Such images get no prediction.
  Every file is written atomically (temp file + rename): a killed run leaves no half-written file. Sidecars
  are written as each batch finishes; the run file and the errors file at the end.

existing outputs (--existing):
  skip       resume: an image whose sidecar exists (with --sidecar), else whose path is in the existing
             run file, is not tagged again; its run-file record is kept (default)
  overwrite  tag every image again and replace its outputs
  append     tag every image again; add new tags to an existing sidecar, without duplicates

thresholds: the model's calibrated per-class thresholds (0.5 where it has none); --threshold X sets one
for every class; --thresholds FILE then overrides classes by name: a JSON object {"cat": 0.4, ...} or
lines "cat<TAB>0.4" / "cat,0.4". Classes not in the file keep their threshold; unknown names are an error.

images: files under FOLDER (recursive) with one of these extensions, in any case: %(exts)s
Symlinked files are followed; symlinked folders are not (so link loops cannot recurse). Other files are
ignored. Skipped as errors: unreadable, empty, truncated or non-image files, and images over --max-pixels
(checked from the header before decoding: decompression bombs).

exit status:
  0  every image was tagged (or was already done under --existing skip); --dry-run listed the images
  1  some images could not be used (the others are still written; see the errors file), no images were
     found, or the model could not be loaded / run
  2  usage error: FOLDER or MODEL missing, unsupported model file, bad option value, bad or unknown class
     in --thresholds, existing run file written for other classes (with --existing skip)
  130 interrupted (Ctrl-C): outputs already written are complete, the run file is not rewritten

examples:
  python -m serve tag ~/photos --model runs/voc-an/export/model.onnx
  python -m serve tag ~/photos --model runs/voc-an/best.pt --threshold 0.3 --output photos.jsonl
  python -m serve tag ~/photos -m model.onnx --device cuda --batch-size 64 --sidecar --output photos.csv
  python -m serve tag ~/photos -m model.onnx --sidecar --sidecar-dir captions --existing append --top-k 5
  python -m serve tag ~/photos -m model.onnx --sidecar --dry-run
"""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose epilog may contain ``%(exts)s``, filled in (importing torch) only for --help."""

    def format_help(self) -> str:
        if self.epilog and "%(exts)s" in self.epilog:
            from models.preprocess import IMAGE_EXTENSIONS

            self.epilog = self.epilog % {"exts": " ".join(sorted(IMAGE_EXTENSIONS))}
        return super().format_help()


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

The server listens on 127.0.0.1 only, unless --host says otherwise; --share (off by default) asks Gradio
for a public link. Ctrl-C stops it.

exit status:
  0  the server ran and was stopped
  1  the model could not be loaded (missing runtime or GPU provider, broken file), or the server could not
     start (port in use, gradio missing)
  2  usage error: MODEL not found, no model found under --runs-dir, unsupported model file, bad option value

examples:
  python -m serve demo                                    # newest run under ./runs (or $SPML_RUNS)
  python -m serve demo --model runs/voc-an/export/model.onnx --port 8080
  python -m serve demo --model runs/voc-an --backend onnxruntime --device cuda
"""


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand's options (defaults from :mod:`serve.demo`, which imports nothing heavy)."""
    from serve import demo as d

    demo = sub.add_parser(
        "demo",
        help="start the web demo (Gradio) for a model",
        description="Start a local web page to try a model on images: scores, thresholds, batch, API.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--model",
        "-m",
        metavar="MODEL",
        help="model file (.pt checkpoint, .onnx export, ...), run folder, or run name under --runs-dir "
        "(default: the newest model found under --runs-dir)",
    )
    demo.add_argument(
        "--runs-dir", type=Path, metavar="DIR", help="where to look for runs (default: $SPML_RUNS, else ./runs)"
    )
    demo.add_argument(
        "--backend", metavar="NAME", help="runtime to use, e.g. torch or onnxruntime (default: from the file suffix)"
    )
    demo.add_argument(
        "--device",
        metavar="DEV",
        help="cpu, cuda, cuda:N, tensorrt or tensorrt:N (default: PyTorch uses CUDA when available, ONNX Runtime "
        "uses the CPU); a GPU that cannot be used is an error, never a silent CPU fallback",
    )
    demo.add_argument(
        "--examples", type=Path, metavar="DIR", help="folder of example images (default: built-in dataset test images)"
    )
    demo.add_argument("--host", default=d.DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    demo.add_argument(
        "--port", type=int, metavar="N", help="port (default: the first free one from 7860, or $GRADIO_SERVER_PORT)"
    )
    demo.add_argument("--share", action="store_true", help="also create a public gradio.live link (default: off)")
    demo.add_argument(
        "--max-file-size",
        default=d.DEFAULT_MAX_FILE_SIZE,
        metavar="SIZE",
        help="largest upload accepted, e.g. 5mb, 500kb or 1gb (default: %(default)s)",
    )
    demo.add_argument(
        "--max-pixels",
        type=int,
        default=d.DEFAULT_MAX_PIXELS,
        metavar="N",
        help="largest image accepted, in pixels (width x height), checked before decoding (default: %(default)s)",
    )
    demo.add_argument(
        "--queue-size",
        type=int,
        default=d.DEFAULT_QUEUE_SIZE,
        metavar="N",
        help="requests that may wait in the queue; more are refused (default: %(default)s)",
    )
    demo.add_argument(
        "--concurrency",
        type=int,
        default=d.DEFAULT_CONCURRENCY,
        metavar="N",
        help="model calls run at the same time (default: %(default)s)",
    )
    demo.add_argument(
        "--max-batch-files",
        type=int,
        default=d.DEFAULT_MAX_BATCH_FILES,
        metavar="N",
        help="files tagged per batch request (default: %(default)s)",
    )


def add_tag_parser(sub: argparse._SubParsersAction) -> None:
    """The ``tag`` subcommand's options."""
    from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD

    tag = sub.add_parser(
        "tag",
        help="tag every image in a folder tree: a JSONL/CSV run file and optional sidecar .txt files",
        description="Tag every image under FOLDER with MODEL: one run file with every class score (JSONL or CSV), "
        "optionally one sidecar text file of tags per image.",
        epilog=TAG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tag.add_argument("folder", type=Path, metavar="FOLDER", help="folder to scan for images (recursively)")
    tag.add_argument(
        "--model",
        "-m",
        type=Path,
        required=True,
        metavar="MODEL",
        help="exported .onnx (ONNX Runtime), training checkpoint .pt (PyTorch), or another registered runtime's file",
    )
    tag.add_argument("--backend", metavar="NAME", help="runtime to use (default: from the model file's suffix)")
    tag.add_argument(
        "--device",
        metavar="DEV",
        help="cpu, cuda, cuda:N, tensorrt or tensorrt:N (default: PyTorch uses CUDA when available, ONNX Runtime "
        "uses the CPU); a GPU that cannot be used is an error, never a silent CPU fallback",
    )
    tag.add_argument(
        "--output",
        "-o",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="PATH",
        help=f"run file: JSONL, or CSV when PATH ends in .csv (default: ./{DEFAULT_OUTPUT})",
    )
    tag.add_argument(
        "--errors", type=Path, metavar="PATH", help="errors file, path<TAB>reason (default: <output stem>.errors.tsv)"
    )
    tag.add_argument(
        "--threshold",
        type=float,
        metavar="X",
        help="one probability threshold in [0, 1] for every class (default: the model's calibrated "
        f"per-class thresholds when it has them, else {DEFAULT_THRESHOLD})",
    )
    tag.add_argument(
        "--thresholds", type=Path, metavar="FILE", help="per-class thresholds overriding the others (see below)"
    )
    tag.add_argument("--top-k", type=int, metavar="K", help="write at most K tags per image (all scores are kept)")
    tag.add_argument("--sidecar", action="store_true", help="also write one text file of tags per image")
    tag.add_argument(
        "--sidecar-ext", default=".txt", metavar="EXT", help="sidecar file extension (default: %(default)s)"
    )
    tag.add_argument(
        "--sidecar-dir",
        type=Path,
        metavar="DIR",
        help="write sidecars under DIR, mirroring FOLDER's tree (implies --sidecar; default: next to each image)",
    )
    tag.add_argument("--separator", default=", ", metavar="SEP", help="tag separator (default: %(default)r)")
    tag.add_argument(
        "--existing",
        choices=("skip", "overwrite", "append"),
        default="skip",
        help="what to do with images already done (default: %(default)s; see below)",
    )
    tag.add_argument(
        "--dry-run",
        action="store_true",
        help="list the images that would be tagged (stdout) and how many are already done; loads no model",
    )
    tag.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help="images per inference batch (default: %(default)s)",
    )
    tag.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="image decoding threads, working ahead of the model (default: CPU count, at most 8)",
    )
    tag.add_argument(
        "--max-pixels",
        type=int,
        default=TAG_MAX_PIXELS,
        metavar="N",
        help="largest image accepted, width x height, checked before decoding (default: %(default)s, Pillow's)",
    )
    tag.add_argument("--no-progress", action="store_true", help="do not show the progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m serve`` (subcommands ``tag`` and ``demo``)."""
    parser = _Parser(
        prog="python -m serve",
        description="Serve trained multi-label tagging models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    add_tag_parser(sub)
    add_demo_parser(sub)
    return parser


def _check_tag_args(args: argparse.Namespace) -> str | None:
    """The first usage error of the cheap checks (no torch import), or None."""
    if not args.folder.is_dir():
        return f"folder not found: {args.folder}"
    if not args.model.is_file():
        return f"model not found: {args.model}"
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        return f"--threshold must be in [0, 1], got {args.threshold}"
    if args.thresholds is not None and not args.thresholds.is_file():
        return f"thresholds file not found: {args.thresholds}"
    for name in ("batch_size", "workers", "top_k", "max_pixels"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if not args.separator:
        return "--separator must not be empty"
    return None


def _tag_plan(args: argparse.Namespace) -> tuple[SidecarSpec | None, TagPlan]:
    """(SidecarSpec or None, TagPlan) from the arguments; raises ValueError / FileNotFoundError."""
    from serve.tag import SidecarSpec, plan_tagging

    sidecar = None
    if args.sidecar or args.sidecar_dir is not None:
        ext = args.sidecar_ext if args.sidecar_ext.startswith(".") else "." + args.sidecar_ext
        sidecar = SidecarSpec(ext=ext, separator=args.separator, folder=args.sidecar_dir)
    return sidecar, plan_tagging(args.folder, args.output, args.existing, sidecar)


def _print_dry_run(plan: TagPlan, existing: str) -> int:
    """List the images a run would tag on stdout, the counts on stderr; exit status."""
    for path in plan.todo:
        print(plan.rel(path))
    found = len(plan.todo) + len(plan.done)
    if not found:
        print(f"no image files found under {plan.folder}", file=sys.stderr)
        return EXIT_SOME_FAILED
    print(
        f"dry run: {found} images found, {len(plan.done)} already done (--existing {existing}), "
        f"{len(plan.todo)} would be tagged; {plan.ignored} non-image files ignored; no model loaded",
        file=sys.stderr,
    )
    return EXIT_OK


def run_tag(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``tag`` with parsed arguments; returns the exit status."""
    prog = f"{parser.prog} tag"

    def fail(message: str, code: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code

    problem = _check_tag_args(args)
    if problem:
        return fail(problem, EXIT_USAGE)
    from serve.tag import OutputConflictError, read_thresholds_file  # heavy (torch): after the cheap checks

    try:
        per_class = read_thresholds_file(args.thresholds) if args.thresholds is not None else None
        sidecar, plan = _tag_plan(args)
    except (ValueError, OSError) as exc:
        return fail(str(exc), EXIT_USAGE)
    if args.dry_run:
        return _print_dry_run(plan, args.existing)
    from serve.predictor import ModelSpecError, Predictor, resolve_thresholds
    from serve.tag import tag_folder, thresholds_source

    try:
        predictor = Predictor.load(args.model, args.backend, args.device, max_pixels=args.max_pixels)
    except ModelSpecError as exc:
        return fail(str(exc), EXIT_USAGE)
    except Exception as exc:  # ModelLoadError and anything a runtime raises: one line, no traceback
        return fail(f"cannot load model: {exc}", EXIT_SOME_FAILED)
    try:
        resolve_thresholds(predictor.meta, args.threshold, per_class)
    except ValueError as exc:
        return fail(f"--thresholds {args.thresholds}: {exc}", EXIT_USAGE)
    print(
        f"model {predictor.path}: {predictor.device_description}; {len(predictor.classes)} classes; thresholds: "
        f"{thresholds_source(predictor.meta, args.threshold, per_class)}; batch {args.batch_size}",
        file=sys.stderr,
    )
    try:
        summary = tag_folder(
            args.folder,
            predictor,
            args.output,
            threshold=args.threshold,
            per_class=per_class,
            top_k=args.top_k,
            batch_size=args.batch_size,
            workers=args.workers,
            progress=not args.no_progress,
            existing=args.existing,
            sidecar=sidecar,
            errors=args.errors,
            max_pixels=args.max_pixels,
        )
    except OutputConflictError as exc:
        return fail(str(exc), EXIT_USAGE)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail(f"{exc}; {args.output} not written", EXIT_SOME_FAILED)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {args.output} not written (finished sidecars are kept)", file=sys.stderr)
        return 130
    if summary.tagged == 0 and summary.skipped == 0 and not summary.failed:
        return fail(f"no image files found under {args.folder}; nothing written", EXIT_SOME_FAILED)
    print(summary.line(), file=sys.stderr)
    if summary.failed:
        print(
            f"{prog}: {len(summary.failed)} of {summary.tagged + len(summary.failed)} images could not be "
            f"used (listed above and in {summary.errors_file})",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return EXIT_OK


def run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``demo`` with parsed arguments: load the model, build the page, serve until Ctrl-C."""
    prog = f"{parser.prog} demo"

    def fail(message: str, code: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code

    for name in ("max_pixels", "queue_size", "concurrency", "max_batch_files"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be >= 1", EXIT_USAGE)
    if args.port is not None and not 0 < args.port < 65536:
        return fail(f"--port must be in 1..65535, got {args.port}", EXIT_USAGE)
    from serve.demo import parse_size

    try:
        parse_size(args.max_file_size)
    except ValueError as exc:
        return fail(f"--max-file-size: {exc}", EXIT_USAGE)
    if args.examples is not None and not args.examples.is_dir():
        return fail(f"examples folder not found: {args.examples}", EXIT_USAGE)
    from train.runs import default_runs_dir

    runs_dir = args.runs_dir if args.runs_dir is not None else default_runs_dir()
    if args.model is not None and not Path(args.model).exists() and not (runs_dir / args.model).is_dir():
        return fail(f"model not found: {args.model} (not a file, a run folder, or a run under {runs_dir})", EXIT_USAGE)
    if args.model is None and not runs_dir.is_dir():
        return fail(f"no runs folder {runs_dir.resolve()}; pass --model FILE or --runs-dir DIR", EXIT_USAGE)
    try:
        import gradio  # noqa: F401 - checked here for a clear message
    except ImportError as exc:
        return fail(f"the demo needs gradio ({exc}); install it with: pip install gradio", EXIT_SOME_FAILED)
    from serve.demo import ModelStore, build_demo, find_examples, find_models, launch_demo
    from serve.predictor import ModelSpecError, Predictor, resolve_model_path

    choices = find_models(runs_dir)
    try:
        if args.model is not None:
            path = resolve_model_path(args.model, args.backend, runs_dir)
        elif choices:
            path = next(iter(choices.values()))
        else:
            return fail(f"no model found under {runs_dir.resolve()}; pass --model FILE (or train one)", EXIT_USAGE)
        key = next((k for k, p in choices.items() if p.resolve() == path.resolve()), str(path))
        if args.backend is not None:  # the picker only offers what the chosen runtime reads
            from serve.runtimes import RUNTIMES

            suffixes = RUNTIMES[args.backend].suffixes if args.backend in RUNTIMES else ()
            choices = {k: p for k, p in choices.items() if p.suffix.lower() in suffixes}
        predictor = Predictor.load(path, args.backend, args.device, max_pixels=args.max_pixels)
    except ModelSpecError as exc:
        return fail(str(exc), EXIT_USAGE)
    except Exception as exc:  # ModelLoadError and anything a runtime raises: one line, no traceback
        return fail(f"cannot load model: {exc}", EXIT_SOME_FAILED)
    store = ModelStore(
        {key: path, **choices},
        backend=args.backend,
        device=args.device,
        max_pixels=args.max_pixels,
        loaded={key: predictor},
    )
    examples = find_examples(predictor.meta, args.examples)
    print(f"model {key}: {predictor.device_description}; examples: {examples.note}", file=sys.stderr)
    demo = build_demo(store, key, examples, max_batch_files=args.max_batch_files)
    try:
        launch_demo(
            demo,
            host=args.host,
            port=args.port,
            share=args.share,
            max_file_size=args.max_file_size,
            queue_size=args.queue_size,
            concurrency=args.concurrency,
        )
    except OSError as exc:
        return fail(f"cannot start the server: {exc}", EXIT_SOME_FAILED)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    if args.command == "tag":
        return run_tag(args, parser)
    if args.command == "demo":
        return run_demo(args, parser)
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
