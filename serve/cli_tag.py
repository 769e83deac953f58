"""``python -m serve tag SOURCE --model MODEL``: the tagger's command line (options, checks, exit codes).

The work itself is done by a tagging engine (:mod:`serve.engines`): ``local`` (default) or ``ray``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from serve import DEVICE_HELP, EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from serve.sidecars import SidecarSpec
    from serve.tag import TagPlan

ENGINE_NAMES = ("local", "ray")  # = serve.engines.ENGINES, spelled out: that module is imported after the checks
TAG_MAX_PIXELS = 89_478_485  # = serve.tag.DEFAULT_MAX_PIXELS (Pillow's limit); not imported: that loads torch

TAG_EPILOG = """\
outputs:
  run file (--output): every tagged image with the score of every class, in sorted path order (both engines).
    JSON Lines (default): {"path": "sub/a.jpg", "scores": {"cat": 0.912345, "dog": 0.01, ...}, "tags": ["cat"]}
    CSV (name ends in .csv): columns path, tags (joined with --separator), then one column per class score.
    path: the image's key (see sources below); scores: sigmoid probability, rounded to 6 decimals; tags:
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

sources (SOURCE):
  a folder     files below it (recursive) with one of these extensions, in any case: %(exts)s
               Symlinked files are followed, symlinked folders are not (no link loops); other files are
               ignored. Key: the path relative to the folder, with / separators.
  a list file  one image path or URI per line (# comments); relative paths are relative to the list file;
               file://, http(s):// and fsspec URIs. Key: the line as written.
  tar shards   WebDataset .tar shards: a file, a glob ('shards/*.tar') or a brace pattern
               ('shards/{000..099}.tar'). Key: <shard file name>/<sample key>.<image ext>.
  --shard K/N keeps part K of N (a CRC-32 of the key, or of the shard file name for tar shards): N jobs
  with K = 1..N tag every image exactly once; combine their run files with
  cat tags.*.jsonl > tags.jsonl (CSV: keep the first header: awk 'FNR > 1 || NR == 1' tags.*.csv).

engines (--engine):
  local  this machine: --workers decode threads ahead of one model (default)
  ray    Ray Data (pip install "spml[ray]"): joins the cluster at --address, else starts a local Ray
         instance; --workers model actors with --gpus-per-worker GPUs each; decoding in Ray tasks. A dead
         actor or a failing batch is retried; results are journaled in <output>.partial as they arrive, so
         an interrupted run resumes with --existing skip.

Skipped as errors: unreadable, empty, truncated or non-image files, and images over --max-pixels
(checked from the header before decoding: decompression bombs).

exit status:
  0  every image was tagged (or was already done under --existing skip); --dry-run listed the images
  1  some images could not be used (the others are still written; see the errors file), no images were
     found, or the model could not be loaded / run
  2  usage error: SOURCE or MODEL missing, unsupported model file, bad option value, bad or unknown class
     in --thresholds, existing run file written for other classes (with --existing skip)
  130 interrupted (Ctrl-C): outputs already written are complete, the run file is not rewritten

examples:
  python -m serve tag ~/photos --model runs/voc-an/export/model.onnx
  python -m serve tag ~/photos --model runs/voc-an/best.pt --threshold 0.3 --output photos.jsonl
  python -m serve tag ~/photos -m model.onnx --device cuda --batch-size 64 --sidecar --output photos.csv
  python -m serve tag ~/photos -m model.onnx --sidecar --sidecar-dir captions --existing append --top-k 5
  python -m serve tag ~/photos -m model.onnx --sidecar --dry-run
  python -m serve tag 'shards/{000..099}.tar' -m model.onnx --shard 3/8 --output tags.3.jsonl
  python -m serve tag urls.txt -m model.onnx --engine ray --address auto --workers 4 --gpus-per-worker 1
"""


def add_tag_parser(sub: argparse._SubParsersAction) -> None:
    """The ``tag`` subcommand's options."""
    from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD

    tag = sub.add_parser(
        "tag",
        help="tag every image of a folder, list file or tar shards: a JSONL/CSV run file, optional sidecars",
        description="Tag every image of SOURCE with MODEL: one run file with every class score (JSONL or CSV), "
        "optionally one sidecar text file of tags per image.",
        epilog=TAG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tag.add_argument(
        "source", metavar="SOURCE", help="folder (scanned recursively), list file of paths/URIs, or .tar shards"
    )
    tag.add_argument(
        "--model",
        "-m",
        type=Path,
        required=True,
        metavar="MODEL",
        help="exported .onnx (ONNX Runtime), training checkpoint .pt (PyTorch), or another registered runtime's file",
    )
    tag.add_argument("--backend", metavar="NAME", help="runtime to use (default: from the model file's suffix)")
    tag.add_argument("--device", metavar="DEV", help=DEVICE_HELP)
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
        help="write sidecars under DIR, mirroring SOURCE's tree (implies --sidecar; default: next to each image)",
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
        help="local engine: image decoding threads, working ahead of the model (default: CPU count, at most 8); "
        "ray engine: model actors (default: 1)",
    )
    tag.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="local",
        help="where the work runs: local (this machine) or ray (Ray Data; see below) (default: %(default)s)",
    )
    tag.add_argument(
        "--address",
        metavar="ADDR",
        help="ray engine: Ray cluster address, e.g. auto or ray://host:10001 (default: start a local Ray instance)",
    )
    tag.add_argument(
        "--gpus-per-worker",
        type=float,
        default=0.0,
        metavar="F",
        help="ray engine: GPUs per model actor, fractions allowed (default: %(default)s, CPU actors)",
    )
    tag.add_argument("--shard", metavar="K/N", help="tag only part K of N of SOURCE (deterministic; see sources below)")
    tag.add_argument(
        "--max-pixels",
        type=int,
        default=TAG_MAX_PIXELS,
        metavar="N",
        help="largest image accepted, width x height, checked before decoding (default: %(default)s, Pillow's)",
    )
    tag.add_argument("--no-progress", action="store_true", help="do not show the progress bar")


