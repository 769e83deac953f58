"""``python -m serve tag SOURCE --model MODEL``: the tagger's command line (options, checks, exit codes).

The run itself is :mod:`serve.tag`'s pipeline, with a tagging engine (:mod:`serve.engines`): ``local`` (default)
or ``ray``. ``--help`` and usage errors answer without importing torch or a runtime.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from serve import DEFAULT_MAX_PIXELS, DEVICE_HELP, EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE
from serve.engines import DEFAULT_ENGINE, engine_names

if TYPE_CHECKING:
    from serve.tag import TagJob, TagPlan

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
  journal (<output>.partial, every engine): each batch's results are appended and flushed as it finishes;
    the run file is written from it at the end, then it is removed. A run killed at any point (kill -9
    too) resumes with --existing skip and re-tags at most the batches that were in flight; the run file is
    then the one an uninterrupted run writes. A journal written by another model is refused (exit 2).
  Every file is written atomically (temp file + rename): a killed run leaves no half-written file. Sidecars
  are written as each batch finishes; the run file and the errors file at the end.

existing outputs (--existing):
  skip       resume: an image whose sidecar exists (with --sidecar), else whose path is in the existing
             run file or the journal, is not tagged again; its record is kept (default)
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
  ray    Ray (pip install "spml[ray]"): joins the cluster at --address, else starts a local Ray instance.
         --workers model actors (default: one per node, or one per --gpus-per-worker share of the GPUs),
         each loading the model on its own device and decoding its images with --cpus-per-worker threads
         ahead of the model (default: its node's CPUs split between its actors). The driver reads only
         the model's metadata: no torch, no GPU on the head node. A failing batch is retried; a dead actor
         is restarted and its images are tagged again.

Skipped as errors: unreadable, empty, truncated or non-image files, and images over --max-pixels
(checked from the header before decoding: decompression bombs; --max-pixels 0 turns the check off).

exit status:
  0  every image was tagged (or was already done under --existing skip); --dry-run listed the images
  1  some images could not be used (the others are still written; see the errors file), no images were
     found, or the model could not be loaded / run
  2  usage error: SOURCE or MODEL missing, unsupported model file, bad option value, bad or unknown class
     in --thresholds, existing run file or journal written by another model (with --existing skip)
  130 interrupted (Ctrl-C): outputs already written are complete, finished images are in the journal, the
      run file is not rewritten: run again to resume

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
        "ray engine: model actors (default: one per node, or per --gpus-per-worker share of the GPUs)",
    )
    tag.add_argument(
        "--engine",
        choices=engine_names(),
        default=DEFAULT_ENGINE,
        help="where the work runs: local (this machine) or ray (Ray actors; see below) (default: %(default)s)",
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
        help="ray engine: GPUs per model actor, fractions allowed (default: %(default)s, CPU actors; with GPUs "
        "the actors use --device cuda unless told otherwise)",
    )
    tag.add_argument(
        "--cpus-per-worker",
        type=int,
        metavar="N",
        help="ray engine: CPUs per model actor, its decoding threads and the model's CPU threads (default: the "
        "node's CPUs split between the actors it holds)",
    )
    tag.add_argument("--shard", metavar="K/N", help="tag only part K of N of SOURCE (deterministic; see sources below)")
    tag.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        metavar="N",
        help="largest image accepted, width x height, checked before decoding (default: %(default)s, Pillow's; "
        "0 turns the check off)",
    )
    tag.add_argument("--no-progress", action="store_true", help="do not show the progress bar")


def _check_tag_args(args: argparse.Namespace) -> str | None:
    """The first usage error of the cheap checks (no torch import), or None. Option values themselves are
    checked by :class:`serve.tag.TagJob`."""
    from serve.sources import Partition, source_kind

    try:
        source_kind(args.source)
        args.partition = Partition.parse(args.shard) if args.shard is not None else None
    except (FileNotFoundError, ValueError) as exc:
        return str(exc)
    ray_options = ("address", "gpus_per_worker", "cpus_per_worker")
    ray_only = [f"--{n.replace('_', '-')}" for n in ray_options if getattr(args, n)]
    if args.engine != "ray" and ray_only:
        return f"{', '.join(ray_only)} need(s) --engine ray"
    if not args.model.is_file():
        return f"model not found: {args.model}"
    if args.thresholds is not None and not args.thresholds.is_file():
        return f"thresholds file not found: {args.thresholds}"
    if args.max_pixels < 0:
        return "--max-pixels must be >= 0 (0 turns the check off)"
    if not args.separator:
        return "--separator must not be empty"
    return None


def _tag_job(args: argparse.Namespace) -> TagJob:
    """The :class:`~serve.tag.TagJob` of the arguments; raises ``ValueError`` / ``OSError`` (bad values, thresholds
    file) and :class:`~serve.runtimes.ModelSpecError` (unknown device)."""
    from serve.sidecars import SidecarSpec
    from serve.tag import TagJob
    from serve.thresholds import read_thresholds_file

    sidecar = None
    if args.sidecar or args.sidecar_dir is not None:
        ext = args.sidecar_ext if args.sidecar_ext.startswith(".") else "." + args.sidecar_ext
        sidecar = SidecarSpec(ext=ext, separator=args.separator, folder=args.sidecar_dir)
    return TagJob(
        source=args.source,
        model=args.model,
        output=args.output,
        engine=args.engine,
        backend=args.backend,
        device=args.device,
        errors=args.errors,
        threshold=args.threshold,
        per_class=read_thresholds_file(args.thresholds) if args.thresholds is not None else None,
        top_k=args.top_k,
        sidecar=sidecar,
        existing=args.existing,
        batch_size=args.batch_size,
        workers=args.workers,
        max_pixels=args.max_pixels or None,
        progress=not args.no_progress,
        partition=args.partition,
        address=args.address,
        gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker,
    )


def _print_dry_run(plan: TagPlan) -> int:
    """List the images a run would tag on stdout, the counts on stderr; exit status."""
    todo = 0
    for item in plan.todo:
        print(item.key)
        todo += 1
    found = todo + len(plan.done)
    if not found:
        print(f"no image files found in {plan.source.spec}", file=sys.stderr)
        return EXIT_SOME_FAILED
    journaled = f" ({len(plan.journal.offsets)} in the journal of an interrupted run)" if plan.journal.offsets else ""
    print(
        f"dry run: {found} images found, {len(plan.done)} already done{journaled} (--existing "
        f"{plan.job.existing}), {todo} would be tagged; {plan.ignored} non-image files ignored; no model loaded",
        file=sys.stderr,
    )
    return EXIT_OK


def run_tag(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``tag`` with parsed arguments; returns the exit status. Usage errors are found without importing
    torch or a runtime; the model is loaded by the engine, where it runs."""
    prog = f"{parser.prog} tag"

    def fail(message: str, code: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code

    problem = _check_tag_args(args)
    if problem:
        return fail(problem, EXIT_USAGE)
    from serve.engines import EngineUnavailableError, get_engine
    from serve.journal import journal_path
    from serve.records import OutputConflictError
    from serve.runtimes import ModelLoadError, ModelSpecError
    from serve.tag import plan_tagging, run_plan
    from serve.thresholds import thresholds_source

    try:
        job = _tag_job(args)
        plan = plan_tagging(job, read_model=not args.dry_run)
    except ModelSpecError as exc:
        return fail(str(exc), EXIT_USAGE)
    except ModelLoadError as exc:
        return fail(f"cannot load model: {exc}", EXIT_SOME_FAILED)
    except (ValueError, OSError) as exc:
        return fail(str(exc), EXIT_USAGE)
    if args.dry_run:
        return _print_dry_run(plan)
    try:
        get_engine(args.engine)
    except EngineUnavailableError as exc:
        return fail(str(exc), EXIT_SOME_FAILED)
    assert plan.meta is not None
    resumed = f"; resuming: {len(plan.journal.offsets)} results journaled" if plan.journal.offsets else ""
    print(
        f"model {args.model}: {len(plan.meta.classes)} classes; thresholds: "
        f"{thresholds_source(plan.meta, args.threshold, job.per_class)}; batch {args.batch_size}; "
        f"engine {args.engine}{resumed}",
        file=sys.stderr,
    )
    kept = f"finished images are kept in {journal_path(args.output)}: run again to resume"
    try:
        summary = run_plan(plan)
    except ModelSpecError as exc:
        return fail(str(exc), EXIT_USAGE)
    except ModelLoadError as exc:
        return fail(f"cannot load model: {exc}", EXIT_SOME_FAILED)
    except OutputConflictError as exc:
        return fail(str(exc), EXIT_USAGE)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail(f"{exc}; {args.output} not written ({kept})", EXIT_SOME_FAILED)
    except KeyboardInterrupt:
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

