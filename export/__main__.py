"""``python -m export [RUN_OR_CHECKPOINT]``: verified ONNX (FP32/FP16/INT8) models and TensorRT engines of a run,
with per-class thresholds calibrated on validation data."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

EPILOG = """\
what it writes (into <run>/export/ unless --output says otherwise):
  model.onnx            FP32, one self-contained file (weights inside), BatchNorm and LgConv folded: input
                        "images" float32 [batch, 3, S, S] normalised as in training, output "logits"
                        [batch, C]; the model metadata (classes, image size, mean/std, per-class thresholds,
                        how they were calibrated...) is in the ONNX metadata_props under "spml_meta"
  model.json            the same metadata (the source of truth) + sha256, opset, versions, parity results
  model.fp16.onnx       --precision fp16: FP16 weights and compute, float32 input/output (for GPUs)
  model.int8-cpu.onnx   --precision int8: INT8 Q/DQ for ONNX Runtime on CPU (u8 activations, s8 weights),
                        calibrated on --calibration-images training images
  model.int8-tensorrt.onnx  --precision int8 --trt: symmetric INT8 for TensorRT (float bias)
  model.<p>.engine      --trt: TensorRT engine per precision (+ model.<p>.engine.json)
  calibration-<artifact>.md/.json/.png   per-class P/R/F1 at 0.5 vs calibrated, OF1/CF1, PR curves
  summary.md/.json      one row per artifact: size, val mAP, decisions identical to FP32, images/s here
  README.md             the model card: classes, thresholds and how they were calibrated, training data and
                        method, val metrics (and against which labels), the files, the exact tag command
  tags.csv              name,threshold,val_ap per class, for other taggers and spreadsheets

checks (the export fails, and leaves no new model file, when one is broken):
  FP32 ONNX Runtime vs PyTorch logits within --atol on real validation images (batches 1, 3, 16);
  FP16 vs FP32: probabilities within 5e-3 and >= 99.5% identical decisions;
  INT8 vs FP32: val mAP drop <= 0.5 point and >= 99% identical decisions.
  --min-agreement lowers (or raises) the identical-decision bound of every converted model, e.g. for a small
  model whose scores sit close to its thresholds; the summary reports the agreement either way.