def _check_tag_args(args: argparse.Namespace) -> str | None:
    """The first usage error of the cheap checks (no torch import), or None."""
    from serve.sources import Partition, source_kind  # cheap: no torch

    try:
        source_kind(args.source)
        args.partition = Partition.parse(args.shard) if args.shard is not None else None
    except (FileNotFoundError, ValueError) as exc:
        return str(exc)
    if args.engine != "ray" and (args.address is not None or args.gpus_per_worker):
        return "--address and --gpus-per-worker need --engine ray"
    if args.gpus_per_worker < 0:
        return "--gpus-per-worker must be >= 0"
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
    from serve.sidecars import SidecarSpec
    from serve.tag import plan_tagging

    sidecar = None
    if args.sidecar or args.sidecar_dir is not None:
        ext = args.sidecar_ext if args.sidecar_ext.startswith(".") else "." + args.sidecar_ext
        sidecar = SidecarSpec(ext=ext, separator=args.separator, folder=args.sidecar_dir)
    return sidecar, plan_tagging(args.source, args.output, args.existing, sidecar, args.partition)


def _print_dry_run(plan: TagPlan, existing: str) -> int:
    """List the images a run would tag on stdout, the counts on stderr; exit status."""
    todo = 0
    for item in plan.todo:
        print(item.key)
        todo += 1
    found = todo + len(plan.done)
    if not found:
        print(f"no image files found in {plan.source.spec}", file=sys.stderr)
        return EXIT_SOME_FAILED
    print(
        f"dry run: {found} images found, {len(plan.done)} already done (--existing {existing}), "
        f"{todo} would be tagged; {plan.ignored} non-image files ignored; no model loaded",
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
    from serve.records import OutputConflictError  # heavy (torch): after the cheap checks
    from serve.thresholds import read_thresholds_file, resolve_thresholds, thresholds_source

    try:
        per_class = read_thresholds_file(args.thresholds) if args.thresholds is not None else None
        sidecar, plan = _tag_plan(args)
    except (ValueError, OSError) as exc:
        return fail(str(exc), EXIT_USAGE)
    if args.dry_run:
        return _print_dry_run(plan, args.existing)
    from serve.engines import EngineUnavailableError, TagJob, get_engine

    try:
        engine = get_engine(args.engine)
    except EngineUnavailableError as exc:
        return fail(str(exc), EXIT_SOME_FAILED)
    from serve.predictor import ModelSpecError, Predictor

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
        f"{thresholds_source(predictor.meta, args.threshold, per_class)}; batch {args.batch_size}; "
        f"engine {args.engine}",
        file=sys.stderr,
    )
    job = TagJob(
        source=args.source,
        model=args.model,
        output=args.output,
        backend=args.backend,
        device=args.device,
        errors=args.errors,
        threshold=args.threshold,
        per_class=per_class,
        top_k=args.top_k,
        sidecar=sidecar,
        existing=args.existing,
        batch_size=args.batch_size,
        workers=args.workers,
        max_pixels=args.max_pixels,
        progress=not args.no_progress,
        partition=args.partition,
        address=args.address,
        gpus_per_worker=args.gpus_per_worker,
    )
    try:
        summary = engine.run(job, predictor)
    except OutputConflictError as exc:
        return fail(str(exc), EXIT_USAGE)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail(f"{exc}; {args.output} not written", EXIT_SOME_FAILED)
    except KeyboardInterrupt:
        kept = "finished images are journaled: rerun to resume" if args.engine == "ray" else "sidecars are kept"
        print(f"{prog}: interrupted; {args.output} not written ({kept})", file=sys.stderr)
        return 130
    if summary.tagged == 0 and summary.skipped == 0 and not summary.failed:
        return fail(f"no image files found in {args.source}; nothing written", EXIT_SOME_FAILED)
    print(summary.line(), file=sys.stderr)
    if summary.failed:
        print(
            f"{prog}: {len(summary.failed)} of {summary.tagged + len(summary.failed)} images could not be "
            f"used (listed above and in {summary.errors_file})",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return EXIT_OK
