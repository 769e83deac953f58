"""``python -m serve tag SOURCE --model MODEL``: the tagger's command line (options, checks, exit codes).

The run itself is :mod:`serve.tagging`'s pipeline, with a tagging engine (:mod:`serve.tagging.engines`): ``local``
(default) or ``ray``. ``--help`` and usage errors answer without importing torch or a runtime.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from serve import DEFAULT_MAX_PIXELS, DEVICE_HELP, EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE
from serve.tagging.engines import DEFAULT_ENGINE, engine_names

if TYPE_CHECKING:
    from serve.tagging.job import TagJob
    from serve.tagging.plan import TagPlan

#: Tags shown in the summary table printed after a run (the reports list every tag).
SUMMARY_TOP = 10

TAG_EPILOG = """\
outputs:
  run file (--output): every tagged image with the score of every class, in sorted path order (both engines).
    JSON Lines (default): {"path": "sub/a.jpg", "scores": {"cat": 0.912345, "dog": 0.01, ...}, "tags": ["cat"]}
    CSV (name ends in .csv): columns path, tags (joined with --separator), then one column per class score.
    path: the image's key (see sources below); scores: sigmoid probability, rounded to 6 decimals; tags: the
    classes chosen by --select (see tag selection), written with the caption rules.
  manifest (<output stem>.manifest.json beside the run file): the model, the selection mode and its values,
    the thresholds and where they come from, the caption rules: what produced the tags.
  summary (<output stem>.summary.md / .json / .png beside it; off with --no-summary): images per tag, tags
    per image, classes never predicted; a short table is printed. python -m serve summary RUNFILE redoes it.
  sidecars (--sidecar, --sidecar-format txt,json,xmp): per image, photos/sub/a.jpg ->
    photos/sub/a.txt    the tags joined with --separator (--sidecar-ext changes .txt)
    photos/sub/a.json   {"tags": [...], "scores": {every class}, "selected": [classes], "selection": "mcut"}
    photos/sub/a.jpg.xmp  the tags as XMP keywords (dc:subject), read by darktable, digiKam, Lightroom...
    or the same under DIR with --sidecar-dir DIR (mirrors the tree). Images sharing a name stem (a.jpg,
    a.png) get a.jpg.txt and a.png.txt. An existing .xmp keeps everything else it holds (ratings, edits).
  tag folders (--sort-into DIR): each image linked into DIR/<tag>/<its path> for each of its tags (tag names
    after --exclude, --replace, --spaces), images without tags into DIR/<--untagged>/. Folder sources only;
    DIR outside SOURCE.
    A re-run adds only what is missing (never a duplicate); an entry that is another file is an error.
    Links are never removed: after changing the selection or the rules, sort into a new DIR.
  errors file (--errors, default <output stem>.errors.tsv beside the run file): path<TAB>reason for
    every image that could not be used; also printed on stderr. Such images get no prediction.
  journal (<output>.partial, every engine): each batch's results are appended and flushed as it finishes;
    the run file is written from it at the end, then it is removed. A run killed at any point (kill -9
    too) resumes with --existing skip and re-tags at most the batches that were in flight; the run file is
    then the one an uninterrupted run writes. A journal written by another model is refused (exit 2).
  Every file is written atomically (temp file + rename): a killed run leaves no half-written file. Sidecars
  and links are made as each batch finishes; the run file and the errors file at the end.

tag selection (--select, then --min-score and --max-tags, with any mode; tags come highest score first):
  thresholds  every class whose score reaches its own threshold (default): the model's calibrated per-class
              thresholds (0.5 where it has none); --threshold X sets one for every class; --thresholds FILE
              then overrides classes by name: a JSON object {"cat": 0.4, ...} or lines "cat<TAB>0.4" /
              "cat,0.4". Classes not in the file keep their threshold; unknown names are an error.
  mcut        per image: sort its scores, find the largest gap between two neighbours, keep the classes
              above it (MCut, Largeron et al. 2012); no threshold needed. Pair it with --min-score.
  top-k:K     the K highest scores of every image.
  Selection compares the scores as stored (6 decimals): the run file's tags can be recomputed from its scores.

