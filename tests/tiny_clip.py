"""A tiny CLIP for the tests (and tests/data/make_reference_fixtures.py): an open_clip ViT of one layer per tower,
registered under a test-only name with ``open_clip.add_model_config``, with weights drawn from a numpy seed (the
same on every machine and open_clip version, unlike a library's own initialisation). Its pseudo-labels mean
nothing; they only have to be computed the same way as the references compute them.

Its state dict has OpenAI's layout (QuickGELU, 64-wide heads), so the references' own CLIP code
(``clip.build_model``) builds the same network from it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

WIDTH, EMBED = 64, 32
_REGISTERED: dict[tuple[int, int], str] = {}


def config(image_size: int, patch_size: int) -> dict[str, object]:
    """The open_clip model config: one 64-wide layer per tower (one head: OpenAI's head width 64), 32-d
    embedding, OpenAI's 77-token context and vocabulary, QuickGELU."""
    return {"embed_dim": EMBED, "quick_gelu": True,
            "vision_cfg": {"image_size": image_size, "layers": 1, "width": WIDTH, "patch_size": patch_size},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": WIDTH, "heads": 1, "layers": 1}}


def register(image_size: int = 32, patch_size: int = 8) -> str:
    """Register the tiny config for ``image_size`` px inputs with open_clip (once per process); its model name."""
    key = (image_size, patch_size)
    if key not in _REGISTERED:
        import open_clip

        name = f"spml-tiny-clip-{image_size}"
        folder = Path(tempfile.mkdtemp(prefix="spml-tiny-clip-"))
        (folder / f"{name}.json").write_text(json.dumps(config(image_size, patch_size)))
        open_clip.add_model_config(folder / f"{name}.json")
        _REGISTERED[key] = name
    return _REGISTERED[key]


def seeded_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Weights for ``model`` from ``numpy.random.default_rng(seed)``, entry by entry in sorted key order: layer
    norms 1 + 0.1 N(0, 1), biases 0.02 N(0, 1), OpenAI's logit scale log(1 / 0.07), other tensors
    N(0, 1 / fan_in) (fan_in the product of all but the first dimension; 0.1 for vectors), every value rounded
    to float16."""
    rng = np.random.default_rng(seed)
    out: dict[str, torch.Tensor] = {}
    for key, value in sorted(model.state_dict().items()):
        shape = tuple(value.shape)
        if key == "logit_scale":
            array = np.full(shape, np.log(1 / 0.07))
        elif ".ln" in key or key.startswith("ln") or "ln_" in key:
            array = (1.0 if key.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(shape)
        elif key.endswith("bias"):
            array = 0.02 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            array = rng.standard_normal(shape) * (fan_in ** -0.5 if fan_in else 0.1)
        # float16 values, as OpenAI's released weights (its clip.build_model keeps the model in float16)
        out[key] = torch.from_numpy(np.asarray(array, dtype=np.float16).astype(np.float32))
    return out


def tiny_clip(image_size: int = 32, patch_size: int = 8, seed: int = 0) -> tuple[str, dict[str, torch.Tensor]]:
    """The registered model name and its seeded state dict."""
    import open_clip

    name = register(image_size, patch_size)
    model = open_clip.create_model(name)
    return name, seeded_state_dict(model, seed)


def save_tiny_clip(folder: Path, image_size: int = 32, patch_size: int = 8, seed: int = 0) -> str:
    """Write the seeded tiny CLIP's weights to ``folder`` and return its ``--clip`` value ``NAME:FILE``."""
    name, state = tiny_clip(image_size, patch_size, seed)
    path = Path(folder) / f"{name}-seed{seed}.pt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)
    return f"{name}:{path}"
