"""``python -m serve tag FOLDER --model MODEL``: tag a folder of images with a trained model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2

TAG_EPILOG = """\
output (JSON Lines, one line per tagged image, in sorted path order):
  {"path": "sub/a.jpg", "scores": {"cat": 0.912345, "dog": 0.01, ...}, "tags": ["cat"]}
  path: relative to FOLDER with / separators; scores: sigmoid probability of every class, rounded to
  6 decimals; tags: classes whose score is >= the threshold, highest score first.

images: files under FOLDER (recursive; symlinked folders are not followed) with one of these
extensions, in any case: %(exts)s
Other files are ignored. Images that cannot be decoded are skipped and listed on stderr with the reason.

exit status:
  0  every image was tagged
  1  some images could not be read (the others are still written), no images were found, or the
     model could not be loaded / run
  2  usage error: FOLDER or MODEL missing, unsupported model file, bad option value

examples:
  python -m serve tag ~/photos --model runs/voc-an/export/model.onnx
  python -m serve tag ~/photos --model runs/voc-an/best.pt --threshold 0.3 --output photos.jsonl
"""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose epilog may contain ``%(exts)s``, filled in (importing torch) only for --help."""

    def format_help(self) -> str:
        if self.epilog and "%(exts)s" in self.epilog:
            from models.preprocess import IMAGE_EXTENSIONS

            self.epilog = self.epilog % {"exts": " ".join(sorted(IMAGE_EXTENSIONS))}
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m serve`` (subcommand ``tag``)."""
    from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD

    parser = _Parser(
        prog="python -m serve",
        description="Serve trained multi-label tagging models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    tag = sub.add_parser(
        "tag",
        help="tag every image in a folder tree, writing JSON Lines",
        description="Tag every image under FOLDER with MODEL and write one JSON line per image.",
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
        help="exported .onnx (runs on ONNX Runtime, CPU) or training checkpoint .pt (runs on PyTorch)",
    )
    tag.add_argument(
        "--output",
        "-o",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="PATH",
        help=f"JSONL file to write, replaced atomically (default: ./{DEFAULT_OUTPUT} in the current directory)",
    )
    tag.add_argument(
        "--threshold",
        type=float,
        metavar="X",
        help="one probability threshold in [0, 1] for every class (default: the model's calibrated "
        f"per-class thresholds when it has them, else {DEFAULT_THRESHOLD})",
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
        help="image decoding threads (default: CPU count, at most 8)",
    )
    tag.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    return parser


def run_tag(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Execute ``tag`` with parsed arguments; returns the exit status."""
    prog = f"{parser.prog} tag"

    def fail(message: str, code: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code

    if not args.folder.is_dir():
        return fail(f"folder not found: {args.folder}", EXIT_USAGE)
    if not args.model.is_file():
        return fail(f"model not found: {args.model}", EXIT_USAGE)
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        return fail(f"--threshold must be in [0, 1], got {args.threshold}", EXIT_USAGE)
    if args.batch_size < 1:
        return fail("--batch-size must be >= 1", EXIT_USAGE)
    if args.workers is not None and args.workers < 1:
        return fail("--workers must be >= 1", EXIT_USAGE)
    from serve.runtimes import load_runtime, runtime_for  # heavy (torch): after the cheap checks
    from serve.tag import tag_folder

    try:
        runtime_for(args.model)
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)

    try:
        runtime = load_runtime(args.model)
    except (ImportError, ValueError, OSError) as exc:
        return fail(f"cannot load model: {exc}", EXIT_SOME_FAILED)
    try:
        summary = tag_folder(
            args.folder,
            runtime,
            args.output,
            threshold=args.threshold,
            batch_size=args.batch_size,
            workers=args.workers,
            progress=not args.no_progress,
        )
    except (ValueError, OSError) as exc:
        return fail(str(exc), EXIT_SOME_FAILED)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {args.output} not written", file=sys.stderr)
        return 130
    if summary.tagged == 0 and not summary.failed:
        return fail(f"no image files found under {args.folder}; nothing written", EXIT_SOME_FAILED)
    print(summary.line(), file=sys.stderr)
    if summary.failed:
        print(
            f"{prog}: {len(summary.failed)} of {summary.tagged + len(summary.failed)} images could not be "
            "read (listed above)",
            file=sys.stderr,
        )
        return EXIT_SOME_FAILED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    if args.command == "tag":
        return run_tag(args, parser)
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
