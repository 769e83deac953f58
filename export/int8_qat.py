"""Quantization-aware distillation for INT8 (``--int8-qat``): a copy of the network, with INT8 rounding simulated where
ONNX Runtime's Q/DQ graph rounds and batch norms frozen, is trained with Adam to reproduce the FP32 network's sigmoid
outputs on training images (no labels); static quantization then quantizes it. Why and what it gained:
docs/export.md."""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from torch import nn
from tqdm import tqdm

from export.options import DEFAULT_QAT_EPOCHS, DEFAULT_QAT_IMAGES

DEFAULT_QAT_LR = 1e-5
QAT_BATCH = 32
#: Batches of the FP32 network whose activation ranges set the simulated rounding.
RANGE_BATCHES = 8


@dataclass(frozen=True)
class QatRecord:
    """How a quantization-aware distillation ran (recorded in the INT8 model's ``quantization.qat``)."""

    images: int
    epochs: int
    lr: float
    batch_size: int
    activation_points: int
    weights_quantized: int
    loss_first_epoch: float
    loss_last_epoch: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON values."""
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def activation_points(backbone: nn.Module) -> list[nn.Module]:
    """The modules whose outputs ONNX Runtime's INT8 graph rounds: every batch norm and every residual block."""
    points = []
    for module in backbone.modules():
        residual = bool(getattr(module, "has_skip", False)) or type(module).__name__ in ("BasicBlock", "Bottleneck")
        if isinstance(module, nn.BatchNorm2d) or residual:
            points.append(module)
    return points


def _fake_quant(x: torch.Tensor, low: float, high: float, symmetric: bool) -> torch.Tensor:
    """``x`` rounded to int8 (``symmetric``) or uint8 levels of the range [low, high] (which includes 0)."""
    low, high = min(low, 0.0), max(high, 0.0)
    if symmetric:
        scale = max(max(-low, high) / 127.0, 1e-8)
        return torch.fake_quantize_per_tensor_affine(x, scale, 0, -128, 127)
    scale = max((high - low) / 255.0, 1e-8)
    return torch.fake_quantize_per_tensor_affine(x, scale, round(-low / scale), 0, 255)


