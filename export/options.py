"""The options of an export, :class:`ExportOptions`, each checked in one place (a
:class:`~models.command_line.UsageError`); light, so the command line answers a bad option at once."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.defaults import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_VERIFY_IMAGES, MAX_OPSET, MIN_OPSET
from export.precisions import PRECISIONS, PrecisionBounds, parse_precisions
from models.command_line import UsageError

#: Training images read to calibrate INT8 activation ranges.
DEFAULT_CALIBRATION_IMAGES = 256
#: ``--int8-qat``: auto (quantization-aware distillation when post-training INT8 misses its bounds), on, off.
INT8_QAT_MODES = ("auto", "on", "off")
DEFAULT_QAT_EPOCHS = 2
#: Training images the quantization-aware distillation learns from.
DEFAULT_QAT_IMAGES = 1024
#: ``--openvino``: auto (check the CPU files with OpenVINO where it is installed), on (it must be), off.
OPENVINO_MODES = ("auto", "on", "off")
#: Modes of ``--calibrate`` besides those of :func:`export.threshold_calibration.parse_mode`.
KEEP_MODES = ("auto", "none")


@dataclass(frozen=True)
class ExportOptions:
    """An export's options, by the command line's names (``trt_batch`` = min, opt, max), checked on creation; None
    ``int8_calibration`` / ``bounds``: the defaults of :mod:`export.quantize` / of each precision."""

    precisions: Sequence[str] = ("fp32",)
    calibrate_mode: str = "auto"
    val_images: int | None = None
    calibration_images: int = DEFAULT_CALIBRATION_IMAGES
    int8_calibration: str | None = None
    int8_report: bool = False
    int8_keep_float: str | None = None
    int8_qat: str = "auto"
    int8_qat_epochs: int = DEFAULT_QAT_EPOCHS
    trt: bool = False
    trt_targets: Sequence[str] | None = None
    trt_batch: tuple[int, int, int] = (1, 16, 64)
    bounds: Mapping[str, PrecisionBounds] | None = None
    opset: int = DEFAULT_OPSET
    images: Path | None = None
    verify_images: int = DEFAULT_VERIFY_IMAGES
    atol: float = DEFAULT_ATOL
    runs_dir: Path | None = None
    seed: int = 0
    progress: bool = True
    audit: str | None = None
    openvino: str = "auto"

    def __post_init__(self) -> None:
        from export.int8_sensitivity import parse_keep_float  # numpy only
        from export.threshold_calibration import parse_mode  # numpy only

        try:
            for name in self.precisions:
                PRECISIONS.row(name)  # an unknown name: the one message listing them
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise UsageError(f"--opset must be in {MIN_OPSET}..{MAX_OPSET}, got {self.opset}")
        if self.verify_images < 1:
            raise UsageError("--verify-images must be >= 1")
        if not self.atol >= 0:
            raise UsageError("--atol must be >= 0")
        if self.images is not None and not Path(self.images).is_dir():
            raise UsageError(f"--images folder not found: {self.images}")
        if len(self.trt_batch) != 3:
            raise UsageError(f"--trt-batch takes MIN,OPT,MAX, got {self.trt_batch!r}")
        if self.val_images is not None and self.val_images < 1:
            raise UsageError("--val-images must be >= 1")
        if self.calibration_images < 1:
            raise UsageError("--calibration-images must be >= 1")
        if self.int8_qat not in INT8_QAT_MODES:
            raise UsageError(f"--int8-qat is one of {', '.join(INT8_QAT_MODES)}, got {self.int8_qat!r}")
        if self.openvino not in OPENVINO_MODES:
            raise UsageError(f"--openvino is one of {', '.join(OPENVINO_MODES)}, got {self.openvino!r}")
        if self.openvino == "on" and importlib.util.find_spec("openvino") is None:
            raise UsageError('--openvino on needs the openvino package: pip install -e ".[openvino]"')
        if self.int8_qat_epochs < 1:
            raise UsageError("--int8-qat-epochs must be >= 1")
        try:
            keep_float = parse_keep_float(self.int8_keep_float)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if (self.int8_report or keep_float is not None) and "int8" not in self.precisions:
            option = "--int8-report" if self.int8_report else "--int8-keep-float"
            raise UsageError(f"{option} needs --precision int8")
        if self.calibrate_mode not in KEEP_MODES:
            try:
                parse_mode(self.calibrate_mode)
            except ValueError as exc:
                raise UsageError(str(exc)) from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExportOptions:
        """The options of ``python -m export``'s parsed arguments (:class:`UsageError` on a bad value)."""
        try:
            precisions = parse_precisions(args.precision)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            trt_batch = tuple(int(b) for b in args.trt_batch.split(","))
        except ValueError:
            raise UsageError(f"--trt-batch takes MIN,OPT,MAX, got {args.trt_batch!r}") from None
        changes: dict[str, float] = {}
        if args.min_agreement is not None:
            if not 0 <= args.min_agreement <= 1:
                raise UsageError(f"--min-agreement is a fraction in 0..1, got {args.min_agreement:g}")
            changes["min_agreement"] = args.min_agreement
        if getattr(args, "max_map_drop", None) is not None:
            if not args.max_map_drop >= 0:
                raise UsageError(f"--max-map-drop is mAP points, 0 or more, got {args.max_map_drop:g}")
            changes["max_map_drop"] = args.max_map_drop
        bounds = ({p: dataclasses.replace(PrecisionBounds.for_precision(p), **changes) for p in precisions}
                  if changes else None)
        return cls(
            precisions=tuple(precisions), val_images=args.val_images, calibration_images=args.calibration_images,
            calibrate_mode=f"threshold:{args.threshold}" if args.threshold is not None else args.calibrate,
            int8_calibration=args.int8_calibration, int8_report=args.int8_report, int8_keep_float=args.int8_keep_float,
            int8_qat=args.int8_qat, int8_qat_epochs=args.int8_qat_epochs, trt=args.trt, bounds=bounds,
            trt_targets=tuple(args.trt_target.split(",")) if args.trt_target else None,
            trt_batch=trt_batch,  # type: ignore[arg-type]
            opset=args.opset, images=args.images, verify_images=args.verify_images, atol=args.atol,
            runs_dir=args.runs_dir, progress=args.progress, audit=args.audit, openvino=args.openvino)

    def as_dict(self) -> dict[str, Any]:
        """The options by name, as :func:`export.pipeline.export_run` takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
