"""``python -m export [RUN_OR_CHECKPOINT]``: verified ONNX models and TensorRT engines of a run, with thresholds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from models.command_line import CommandFailed, UsageError, run_command

EPILOG = """\
writes into <run>/export/ (or beside --output): model.onnx + model.json (FP32, the metadata and per-class
thresholds inside), model.fp16.onnx / model.int8-cpu.onnx / model.int8-tensorrt.onnx per --precision,
model.<p>.engine with --trt, calibration reports, summary.md, the model card README.md and tags.csv.
Every artifact is checked (ONNX Runtime vs PyTorch within --atol on --verify-images validation images; FP16
and INT8 against FP32); one that fails is not written. --calibrate auto: f1 on fully labelled validation data,
rate on single-positive data. docs/export.md explains every file, check and threshold mode.

exit status:
  0  exported and verified
  1  export, conversion or verification failed (a bound broken, no validation images, TensorRT missing)
  2  usage error (bad option, no such run or checkpoint, --images folder missing, a bad --audit list, a node
     --int8-keep-float names that the graph does not have)

examples:
  python -m export                                       # latest run: FP32 ONNX, calibrated thresholds
  python -m export runs/voc-an --precision fp32,fp16,int8
  python -m export runs/voc-an --precision int8 --trt --trt-target sm86,sm89
  python -m export runs/voc-an/best.pt --calibrate recall:0.9 --output /tmp/tagger.onnx
  python -m export runs/pets-an --audit pets-audit/labels.csv   # single-positive val + 30 fully labelled images
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m export``."""
    from export import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET

    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a trained checkpoint to ONNX (FP32, FP16, INT8) and TensorRT engines, verify every "
        "artifact, and calibrate per-class thresholds on the validation split.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", metavar="RUN_OR_CHECKPOINT",
                        help="run folder, run name under --runs-dir, or checkpoint .pt file (default: the latest "
                        "run's best.pt)")
    parser.add_argument("--runs-dir", type=Path, default=None, metavar="DIR",
                        help="where runs live (default: $SPML_RUNS if set, else ./runs)")
    parser.add_argument("--output", "-o", type=Path, metavar="PATH",
                        help="ONNX file to write (default: <run>/export/model.onnx); the sidecar is PATH with .json")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, metavar="N",
                        help=f"ONNX opset, {MIN_OPSET}..{MAX_OPSET} (default: %(default)s)")
    parser.add_argument("--images", type=Path, metavar="FOLDER",
                        help="verify on the images of this folder (recursive) instead of the run's validation split")
    parser.add_argument("--verify-images", type=int, default=DEFAULT_VERIFY_IMAGES, metavar="N",
                        help="number of images to compare ONNX Runtime and PyTorch on (default: %(default)s)")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, metavar="X",
                        help="maximum allowed absolute logit difference (default: %(default)g)")
    _precision_options(parser.add_argument_group("precisions, thresholds and TensorRT"))
    return parser


def _precision_options(g: argparse._ArgumentGroup) -> None:
    """``export``: the precisions, their threshold calibration and checks, and the TensorRT engines."""
    from export.int8_sensitivity import DEFAULT_REPORT_ROWS
    from export.options import (
        DEFAULT_CALIBRATION_IMAGES,
        DEFAULT_QAT_EPOCHS,
        DEFAULT_QAT_IMAGES,
        INT8_QAT_MODES,
        OPENVINO_MODES,
    )
    from export.precisions import DEFAULT_MAX_MAP_DROP, PRECISIONS
    from export.quantize import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

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
    g.add_argument("--max-map-drop", type=float, metavar="POINTS",
                   help="validation mAP a converted model may lose against FP32, in points (default: "
                   f"{DEFAULT_MAX_MAP_DROP:g})")
    g.add_argument("--int8-calibration", choices=CALIBRATION_METHODS.names(), default=DEFAULT_CALIBRATION_METHOD,
                   help=f"how INT8 activation ranges are calibrated: {CALIBRATION_METHODS.cli_help()} (default: "
                   "%(default)s; docs/export.md)")
    g.add_argument("--int8-report", action="store_true",
                   help=f"after each INT8 conversion, print its {DEFAULT_REPORT_ROWS} nodes of lowest SQNR against "
                   "FP32 and write every node's to int8-sensitivity.csv beside the model (docs/export.md)")
    g.add_argument("--int8-keep-float", metavar="SPEC",
                   help="INT8 nodes left in float besides the head: comma-separated node names (as --int8-report "
                   "lists them) or worst:N, the N that add the most quantization noise (quantize, rank, quantize "
                   "again)")
    g.add_argument("--int8-qat", choices=INT8_QAT_MODES, default="auto",
                   help="quantization-aware distillation: the network fine-tuned with INT8 rounding simulated to "
                   f"reproduce its FP32 outputs on {DEFAULT_QAT_IMAGES} training images, then quantized (minutes on "
                   "a CPU); auto: only when the post-training INT8 model misses its bounds (default: %(default)s; "
                   "docs/export.md)")
    g.add_argument("--int8-qat-epochs", type=int, default=DEFAULT_QAT_EPOCHS, metavar="N",
                   help="epochs of the distillation (default: %(default)s)")
    g.add_argument("--calibration-images", type=int, default=DEFAULT_CALIBRATION_IMAGES, metavar="N",
                   help="training images for INT8 calibration (default: %(default)s)")
    g.add_argument("--openvino", choices=OPENVINO_MODES, default="auto",
                   help="run the CPU files (fp32, int8) with OpenVINO too, float32 and (on CPUs with bfloat16 "
                   "units) bfloat16, checked against FP32 and timed; one that passes and is at least 10%% faster "
                   "than ONNX Runtime becomes the file's default runtime on this CPU model in python -m serve. auto: "
                   "where openvino is installed (default: %(default)s; docs/export.md)")
    g.add_argument("--trt", action="store_true", help="also build TensorRT engines (one per precision)")
    g.add_argument("--trt-target", metavar="LIST", help="TensorRT for RTX compute targets, e.g. sm86,sm89 "
                   "(default: its portable set; 'current' = this GPU)")
    g.add_argument("--trt-batch", default="1,16,64", metavar="MIN,OPT,MAX",
                   help="engine optimization profile: batch sizes (default: %(default)s)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failed, 2 usage error, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad options
    return run_command(parser.prog, lambda: _export(args), "interrupted; files already verified are kept, the "
                       "one in progress is not written")


def _export(args: argparse.Namespace) -> None:
    """Check the options, then export (the exceptions of :func:`models.command_line.run_command`)."""
    from export.options import ExportOptions
    from models.files.run_folder import resolve_checkpoint

    options = ExportOptions.from_args(args)
    if args.output is not None and args.output.suffix.lower() != ".onnx":
        raise UsageError(f"--output must end in .onnx: {args.output}")
    try:
        checkpoint = resolve_checkpoint(args.target, args.runs_dir)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if args.audit is not None:  # a bad audit list is a usage error, found before the (long) export
        from models.checkpoint import load_checkpoint
        from models.data.audit_list import load_audit
        from models.data.types import DataError

        try:
            load_audit(args.audit, list(load_checkpoint(checkpoint).meta.classes))
        except DataError as exc:
            raise UsageError(f"--audit {args.audit}: {exc}") from None
    from export.errors import ExportError, KeepFloatError
    from export.pipeline import export_run  # heavy (torch): once the arguments are good

    try:
        result = export_run(checkpoint, args.output, log=lambda msg: print(msg, file=sys.stderr, flush=True),
                            **options.as_dict())
    except KeepFloatError as exc:  # a node name only the exported graph can refute: still the user's option
        raise UsageError(str(exc)) from None
    except (ExportError, OSError) as exc:
        raise CommandFailed(str(exc)) from exc
    files = len({a.path for a in result.artifacts})
    print(f"wrote {files} model file(s) to {result.folder} (summary: {result.summary_path})")


if __name__ == "__main__":
    sys.exit(main())
