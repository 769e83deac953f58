"""Device names (``cpu``, ``cuda[:N]``, ``tensorrt[:N]``) and their ONNX Runtime providers; no heavy import."""

from __future__ import annotations

import functools
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.runtimes.errors import BackendUnavailableError, ModelSpecError

_ORT_PROVIDER = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


def parse_device(device: str | None) -> tuple[str, int | None]:
    """``"cpu"`` / ``"cuda[:N]"`` / ``"tensorrt[:N]"`` -> ``(kind, index or None)``; None: ``("default", None)``."""
    if device is None:
        return "default", None
    kind, _, index = str(device).strip().lower().partition(":")
    if kind not in ("cpu", "cuda", "tensorrt") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ModelSpecError(f"unknown device {device!r}; use cpu, cuda, cuda:N, tensorrt or tensorrt:N")
    return kind, int(index) if index else None


def ort_providers(device: str | None, available: Sequence[str]) -> list[Any]:
    """ONNX Runtime providers for ``device``, CPU last; :class:`BackendUnavailableError` when one is missing."""
    kind, index = parse_device(device)
    if kind in ("default", "cpu"):
        return ["CPUExecutionProvider"]
    wanted = ["tensorrt", "cuda"] if kind == "tensorrt" else ["cuda"]
    providers: list[Any] = []
    for name in wanted:
        provider = _ORT_PROVIDER[name]
        if provider not in available:
            raise BackendUnavailableError(f"device {device!r} needs ONNX Runtime's {provider}, but this onnxruntime "
                                          f"only has {', '.join(available)}; install onnxruntime-gpu built for your "
                                          "CUDA version")
        providers.append((provider, {"device_id": index}) if index is not None else provider)
    return [*providers, "CPUExecutionProvider"]


def provider_name(provider: Any) -> str:
    """The name of an ONNX Runtime provider entry (a name, or a ``(name, options)`` pair)."""
    return provider[0] if isinstance(provider, tuple) else str(provider)


@functools.cache
def cpu_name() -> str:
    """This machine's CPU model (``/proc/cpuinfo``'s model name, else the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
