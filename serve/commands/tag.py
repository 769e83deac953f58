"""``python -m serve tag SOURCE --model MODEL``: the tagger's command line (options, checks, exit codes)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from models.command_line import CommandFailed, ExitCode, UsageError, run_command
from serve import BACKEND_HELP, DEFAULT_MAX_PIXELS, DEVICE_HELP
from serve.tagging.engines import DEFAULT_ENGINE, engine_names

if TYPE_CHECKING:
    from serve.outputs.caption_rules import CaptionRules
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan

#: Tags shown in the summary table printed after a run (the reports list every tag).
SUMMARY_TOP = 10

TAG_EPILOG = """\
what it writes (docs/tagging-at-scale.md explains every file and option):
  --output        the run file: one record per image with every class score and its tags, sorted by path;
                  JSON Lines, or CSV when the name ends in .csv
  beside it       <stem>.manifest.json (the model, the selection, the thresholds, the caption rules),
                  <stem>.summary.md/.json/.png (--no-summary: none), <stem>.errors.tsv (images not used)
  --sidecar       per image a.jpg -> a.txt (a.json, a.jpg.xmp with --sidecar-format)
  --sort-into     DIR/<tag>/ links to each image of the tag
  A killed run keeps its finished batches in <output>.partial: the same command resumes it.

sources (SOURCE): a folder (recursive, these extensions in any case: %(exts)s; hidden entries skipped,
  symlinked files followed, symlinked folders are not), a list file of paths or URIs, or WebDataset .tar
  shards (a file, a glob or a brace pattern). --shard K/N keeps part K of N.

exit status:
  0  every image was tagged (or was already done under --existing skip); --dry-run listed the images
  1  some images could not be used (the others are still written), none were found, or the model failed
  2  usage error: a bad option, file or class name; outputs written by another model or with other options
  130 interrupted: finished images are kept, run again to resume

examples:
  python -m serve tag dataset/ -m model.onnx --sidecar --first sks --spaces --select mcut --max-tags 30
  python -m serve tag ~/photos -m model.onnx --sort-into ~/photos-by-tag --output photos.jsonl
  python -m serve tag /data/images -m model.onnx --output /data/tags.jsonl --select top-k:5 --no-progress
  python -m serve tag 'shards/{000..099}.tar' -m model.onnx --shard 3/8 --output tags.3.jsonl
  python -m serve tag urls.txt -m model.onnx --engine ray --address auto --workers 4 --gpus-per-worker 1