thresholds (--calibrate), chosen per artifact on its own validation scores:
  auto          f1 when the validation labels are complete, rate when they are not
  f1            per class, the threshold maximising F1 (classes with < 5 positives: the pooled optimum)
  rate[:K]      for single-positive validation data: per class, the threshold that tags the share of the val
                images its prior says (K x the class's share of the val labels), so images get K tags on
                average; K = expected positives per image: given, else the --audit list's mean, else the run's
                k (known, or estimated by --method auto), else estimated from the val scores (docs/choosing.md)
  pu-f1[:K]     for single-positive validation data: per class, maximise the F1 estimated from the observed
                positives and the class prior (same K)
  pu            for single-positive validation data: per class, maximise recall^2 / P(predicted positive)
                (Lee & Liu 2003), which needs no negatives when positives are labelled at random
  recall:R      per class, the highest threshold with recall >= R
  threshold:X   X for every class (same as --threshold X);  none: keep the checkpoint's thresholds
  Every F1 figure says which labels it was measured against; on single-positive val labels it reads
  "n/a (no full labels)", unless --audit gives a few fully labelled images to measure on.

TensorRT (--trt): with the tensorrt module and a GPU, engines are built for that GPU; otherwise with
TensorRT for RTX (pip install -e ".[trt]"), which needs no GPU and builds for --trt-target (default: its
portable set, Ampere and newer; Hopper needs full TensorRT).

exit status:
  0  exported and verified
  1  export, conversion or verification failed (a bound broken, no validation images, TensorRT missing)
  2  usage error (bad option, no such run or checkpoint, --images folder missing, a bad --audit list)

examples:
  python -m export                                       # latest run: FP32 ONNX, F1-calibrated thresholds
  python -m export runs/voc-an --precision fp32,fp16,int8
  python -m export runs/voc-an --precision int8 --trt --trt-target sm86,sm89
  python -m export runs/voc-an/best.pt --calibrate recall:0.9 --output /tmp/tagger.onnx
  python -m export runs/pets-an --audit pets-audit/labels.csv   # single-positive val + 30 fully labelled images
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m export``."""
    from export import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET
    from export.precisions import PRECISIONS
    from export.quantize import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a trained checkpoint to ONNX (FP32, FP16, INT8) and TensorRT engines, verify every "
        "artifact, and calibrate per-class thresholds on the validation split.",
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
    g = parser.add_argument_group("precisions, thresholds and TensorRT")
    g.add_argument("--precision", default="fp32", metavar="LIST",
                   help=f"comma-separated: {PRECISIONS.cli_help()} (default: %(default)s)")
    g.add_argument("--calibrate", default="auto", metavar="MODE",
                   help="threshold calibration: auto, f1, rate[:K], pu-f1[:K], pu, recall:R, threshold:X or none "
                   "(default: auto)")
    g.add_argument("--threshold", type=float, metavar="X", help="one threshold for every class (= --calibrate "
                   "threshold:X)")
    g.add_argument("--audit", metavar="SPEC", help="a few images labelled COMPLETELY (any --data form of python -m "
                   "train, e.g. a labels.csv with all labels of each image): with single-positive val labels, "
                   "its mean number of labels per image is the K of rate / pu-f1, and F1 is measured on it")
    g.add_argument("--val-images", type=int, metavar="N", help="use at most N validation images for calibration "
                   "and the FP16/INT8 checks (default: all)")
    g.add_argument("--min-agreement", type=float, metavar="FRACTION",
                   help="identical thresholded decisions a converted model needs against FP32, 0..1 (default: "
                   "0.995 for fp16, 0.99 for int8)")
    g.add_argument("--int8-calibration", choices=CALIBRATION_METHODS.names(), default=DEFAULT_CALIBRATION_METHOD,
                   help=f"how INT8 activation ranges are calibrated: {CALIBRATION_METHODS.cli_help()} (default: "
                   "%(default)s; docs/export.md)")
    g.add_argument("--calibration-images", type=int, default=256, metavar="N",
                   help="training images for INT8 calibration (default: %(default)s)")
    g.add_argument("--trt", action="store_true", help="also build TensorRT engines (one per precision)")
    g.add_argument("--trt-target", metavar="LIST", help="TensorRT for RTX compute targets, e.g. sm86,sm89 "
                   "(default: its portable set; 'current' = this GPU)")
    g.add_argument("--trt-batch", default="1,16,64", metavar="MIN,OPT,MAX",
                   help="engine optimization profile: batch sizes (default: %(default)s)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failed, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad options

    from export import MAX_OPSET, MIN_OPSET
    from models.files.run_folder import resolve_checkpoint

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

    calibrate_mode = f"threshold:{args.threshold}" if args.threshold is not None else args.calibrate
    try:
        trt_batch = tuple(int(b) for b in args.trt_batch.split(","))
        if len(trt_batch) != 3:
            raise ValueError
    except ValueError:
        return usage(f"--trt-batch takes MIN,OPT,MAX, got {args.trt_batch!r}")
    if args.val_images is not None and args.val_images < 1:
        return usage("--val-images must be >= 1")
    if args.calibration_images < 1:
        return usage("--calibration-images must be >= 1")
    if args.min_agreement is not None and not 0 <= args.min_agreement <= 1:
        return usage(f"--min-agreement is a fraction in 0..1, got {args.min_agreement:g}")

    from export.threshold_calibration import parse_mode  # numpy only
    if args.audit is not None:  # a bad audit list is a usage error, found before the (long) export
        from models.checkpoint import load_checkpoint
        from models.data.audit_list import load_audit
        from models.data.types import DataError

        try:
            load_audit(args.audit, list(load_checkpoint(checkpoint).meta.classes))
        except DataError as exc:
            return usage(f"--audit {args.audit}: {exc}")
    from export.errors import ExportError
    from export.pipeline import export_run  # heavy (torch): once the arguments are good
    from export.precisions import PrecisionBounds, parse_precisions

    try:
        precisions = parse_precisions(args.precision)
        if calibrate_mode not in ("auto", "none"):
            parse_mode(calibrate_mode)
    except ValueError as exc:
        return usage(str(exc))
    bounds = None
    if args.min_agreement is not None:
        bounds = {p: dataclasses.replace(PrecisionBounds.for_precision(p), min_agreement=args.min_agreement)
                  for p in precisions}
    try:
        result = export_run(
            checkpoint,
            args.output,
            precisions=precisions,
            calibrate_mode=calibrate_mode,
            val_images=args.val_images,
            calibration_images=args.calibration_images,
            int8_calibration=args.int8_calibration,
            trt=args.trt,
            trt_targets=args.trt_target.split(",") if args.trt_target else None,
            trt_batch=trt_batch,  # type: ignore[arg-type]
            opset=args.opset,
            images=args.images,
            verify_images=args.verify_images,
            atol=args.atol,
            runs_dir=args.runs_dir,
            progress=args.progress,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
            audit=args.audit,
            bounds=bounds,
        )
    except (ExportError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; files already verified are kept, the one in progress is not written",
              file=sys.stderr)
        return 130
    print(f"wrote {len(result.artifacts)} artifact(s) to {result.folder} (summary: {result.summary_path})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
