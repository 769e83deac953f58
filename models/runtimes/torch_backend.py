"""PyTorch backend for training checkpoints (``.pt``), the reference the exported runtimes must match."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from models.checkpoint import ModelMeta, load_checkpoint, read_checkpoint_meta
from models.runtimes.devices import parse_device
from models.runtimes.errors import BackendUnavailableError, ModelSpecError

if TYPE_CHECKING:
    import torch


class TorchBackend:
    """A checkpoint's network in eval mode: float32 ``(N,3,S,S)`` -> logits ``(N,C)`` (CUDA if available)."""

    name: ClassVar[str] = "torch"
    suffixes: ClassVar[tuple[str, ...]] = (".pt", ".pth")

    def __init__(self, model: torch.nn.Module, meta: ModelMeta, path: Path, device: torch.device) -> None:
        self.model = model
        self.meta = meta
        self.path = path
        self.device = device

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None) -> TorchBackend:
        """Load a checkpoint written by the trainer (weights only); ``device`` defaults to cuda, else cpu."""
        import torch

        from models.network import model_from_meta

        path = Path(path)
        ckpt = load_checkpoint(path)
        dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        model = model_from_meta(ckpt.meta)
        try:
            model.load_state_dict(ckpt.model)
        except RuntimeError as exc:
            raise ValueError(f"{path}: weights do not fit {ckpt.meta.arch} ({exc})") from exc
        return cls(model.float().eval().to(dev), ckpt.meta, path, dev)

    @classmethod
    def open(cls, path: str | Path, device: str | None = None, threads: int | None = None) -> tuple[TorchBackend, str]:
        """Load ``path`` for ``device`` (default CUDA when available) with ``threads`` (process-wide); returns the
        runtime and where it runs."""
        import torch

        kind, _ = parse_device(device)
        if kind == "tensorrt":
            raise ModelSpecError("device tensorrt needs an .onnx model (ONNX Runtime) or a TensorRT engine")
        if kind == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {device!r}: PyTorch sees no CUDA GPU on this machine")
        if threads is not None:
            torch.set_num_threads(threads)
        runtime = cls.load(path, device=None if kind == "default" else str(device))
        return runtime, f"torch ({runtime.device})"

    @classmethod
    def read_meta(cls, path: str | Path) -> ModelMeta:
        """The checkpoint's metadata, without torch or the weights (:func:`models.checkpoint.read_checkpoint_meta`)."""
        return read_checkpoint_meta(Path(path))

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` preprocessed batch -> float32 logits ``(N, C)``."""
        import torch

        x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)).to(self.device)
        with torch.inference_mode():
            return self.model(x).float().cpu().numpy()