"""


def add_tag_parser(sub: argparse._SubParsersAction) -> None:
    """The ``tag`` subcommand's options, each with an example."""
    tag = sub.add_parser(
        "tag",
        help="tag every image of a folder, list file or tar shards: a JSONL/CSV run file, sidecars, tag folders",
        description="Tag every image of SOURCE with MODEL: one run file with every class score (JSONL or CSV) and "
        "a summary; optionally sidecar files (txt, json, xmp) and folders of links by tag.",
        epilog=TAG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tag.add_argument(
        "source", metavar="SOURCE",
        help="folder (scanned recursively), list file of paths/URIs, or .tar shards, e.g. ~/photos, urls.txt, "
        "'shards/{000..099}.tar'")
    tag.add_argument(
        "--model", "-m", type=Path, required=True, metavar="MODEL",
        help="exported .onnx (ONNX Runtime), training checkpoint .pt (PyTorch), or another registered runtime's "
        "file, e.g. -m runs/voc-an/export/model.onnx")
    tag.add_argument("--backend", metavar="NAME", help=BACKEND_HELP)
    tag.add_argument("--device", metavar="DEV", help=DEVICE_HELP + ", e.g. --device cuda:1")
    _output_options(tag.add_argument_group("outputs"))
    add_selection_options(tag.add_argument_group("tag selection (see below)"))
    add_caption_options(tag.add_argument_group("caption rules (see below)"))
    _sidecar_options(tag.add_argument_group("sidecars and tag folders"))
    _run_options(tag.add_argument_group("how it runs"))


def _output_options(out: argparse._ArgumentGroup) -> None:
    """``tag``: the run file, its error list and summary, and what an existing run file means (resume)."""
    from serve import DEFAULT_OUTPUT

    out.add_argument(
        "--output", "-o", type=Path, default=DEFAULT_OUTPUT, metavar="PATH",
        help=f"run file: JSONL, or CSV when PATH ends in .csv, e.g. -o photos.csv (default: ./{DEFAULT_OUTPUT})")
    out.add_argument("--errors", type=Path, metavar="PATH",
                     help="errors file, path<TAB>reason, e.g. --errors bad.tsv (default: <output stem>.errors.tsv)")
    out.add_argument("--no-summary", action="store_true",
                     help="do not print the summary table nor write <output stem>.summary.md/.json/.png (e.g. for a "
                     "quick re-run; python -m serve summary RUNFILE makes them later)")
    out.add_argument(
        "--existing", choices=("skip", "overwrite", "append"), default="skip",
        help="what to do with images already done, e.g. --existing append (default: %(default)s; see below)")
    out.add_argument(
        "--dry-run", action="store_true",
        help="list the images that would be tagged (stdout) and how many are already done; loads no model, "
        "e.g. --dry-run | wc -l")


def add_selection_options(sel: argparse._ArgumentGroup) -> None:
    """``tag`` and ``api``: which classes become tags."""
    from serve import DEFAULT_THRESHOLD
    from serve.outputs.selection_modes import DEFAULT_MODE, selection_type

    sel.add_argument(
        "--select", type=selection_type, default=DEFAULT_MODE, metavar="MODE",
        help="how tags are chosen: thresholds (per-class), mcut (largest score gap) or top-k:K, e.g. --select mcut, "
        "--select top-k:5 (default: %(default)s)")
    sel.add_argument(
        "--threshold", type=float, metavar="X",
        help="thresholds mode: one probability threshold in [0, 1] for every class, e.g. --threshold 0.35 "
        f"(default: the model's calibrated per-class thresholds when it has them, else {DEFAULT_THRESHOLD})")
    sel.add_argument("--thresholds", type=Path, metavar="FILE",
                     help="thresholds mode: per-class thresholds overriding the others, e.g. --thresholds mine.json")
    sel.add_argument("--max-tags", type=int, metavar="N",
                     help="at most N tags per image, highest first, with any mode, e.g. --max-tags 20 "
                     "(all scores are kept)")
    sel.add_argument("--top-k", type=int, help=argparse.SUPPRESS)  # deprecated: --max-tags
    sel.add_argument("--min-score", type=float, metavar="X",
                     help="no tag scoring below X, with any mode, e.g. --min-score 0.2")


def add_caption_options(cap: argparse._ArgumentGroup) -> None:
    """``tag`` and ``api``: how the tags are written as captions."""
    cap.add_argument("--exclude", action="append", default=[], metavar="NAME",
                     help="leave out this class (repeatable), e.g. --exclude watermark")
    cap.add_argument("--exclude-re", action="append", default=[], metavar="REGEX",
                     help="leave out every class the regular expression matches (repeatable), e.g. "
                     "--exclude-re '^rating_'")
    cap.add_argument("--replace", action="append", default=[], metavar="OLD=NEW",
                     help="write class OLD as NEW (repeatable), e.g. --replace cat=kitty")
    cap.add_argument("--first", action="append", default=[], metavar="WORD",
                     help="put WORD before every other tag (repeatable; a trigger word), e.g. --first sks")
    cap.add_argument("--spaces", action="store_true",
                     help="underscores as spaces, e.g. long_hair -> long hair (tags of 3 characters or less kept: ^_^)")
    cap.add_argument("--escape", action="store_true", help=r"escape parentheses, e.g. hat_(object) -> hat_\(object\)")
    cap.add_argument("--weights", action="store_true", help="write each tag with its score, e.g. (cat:0.83)")
    cap.add_argument("--caption-rules", type=Path, metavar="FILE",
                     help="a file of caption rules, one per line (see below), e.g. --caption-rules lora.rules")


def _sidecar_options(side: argparse._ArgumentGroup) -> None:
    """``tag``: sidecar files and folders of links by tag."""
    from serve.outputs.sidecar_formats import SIDECAR_FORMATS
    from serve.outputs.tag_folders import DEFAULT_LINK_MODE, DEFAULT_UNTAGGED, LINK_MODES

    side.add_argument("--sidecar", action="store_true",
                      help="also write sidecar files of tags per image (txt unless --sidecar-format says otherwise), "
                      "e.g. photos/a.jpg -> photos/a.txt")
    side.add_argument(
        "--sidecar-format", metavar="LIST",
        help=f"sidecar formats, comma-separated, of {SIDECAR_FORMATS.cli_help()} (implies --sidecar), "
        "e.g. --sidecar-format txt,json (default: txt)")
    side.add_argument("--sidecar-ext", default=".txt", metavar="EXT",
                      help="txt sidecar file extension, e.g. --sidecar-ext .caption (default: %(default)s)")
    side.add_argument(
        "--sidecar-dir", type=Path, metavar="DIR",
        help="write sidecars under DIR, mirroring SOURCE's tree (implies --sidecar), e.g. --sidecar-dir captions "
        "(default: next to each image)")
    side.add_argument("--separator", default=", ", metavar="SEP",
                      help="tag separator of txt sidecars and CSV run files, e.g. --separator ' ' "
                      "(default: %(default)r)")
    side.add_argument("--sort-into", type=Path, metavar="DIR",
                      help="link each image into DIR/<tag>/ for each of its tags, e.g. --sort-into ~/photos-by-tag")
    side.add_argument("--sort-mode", choices=LINK_MODES.names(), default=DEFAULT_LINK_MODE,
                      help=f"how --sort-into places images: {LINK_MODES.cli_help()} (default: %(default)s)")
    side.add_argument("--untagged", default=DEFAULT_UNTAGGED, metavar="NAME",
                      help="--sort-into folder of images without tags, e.g. --untagged unsorted "
                      "(default: %(default)s)")


def _run_options(run: argparse._ArgumentGroup) -> None:
    """``tag``: batches, workers, the engine (local or Ray) and shards."""
    from serve import DEFAULT_BATCH_SIZE

    run.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, metavar="N",
        help="images per inference batch, e.g. --batch-size 64 (default: %(default)s)")
    run.add_argument(
        "--workers", type=int, metavar="N",
        help="local engine: image decoding threads, working ahead of the model (default: CPU count, at most 8); "
        "ray engine: model actors (default: one per node, or per --gpus-per-worker share of the GPUs); "
        "e.g. --workers 4")
    run.add_argument(
        "--engine", choices=engine_names(), default=DEFAULT_ENGINE,
        help="where the work runs: local (this machine) or ray (Ray actors; see below), e.g. --engine ray "
        "(default: %(default)s)")
    run.add_argument(
        "--address", metavar="ADDR",
        help="ray engine: Ray cluster address, e.g. auto or ray://host:10001 (default: start a local Ray instance)")
    run.add_argument(
        "--gpus-per-worker", type=float, default=0.0, metavar="F",
        help="ray engine: GPUs per model actor, fractions allowed, e.g. --gpus-per-worker 0.5 (default: "
        "%(default)s, CPU actors; with GPUs the actors use --device cuda unless told otherwise)")
    run.add_argument(
        "--cpus-per-worker", type=int, metavar="N",
        help="ray engine: CPUs per model actor, its decoding threads and the model's CPU threads, e.g. "
        "--cpus-per-worker 8 (default: the node's CPUs split between the actors it holds)")
    run.add_argument("--shard", metavar="K/N",
                     help="tag only part K of N of SOURCE (deterministic; see sources below), e.g. --shard 3/8")
    add_max_pixels(run)
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar, e.g. in batch jobs")


