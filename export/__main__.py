"""``python -m export [RUN_OR_CHECKPOINT]``: write a verified single-file ONNX model of a trained run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

EPILOG = """\
what it writes:
  <run>/export/model.onnx   one self-contained file (weights inside): input "images" float32
                            [batch, 3, S, S] normalised as in training, output "logits" [batch, C];
                            the model metadata (classes, image size, mean/std, thresholds...) is in the
                            ONNX metadata_props under "spml_meta"
  <run>/export/model.json   the same metadata + sha256 of the .onnx, opset, library versions and the
                            parity results
  The .onnx is only put in place after ONNX Runtime (CPU) reproduced the PyTorch logits within --atol
  on real images: the run's validation split (rebuilt from the dataset recorded in the checkpoint) or
  the images of --images FOLDER. Batches of 1 and 3 are checked too (dynamic batch axis).

exit status:
  0  exported and verified
  1  export or verification failed (e.g. logits differ by more than --atol, no validation images)
  2  usage error (bad option, no such run or checkpoint, --images folder missing)

examples:
  python -m export                         # latest run under runs/
  python -m export runs/voc-an --images ~/pics --verify-images 64
  python -m export runs/voc-an/best.pt --output /tmp/tagger.onnx --opset 21
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m export``."""
    from export import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET

    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a trained checkpoint to ONNX (dynamo exporter) and verify it against PyTorch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="RUN_OR_CHECKPOINT",
        help="run folder, run name under --runs-dir, or checkpoint .pt file (default: the latest run's best.pt)",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where runs live (default: $SPML_RUNS if set, else ./runs)",
    )
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        metavar="PATH",
        help="ONNX file to write (default: <run>/export/model.onnx); the sidecar is PATH with .json",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        metavar="N",
        help=f"ONNX opset, {MIN_OPSET}..{MAX_OPSET} (default: %(default)s)",
    )
    parser.add_argument(
        "--images",
        type=Path,
        metavar="FOLDER",
        help="verify on the images of this folder (recursive) instead of the run's validation split",
    )
    parser.add_argument(
        "--verify-images",
        type=int,
        default=DEFAULT_VERIFY_IMAGES,
        metavar="N",
        help="number of images to compare ONNX Runtime and PyTorch on (default: %(default)s)",
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        metavar="X",
        help="maximum allowed absolute logit difference (default: %(default)g)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failed, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad options

    from export import MAX_OPSET, MIN_OPSET
    from train.runs import resolve_checkpoint

    def usage(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return EXIT_USAGE

    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        return usage(f"--opset must be in {MIN_OPSET}..{MAX_OPSET}, got {args.opset}")
    if args.verify_images < 1:
        return usage("--verify-images must be >= 1")
    if not args.atol >= 0:
        return usage("--atol must be >= 0")
    if args.images is not None and not args.images.is_dir():
        return usage(f"--images folder not found: {args.images}")
    if args.output is not None and args.output.suffix.lower() != ".onnx":
        return usage(f"--output must end in .onnx: {args.output}")
    try:
        checkpoint = resolve_checkpoint(args.target, args.runs_dir)
    except FileNotFoundError as exc:
        return usage(str(exc))

    from export.onnx_export import export_onnx  # heavy (torch): only once the arguments are known good
    from export.verify import ExportError

    try:
        result = export_onnx(
            checkpoint,
            args.output,
            opset=args.opset,
            images=args.images,
            verify_images=args.verify_images,
            atol=args.atol,
            runs_dir=args.runs_dir,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except (ExportError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    print(result.summary())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