caption rules (for sidecars, the run file's tags and tag folders), applied in this order:
  --exclude NAME / --exclude-re REGEX drop classes; --replace OLD=NEW renames one; --spaces writes
  underscores as spaces (not in tags of 3 characters or less, such as ^_^); --escape writes ( ) as \\( \\);
  --weights writes (tag:0.83); --first WORD puts WORD before all other tags (a trigger word). A rules file
  (--caption-rules FILE) holds the same rules, one per line, the flag without its dashes:
      # captions for a LoRA
      first sks_style
      exclude-re ^rating_
      replace cat=kitty
      spaces
  Flags add to the file's rules. A bad rule (an invalid regex, a rule naming a class the model does not have)
  is a usage error (exit 2) naming the rule, found before the model loads.

existing outputs (--existing):
  skip       resume: an image whose sidecars all exist (with --sidecar), else whose path is in the existing
             run file or the journal, is not tagged again; its record is kept (default). Kept records are
             tagged again from their stored scores when the options changed (exact, no model call); kept
             sidecars written with other options are refused (exit 2): use the same options, or overwrite.
  overwrite  tag every image again and replace its outputs
  append     tag every image again; add new tags to existing sidecars without duplicates (txt: after the
             tags there; json: its tags merged, scores replaced, its other fields kept; xmp: keywords merged)

sources (SOURCE):
  a folder     files below it (recursive) with one of these extensions, in any case: %(exts)s
               Hidden files and folders (.name) are skipped; symlinked files are followed,
               symlinked folders are not (no link loops); other files are ignored (the rule of
               --data folder:DIR too). Key: the path relative to the folder, with / separators.
  a list file  one image path or URI per line (# comments); relative paths are relative to the list file;
               file://, http(s):// and fsspec URIs. Key: the line as written.
  tar shards   WebDataset .tar shards: a file, a glob ('shards/*.tar') or a brace pattern
               ('shards/{000..099}.tar'). Key: <shard file name>/<sample key>.<image ext>.
  Sidecars and --sort-into need a folder (list entries may be URIs, shard members are not files).
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
     in --thresholds or a caption rule, existing run file or journal written by another model, kept
     sidecars written with other tag options (with --existing skip)
  130 interrupted (Ctrl-C): outputs already written are complete, finished images are in the journal, the
      run file is not rewritten: run again to resume

examples:
  # dataset captions for training another model: a trigger word first, readable tags, one .txt per image
  python -m serve tag dataset/ -m model.onnx --sidecar --first sks --exclude-re '^rating_' --spaces \\
      --select mcut --min-score 0.2 --max-tags 30
  # sort photos into one folder per tag (symbolic links; the photos stay where they are)
  python -m serve tag ~/photos -m model.onnx --sort-into ~/photos-by-tag --output photos.jsonl
  # a JSON run for a database: every score, the chosen tags, a manifest and a summary beside it
  python -m serve tag /data/images -m model.onnx --output /data/tags.jsonl --select top-k:5 --no-progress
  python -m serve tag ~/photos -m model.onnx --sidecar-format xmp,json --existing append
  python -m serve tag ~/photos -m model.onnx --caption-rules captions.rules --sidecar-dir captions
  python -m serve tag ~/photos -m model.onnx --sidecar --dry-run
  python -m serve tag 'shards/{000..099}.tar' -m model.onnx --shard 3/8 --output tags.3.jsonl
  python -m serve tag urls.txt -m model.onnx --engine ray --address auto --workers 4 --gpus-per-worker 1
"""


def add_tag_parser(sub: argparse._SubParsersAction) -> None:
    """The ``tag`` subcommand's options, each with an example."""
    from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD
    from serve.outputs.selection_modes import DEFAULT_MODE, selection_type
    from serve.outputs.sidecar_formats import SIDECAR_FORMATS
    from serve.outputs.tag_folders import DEFAULT_LINK_MODE, DEFAULT_UNTAGGED, LINK_MODES

    tag = sub.add_parser(
        "tag",
        help="tag every image of a folder, list file or tar shards: a JSONL/CSV run file, sidecars, tag folders",
        description="Tag every image of SOURCE with MODEL: one run file with every class score (JSONL or CSV) and "
        "a summary; optionally sidecar files (txt, json, xmp) and folders of links by tag.",
        epilog=TAG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tag.add_argument(
        "source", metavar="SOURCE",
        help="folder (scanned recursively), list file of paths/URIs, or .tar shards, e.g. ~/photos, urls.txt, "
        "'shards/{000..099}.tar'",
    )
    tag.add_argument(
        "--model", "-m", type=Path, required=True, metavar="MODEL",
        help="exported .onnx (ONNX Runtime), training checkpoint .pt (PyTorch), or another registered runtime's "
        "file, e.g. -m runs/voc-an/export/model.onnx",
    )
    tag.add_argument("--backend", metavar="NAME",
                     help="runtime to use, e.g. --backend onnxruntime (default: from the model file's suffix)")
    tag.add_argument("--device", metavar="DEV", help=DEVICE_HELP + ", e.g. --device cuda:1")

    out = tag.add_argument_group("outputs")
    out.add_argument(
        "--output", "-o", type=Path, default=DEFAULT_OUTPUT, metavar="PATH",
        help=f"run file: JSONL, or CSV when PATH ends in .csv, e.g. -o photos.csv (default: ./{DEFAULT_OUTPUT})",
    )
    out.add_argument("--errors", type=Path, metavar="PATH",
                     help="errors file, path<TAB>reason, e.g. --errors bad.tsv (default: <output stem>.errors.tsv)")
    out.add_argument("--no-summary", action="store_true",
                     help="do not print the summary table nor write <output stem>.summary.md/.json/.png (e.g. for a "
                     "quick re-run; python -m serve summary RUNFILE makes them later)")
    out.add_argument(
        "--existing", choices=("skip", "overwrite", "append"), default="skip",
        help="what to do with images already done, e.g. --existing append (default: %(default)s; see below)",
    )
    out.add_argument(
        "--dry-run", action="store_true",
        help="list the images that would be tagged (stdout) and how many are already done; loads no model, "
        "e.g. --dry-run | wc -l",
    )

    sel = tag.add_argument_group("tag selection (see below)")
    sel.add_argument(
        "--select", type=selection_type, default=DEFAULT_MODE, metavar="MODE",
        help="how tags are chosen: thresholds (per-class), mcut (largest score gap) or top-k:K, e.g. --select mcut, "
        "--select top-k:5 (default: %(default)s)",
    )
    sel.add_argument(
        "--threshold", type=float, metavar="X",
        help="thresholds mode: one probability threshold in [0, 1] for every class, e.g. --threshold 0.35 "
        f"(default: the model's calibrated per-class thresholds when it has them, else {DEFAULT_THRESHOLD})",
    )
    sel.add_argument("--thresholds", type=Path, metavar="FILE",
                     help="thresholds mode: per-class thresholds overriding the others, e.g. --thresholds mine.json")
    sel.add_argument("--max-tags", type=int, metavar="N",
                     help="at most N tags per image, highest first, with any mode, e.g. --max-tags 20 "
                     "(all scores are kept)")
    sel.add_argument("--top-k", type=int, help=argparse.SUPPRESS)  # deprecated: --max-tags
    sel.add_argument("--min-score", type=float, metavar="X",
                     help="no tag scoring below X, with any mode, e.g. --min-score 0.2")

    cap = tag.add_argument_group("caption rules (see below)")
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

    side = tag.add_argument_group("sidecars and tag folders")
    side.add_argument("--sidecar", action="store_true",
                      help="also write sidecar files of tags per image (txt unless --sidecar-format says otherwise), "
                      "e.g. photos/a.jpg -> photos/a.txt")
    side.add_argument(
        "--sidecar-format", metavar="LIST",
        help=f"sidecar formats, comma-separated, of {SIDECAR_FORMATS.cli_help()} (implies --sidecar), "
        "e.g. --sidecar-format txt,json (default: txt)",
    )
    side.add_argument("--sidecar-ext", default=".txt", metavar="EXT",
                      help="txt sidecar file extension, e.g. --sidecar-ext .caption (default: %(default)s)")
    side.add_argument(
        "--sidecar-dir", type=Path, metavar="DIR",
        help="write sidecars under DIR, mirroring SOURCE's tree (implies --sidecar), e.g. --sidecar-dir captions "
        "(default: next to each image)",
    )
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

    run = tag.add_argument_group("how it runs")
    run.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, metavar="N",
        help="images per inference batch, e.g. --batch-size 64 (default: %(default)s)",
    )
    run.add_argument(
        "--workers", type=int, metavar="N",
        help="local engine: image decoding threads, working ahead of the model (default: CPU count, at most 8); "
        "ray engine: model actors (default: one per node, or per --gpus-per-worker share of the GPUs); "
        "e.g. --workers 4",
    )
    run.add_argument(
        "--engine", choices=engine_names(), default=DEFAULT_ENGINE,
        help="where the work runs: local (this machine) or ray (Ray actors; see below), e.g. --engine ray "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--address", metavar="ADDR",
        help="ray engine: Ray cluster address, e.g. auto or ray://host:10001 (default: start a local Ray instance)",
    )
    run.add_argument(
        "--gpus-per-worker", type=float, default=0.0, metavar="F",
        help="ray engine: GPUs per model actor, fractions allowed, e.g. --gpus-per-worker 0.5 (default: "
        "%(default)s, CPU actors; with GPUs the actors use --device cuda unless told otherwise)",
    )
    run.add_argument(
        "--cpus-per-worker", type=int, metavar="N",
        help="ray engine: CPUs per model actor, its decoding threads and the model's CPU threads, e.g. "
        "--cpus-per-worker 8 (default: the node's CPUs split between the actors it holds)",
    )
    run.add_argument("--shard", metavar="K/N",
                     help="tag only part K of N of SOURCE (deterministic; see sources below), e.g. --shard 3/8")
    run.add_argument(
        "--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="N",
        help="largest image accepted, width x height, checked before decoding, e.g. --max-pixels 50000000 "
        "(default: %(default)s, Pillow's; 0 turns the check off)",
    )
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar, e.g. in batch jobs")


def _check_tag_args(args: argparse.Namespace) -> str | None:
    """The first usage error of the cheap checks (no torch import), or None. Option values themselves are
    checked by :class:`serve.tagging.job.TagJob`."""
    from serve.tagging.sources import Partition, source_kind

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
    if args.caption_rules is not None and not args.caption_rules.is_file():
        return f"caption rules file not found: {args.caption_rules}"
    if args.top_k is not None:
        if args.max_tags is not None and args.max_tags != args.top_k:
            return "--top-k is the old name of --max-tags: give one of them"
        print("note: --top-k is deprecated, use --max-tags (the same cap)", file=sys.stderr)
        args.max_tags, args.top_k = args.top_k, None
    from serve.outputs.caption_rules import CaptionRuleError, combine, make_rules, read_rules_file

    try:
        flags = make_rules(args.exclude, args.exclude_re, args.replace, args.first, args.spaces, args.escape,
                           args.weights)
        args.rules = combine(read_rules_file(args.caption_rules), flags) if args.caption_rules else flags
    except CaptionRuleError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read the caption rules file: {exc}"
    return None


def _tag_job(args: argparse.Namespace) -> TagJob:
    """The :class:`~serve.tagging.job.TagJob` of the arguments; raises ``ValueError`` / ``OSError`` (bad values,
    thresholds file) and :class:`~models.runtimes.ModelSpecError` (unknown device)."""
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
        selection=Selection(mode, k),
        max_tags=args.max_tags,
        min_score=args.min_score,
        rules=args.rules,
        sidecar=sidecar,
        tag_separator=args.separator,
        sort_into=sort_into,
        summary=not args.no_summary,
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
        f"{plan.job.outputs.existing}), {todo} would be tagged; {plan.ignored} non-image files ignored; "
        "no model loaded",
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
    from models.runtimes import ModelLoadError, ModelSpecError
    from serve.outputs.records import OutputConflictError
    from serve.outputs.run_summary import summary_table
    from serve.outputs.thresholds import thresholds_source
    from serve.tagging.engines import EngineUnavailableError, get_engine
    from serve.tagging.journal import journal_path
    from serve.tagging.plan import plan_tagging
    from serve.tagging.run import run_plan

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
    chosen = f"thresholds: {thresholds_source(plan.meta, args.threshold, job.choice.per_class)}"
    if job.mode.describe() != "thresholds":
        chosen = f"tags: {job.mode.describe()}" + (f" ({chosen})" if job.mode.uses_thresholds else "")
    print(
        f"model {args.model}: {len(plan.meta.classes)} classes; {chosen}; batch {args.batch_size}; "
        f"engine {args.engine}{resumed}",
        file=sys.stderr,
    )
    if plan.reselected:
        print(f"note: {len(plan.kept)} records kept from an earlier run get their tags chosen again from their "
              "scores with this run's options", file=sys.stderr)
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
    if summary.counts is not None:
        print(summary_table(summary.counts, top=SUMMARY_TOP))
    print(summary.line(), file=sys.stderr)
    if summary.reports:
        print("summary: " + ", ".join(str(p) for p in summary.reports), file=sys.stderr)
    if summary.failed:
        print(
            f"{prog}: {len(summary.failed)} of {summary.tagged + len(summary.failed)} images could not be "
            f"used (listed above and in {summary.errors_file})",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return EXIT_OK