def add_max_pixels(group: argparse._ActionsContainer) -> None:
    """``--max-pixels``, the decompression-bomb limit every serving command takes."""
    group.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="N",
                       help="largest image accepted, width x height, checked before decoding, e.g. --max-pixels "
                       "50000000 (default: %(default)s, Pillow's; 0 turns the check off)")


def _check_tag_args(args: argparse.Namespace) -> None:
    """The cheap checks (no torch import): a :class:`~models.command_line.UsageError` naming the first problem."""
    from serve.tagging.sources import Partition, source_kind

    try:
        source_kind(args.source)
        args.partition = Partition.parse(args.shard) if args.shard is not None else None
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    ray_options = ("address", "gpus_per_worker", "cpus_per_worker")
    ray_only = [f"--{n.replace('_', '-')}" for n in ray_options if getattr(args, n)]
    if args.engine != "ray" and ray_only:
        raise UsageError(f"{', '.join(ray_only)} need(s) --engine ray")
    for name, path in (("model", args.model), ("thresholds file", args.thresholds),
                       ("caption rules file", args.caption_rules)):
        if path is not None and not path.is_file():
            raise UsageError(f"{name} not found: {path}")
    if args.max_pixels < 0:
        raise UsageError("--max-pixels must be >= 0 (0 turns the check off)")
    if not args.separator:
        raise UsageError("--separator must not be empty")
    args.rules = caption_rules_of(args)


