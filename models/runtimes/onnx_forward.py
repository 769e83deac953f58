"""A frozen network's forward run by ONNX Runtime on the CPU for feature extraction, exported in memory and checked
against PyTorch; it pays off only on enough work (:func:`worth_exporting`; docs/backbones.md)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from models.runtimes.onnxruntime_backend import import_onnxruntime

__all__ = ["MIN_PIXELS", "onnx_forward", "worth_exporting"]

#: Least work (images x height x width) for which the export pays off: about 1,000 images at 224 px.
MIN_PIXELS = 1000 * 224 * 224


class _Function(nn.Module):
    """``function(network, x)`` as a module, for the exporter."""

    def __init__(self, network: nn.Module, function: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.network, self.function = network, function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self.network, x)


def worth_exporting(images: int, image_size: int, min_pixels: int = MIN_PIXELS) -> bool:
    """Whether ``images`` at ``image_size`` px are enough work for :func:`onnx_forward` to pay off its export."""
    return images * image_size * image_size >= min_pixels


Forward = Callable[[torch.Tensor], torch.Tensor]


def onnx_forward(network: nn.Module, function: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                 example: torch.Tensor, threads: int, rtol: float = 1e-3) -> Forward | str:
    """``x -> function(network, x)`` run by ONNX Runtime on the CPU when it exports and matches PyTorch on ``example``;
    else why not."""
    try:
        ort = import_onnxruntime()
    except ModuleNotFoundError as exc:
        return str(exc)
    module = _Function(network, function).eval()
    example = example.float().cpu().contiguous()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's notes on its own internals
            program = torch.onnx.export(module, (example,), None, dynamo=True, external_data=False, verbose=False,
                                        dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(program.model_proto.SerializeToString(), sess_options=options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # the exporter and ONNX Runtime raise many kinds: PyTorch's forward stays
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    name = session.get_inputs()[0].name

    def forward(x: torch.Tensor) -> torch.Tensor:
        out: Any = session.run(None, {name: x.float().cpu().contiguous().numpy()})[0]
        return torch.from_numpy(np.asarray(out))

    with torch.inference_mode():
        expected = module(example).float()
    got = forward(example)
    scale = float(expected.abs().max()) or 1.0
    difference = float((got - expected).abs().max())
    if got.shape != expected.shape or not difference <= rtol * scale:
        return f"ONNX Runtime's output differs from PyTorch's by {difference:.3g} (scale {scale:.3g})"
    return forward
