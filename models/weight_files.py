"""Reading a ``--weights FILE`` into the network's key space (this package's checkpoints, torchvision / timm state
dicts, the lukemelas layout), with ``weights_only=True``."""

from __future__ import annotations

from pathlib import Path

import torch

BACKBONE, HEAD = "backbone.", "head."
_WRAPPERS = ("state_dict", "model", "model_state_dict", "state_dict_ema")


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file (safetensors, or a ``torch.save``'d dict unwrapped); else ``ValueError``."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            raw: object = load_file(str(path))
        except Exception as exc:
            raise ValueError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    else:
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle refusing a global, truncated file, not a zip...
            raise ValueError(f"{path}: not a loadable weights file ({type(exc).__name__}: {exc})") from exc
    if isinstance(raw, dict):
        for key in _WRAPPERS:
            if isinstance(raw.get(key), dict) and not isinstance(raw.get(key), torch.Tensor):
                raw = raw[key]
                break
    if not isinstance(raw, dict) or not raw or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise ValueError(f"{path}: expected a state dict (names -> tensors), got {type(raw).__name__}")
    return {str(k).removeprefix("module."): v for k, v in raw.items()}


def in_network_keys(state: dict[str, torch.Tensor], classifier_prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A library state dict in the network's key space (``backbone.`` / ``head.``)."""
    if all(k.startswith((BACKBONE, HEAD)) for k in state):
        return dict(state)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        prefix = next((p for p in classifier_prefixes if key.startswith(p)), None)
        out[HEAD + key[len(prefix):] if prefix else BACKBONE + key] = value
    return out


def describe_mismatch(missing: list[str], unexpected: list[str], limit: int = 6) -> str:
    """``missing: a, b, ... (N in all); unexpected: ...`` for an error message."""

    def listed(keys: list[str]) -> str:
        more = f", ... ({len(keys)} in all)" if len(keys) > limit else ""
        return ", ".join(keys[:limit]) + more

    parts = []
    if missing:
        parts.append(f"missing or of another shape: {listed(missing)}")
    if unexpected:
        parts.append(f"unexpected: {listed(unexpected)}")
    return "; ".join(parts)