def caption_rules_of(args: argparse.Namespace) -> CaptionRules:
    """The caption rules of the flags and ``--caption-rules FILE`` (``UsageError`` on a bad rule or file)."""
    from serve.outputs.caption_rules import CaptionRuleError, combine, make_rules, read_rules_file

    try:
        flags = make_rules(args.exclude, args.exclude_re, args.replace, args.first, args.spaces, args.escape,
                           args.weights)
        return combine(read_rules_file(args.caption_rules), flags) if args.caption_rules else flags
    except CaptionRuleError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the caption rules file: {exc}") from None


def _tag_job(args: argparse.Namespace) -> TagJob:
    """The :class:`~serve.tagging.job.TagJob` of the arguments (``ValueError``, ``OSError``, ``ModelSpecError``)."""
    from serve.outputs.selection_modes import Selection
    from serve.outputs.sidecar_formats import parse_formats
    from serve.outputs.sidecars import DEFAULT_FORMATS, SidecarSpec
    from serve.outputs.tag_folders import TagFolders
    from serve.outputs.thresholds import read_thresholds_file
    from serve.tagging.job import TagJob

    sidecar = None
    if args.sidecar or args.sidecar_dir is not None or args.sidecar_format is not None:
        ext = args.sidecar_ext if args.sidecar_ext.startswith(".") else "." + args.sidecar_ext
        formats = parse_formats(args.sidecar_format) if args.sidecar_format is not None else DEFAULT_FORMATS
        sidecar = SidecarSpec(ext=ext, separator=args.separator, folder=args.sidecar_dir, formats=formats)
    sort_into = TagFolders(args.sort_into, args.sort_mode, args.untagged) if args.sort_into is not None else None
    mode, k = args.select
    per_class = read_thresholds_file(args.thresholds) if args.thresholds is not None else None
    return TagJob(
        args.source, args.model, args.output,
        # how tags are chosen and written
        threshold=args.threshold, per_class=per_class, selection=Selection(mode, k), max_tags=args.max_tags,
        top_k=args.top_k, min_score=args.min_score, rules=args.rules,
        # the output files
        errors=args.errors, sidecar=sidecar, tag_separator=args.separator, sort_into=sort_into,
        summary=not args.no_summary, existing=args.existing,
        # how it runs, and the Ray cluster
        engine=args.engine, backend=args.backend, device=args.device, batch_size=args.batch_size,
        workers=args.workers, max_pixels=args.max_pixels or None, progress=not args.no_progress,
        partition=args.partition, address=args.address, gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker)