class _PerChannelWeights(nn.Module):
    """Parametrization: a weight rounded to int8 with one symmetric scale per output channel ([-127, 127])."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        scale = (weight.detach().abs().flatten(1).amax(1).clamp_min(1e-8) / 127.0).float()
        zero = torch.zeros_like(scale, dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, -127, 127)


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside (frozen batch norms, no dropout), its earlier mode restored after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _batches(n: int, size: int, order: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    index = torch.arange(n) if order is None else order
    for start in range(0, n, size):
        yield index[start:start + size]


def quantization_aware_distillation(model: nn.Module, images: np.ndarray, *, epochs: int = DEFAULT_QAT_EPOCHS,
                                    lr: float = DEFAULT_QAT_LR, batch_size: int = QAT_BATCH, symmetric: bool = False,
                                    seed: int = 0, progress: bool = True, log: Callable[[str], None] | None = None,
                                    ) -> tuple[dict[str, torch.Tensor], QatRecord]:
    """Fine-tune a copy of ``model`` (left untouched) with INT8 rounding simulated to reproduce its probabilities on
    ``images`` (preprocessed ``(N, 3, S, S)``); returns the copy's float state dict and a :class:`QatRecord`.
    ``symmetric``: int8 activations (TensorRT) instead of uint8. Raises ``ValueError`` on no images or bad settings."""
    if len(images) == 0:
        raise ValueError("quantization-aware distillation needs training images, got none")
    if epochs < 1 or lr <= 0 or batch_size < 1:
        raise ValueError(f"bad distillation settings: epochs {epochs}, lr {lr}, batch size {batch_size}")
    say = log or (lambda _msg: None)
    start = time.perf_counter()
    torch.manual_seed(seed)
    data = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    teacher = model
    student = copy.deepcopy(model).float().cpu()
    backbone: nn.Module = student.backbone  # type: ignore[assignment]
    with _eval_mode(teacher), torch.no_grad():
        targets = torch.cat([torch.sigmoid(teacher(data[idx]).float()) for idx in _batches(len(data), batch_size)])

    points = activation_points(backbone)
    ranges: dict[int, tuple[float, float]] = {}

    def observe(module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        low, high = ranges.get(id(module), (0.0, 0.0))
        ranges[id(module)] = (min(low, float(output.min())), max(high, float(output.max())))

    first = data[: RANGE_BATCHES * batch_size]
    hooks = [m.register_forward_hook(observe) for m in points]
    with _eval_mode(student), torch.no_grad():
        for idx in _batches(len(first), batch_size):
            student(first[idx])
    for hook in hooks:
        hook.remove()
    input_range = (float(first.min()), float(first.max()))

    def round_output(module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return _fake_quant(output, *ranges[id(module)], symmetric)

    hooks = [m.register_forward_hook(round_output) for m in points]
    layers = [m for m in backbone.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    if not layers:
        raise ValueError("the backbone has no Conv2d or Linear layer to quantize")
    hooks.append(layers[0].register_forward_pre_hook(
        lambda _m, inputs: (_fake_quant(inputs[0], *input_range, symmetric), *inputs[1:])))
    for layer in layers:
        parametrize.register_parametrization(layer, "weight", _PerChannelWeights())

    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    steps = epochs * ((len(data) + batch_size - 1) // batch_size)
    bar = tqdm(total=steps, desc="int8 distillation", unit="batch", disable=not progress, leave=False)
    try:
        with _eval_mode(student):
            for epoch in range(1, epochs + 1):
                total = 0.0
                for idx in _batches(len(data), batch_size, torch.randperm(len(data), generator=generator)):
                    loss = F.binary_cross_entropy_with_logits(student(data[idx]).float(), targets[idx])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    total += float(loss.detach()) * len(idx)
                    bar.update(1)
                losses.append(total / len(data))
                say(f"  distillation epoch {epoch}/{epochs}: loss {losses[-1]:.5f}")
    finally:
        bar.close()
        for hook in hooks:
            hook.remove()
        for layer in layers:
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=False)
    record = QatRecord(images=len(data), epochs=epochs, lr=lr, batch_size=batch_size,
                       activation_points=len(points) + 1, weights_quantized=len(layers),
                       loss_first_epoch=losses[0], loss_last_epoch=losses[-1], seconds=time.perf_counter() - start)
    return {k: v.detach().clone() for k, v in student.state_dict().items()}, record


class DistilledExports:
    """FP32 ONNX exports of the distilled checkpoint, made on first use per activation flavour in a temporary folder
    inside ``folder`` that :meth:`close` removes."""

    def __init__(self, checkpoint: Path, read_images: Callable[[int], np.ndarray],
                 export: Callable[[Path, Path], Path], folder: Path, *, epochs: int = DEFAULT_QAT_EPOCHS,
                 images: int = DEFAULT_QAT_IMAGES, progress: bool = True,
                 say: Callable[[str], None] | None = None) -> None:
        self.checkpoint, self.read_images, self.export = checkpoint, read_images, export
        self.folder, self.epochs, self.images, self.progress = folder, epochs, images, progress
        self.say = say or (lambda _msg: None)
        self._made: dict[bool, tuple[Path, dict[str, Any]]] = {}
        self._tmp: Path | None = None
        self._data: np.ndarray | None = None

    def onnx(self, target: str) -> tuple[Path, dict[str, Any]]:
        """The distilled FP32 ONNX file for INT8 ``target`` (``cpu``, ``tensorrt``) and its record."""
        from export.onnx_export import load_model
        from export.quantize import INT8_FLAVOURS
        from models.checkpoint import save_checkpoint
        from models.files.digest import file_sha256

        symmetric = INT8_FLAVOURS[target].activation_symmetric
        if symmetric not in self._made:
            if self._data is None:
                self.say(f"reading {self.images} training images for quantization-aware distillation ...")
                self._data = self.read_images(self.images)
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix=".int8-qat-", dir=self.folder))
            model, meta = load_model(self.checkpoint)
            self.say(f"quantization-aware distillation for {target}: {self.epochs} epoch(s) on {len(self._data)} "
                     f"training images ({'int8 symmetric' if symmetric else 'uint8'} activations) ...")
            state, record = quantization_aware_distillation(model, self._data, epochs=self.epochs,
                                                            symmetric=symmetric, progress=self.progress, log=self.say)
            work = self._tmp / ("symmetric" if symmetric else "asymmetric")
            work.mkdir()
            save_checkpoint(work / "best.pt", state, meta)
            path = self.export(work / "best.pt", work / "model.onnx")
            self._made[symmetric] = (path, {**record.to_dict(), "activations": "int8" if symmetric else "uint8",
                                            "checkpoint_sha256": file_sha256(self.checkpoint)})
        return self._made[symmetric]

    def close(self) -> None:
        """Remove the temporary folder (the distilled checkpoints and ONNX files)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