def _print_dry_run(plan: TagPlan) -> None:
    """List the images a run would tag on stdout, the counts on stderr."""
    todo = 0
    for item in plan.todo:
        print(item.key)
        todo += 1
    found = todo + len(plan.done)
    if not found:
        raise CommandFailed(f"no image files found in {plan.source.spec}")
    journaled = f" ({len(plan.journal.offsets)} in the journal of an interrupted run)" if plan.journal.offsets else ""
    print(
        f"dry run: {found} images found, {len(plan.done)} already done{journaled} (--existing "
        f"{plan.job.outputs.existing}), {todo} would be tagged; {plan.source.ignored} non-image files ignored; "
        "no model loaded",
        file=sys.stderr)


def run_tag(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``tag`` with parsed arguments; returns the exit status."""
    from serve.tagging.journal import journal_path

    prog = f"{parser.prog} tag"
    kept = f"finished images are kept in {journal_path(args.output)}: run again to resume"
    return run_command(prog, lambda: _tag(args, prog, kept), f"interrupted; {args.output} not written ({kept})")


@contextlib.contextmanager
def _command_errors(failed_suffix: str = "") -> Iterator[None]:
    """The pipeline's errors as the command's: usage errors (model spec, output conflict) or failures."""
    from models.runtimes import ModelLoadError, ModelSpecError
    from serve.outputs.records import OutputConflictError

    try:
        yield
    except (ModelSpecError, OutputConflictError) as exc:
        raise UsageError(str(exc)) from None
    except ModelLoadError as exc:
        raise CommandFailed(f"cannot load model: {exc}") from None
    except (ValueError, OSError, RuntimeError) as exc:
        if not failed_suffix:
            raise UsageError(str(exc)) from None
        raise CommandFailed(f"{exc}; {failed_suffix}") from None


def _tag(args: argparse.Namespace, prog: str, kept: str) -> int:
    """Check, plan and run the tagging of ``args``; ``kept``: where an interrupted run's finished images are."""
    _check_tag_args(args)
    from serve.outputs.run_summary import summary_table
    from serve.outputs.thresholds import thresholds_source
    from serve.tagging.engines import EngineUnavailableError, get_engine
    from serve.tagging.plan import plan_tagging
    from serve.tagging.run import run_plan

    with _command_errors(), warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", DeprecationWarning)
        job = _tag_job(args)
        plan = plan_tagging(job, read_model=not args.dry_run)
    for note in notes:
        print(f"note: {note.message}", file=sys.stderr)
    if args.dry_run:
        _print_dry_run(plan)
        return ExitCode.OK
    try:
        get_engine(args.engine)
    except EngineUnavailableError as exc:
        raise CommandFailed(str(exc)) from None
    assert plan.meta is not None
    resumed = f"; resuming: {len(plan.journal.offsets)} results journaled" if plan.journal.offsets else ""
    chosen = f"thresholds: {thresholds_source(plan.meta, args.threshold, job.choice.per_class)}"
    if job.mode.describe() != "thresholds":
        chosen = f"tags: {job.mode.describe()}" + (f" ({chosen})" if job.mode.uses_thresholds else "")
    print(
        f"model {args.model}: {len(plan.meta.classes)} classes; {chosen}; batch {args.batch_size}; "
        f"engine {args.engine}{resumed}",
        file=sys.stderr)
    if plan.reselected:
        print(f"note: {len(plan.kept)} records kept from an earlier run get their tags chosen again from their "
              "scores with this run's options", file=sys.stderr)
    with _command_errors(f"{args.output} not written ({kept})"):
        summary = run_plan(plan)
    if summary.tagged == 0 and summary.skipped == 0 and not summary.failed:
        raise CommandFailed(f"no image files found in {args.source}; nothing written")
    if summary.counts is not None:
        print(summary_table(summary.counts, top=SUMMARY_TOP))
    print(summary.line(), file=sys.stderr)
    if summary.reports:
        print("summary: " + ", ".join(str(p) for p in summary.reports), file=sys.stderr)
    if summary.failed:
        print(
            f"{prog}: {len(summary.failed)} of "
            f"{summary.tagged + len(summary.failed)} images could not be used (listed above and in "
            f"{summary.errors_file})",
            file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK
