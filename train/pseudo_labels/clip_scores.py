"""CLIP through ``open_clip`` (``--clip MODEL[:PRETRAINED]``; ``MODEL:FILE`` loads a state dict, ``MODEL:none``
initialises at random): the weights check, the class prompts, the references' preprocessing and the scoring pass
(docs/methods.md, "The pseudo-label stage")."""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import functional as TF
from tqdm import tqdm

from models.preprocess import to_rgb
from train.pseudo_labels.crops import IMAGENET_MEAN, IMAGENET_STD, aevlp_views, aggregate_views, clip_input
from train.pseudo_labels.spec import IMAGE_AND_GRID, WHOLE_IMAGE, PseudoLabelSpec

RANDOM_INIT = "none"
HF_WEIGHTS = "open_clip_pytorch_model.bin"  # open_clip's file name on the hub when its config names none
REACH_TIMEOUT_S = 3.0
_CUB_ATTRIBUTE = re.compile(r"^has_\w+::")


class ClipUnavailable(ValueError):
    """The CLIP weights are neither cached nor downloadable (raised before anything trains)."""


@dataclass(frozen=True)
class ClipChoice:
    """``--clip MODEL[:PRETRAINED]``: an open_clip model name and its pretrained tag, weight file or ``none``."""

    model: str
    pretrained: str

    def __str__(self) -> str:
        return f"{self.model}:{self.pretrained}" if self.pretrained else self.model

    @property
    def schema(self) -> str:
        """``hf-hub`` / ``local-dir`` for open_clip's schema names (the weights come with the name), else ''."""
        return next((s for s in ("hf-hub", "local-dir") if self.model.startswith(s + ":")), "")


def parse_clip(text: str) -> ClipChoice:
    """``MODEL[:PRETRAINED]``; a bare ``MODEL`` takes its ``openai`` weights if open_clip has them, else its first
    pretrained tag; ``hf-hub:org/repo`` and ``local-dir:PATH`` are taken whole."""
    text = text.strip()
    if not text:
        raise ValueError("--clip needs MODEL[:PRETRAINED], e.g. ViT-B-16:openai")
    if text.startswith(("hf-hub:", "local-dir:")):
        return ClipChoice(text, "")
    model, _, pretrained = text.partition(":")
    if pretrained:
        return ClipChoice(model, pretrained)
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(model)
    if not tags:
        raise ValueError(f"--clip {text}: open_clip has no pretrained weights for {model!r}; give "
                         f"{model}:FILE (a state dict) or see open_clip.list_pretrained()")
    return ClipChoice(model, "openai" if "openai" in tags else tags[0])


def _pretrained_cfg(choice: ClipChoice) -> dict[str, Any]:
    import open_clip

    return dict(open_clip.get_pretrained_cfg(choice.model, choice.pretrained)) if choice.pretrained else {}


def _hub_files(hf_hub: str) -> tuple[str, list[str]]:
    """The repository and weight files open_clip tries for a config's ``hf_hub`` entry."""
    repo, filename = os.path.split(hf_hub)
    filename = filename or HF_WEIGHTS
    names = []
    if filename == HF_WEIGHTS:
        names.append("open_clip_model.safetensors")
    elif filename.endswith((".bin", ".pth")):
        names.append(filename[:-4] + ".safetensors")
    return repo, [*names, filename]


def _cached(choice: ClipChoice, cfg: dict[str, Any]) -> bool:
    """Whether open_clip finds the weights of ``cfg`` without the network."""
    from huggingface_hub import try_to_load_from_cache

    if cfg.get("hf_hub"):
        repo, names = _hub_files(cfg["hf_hub"])
        if any(isinstance(try_to_load_from_cache(repo, name), str) for name in names):
            return True
    url = cfg.get("url", "")
    return bool(url) and (Path("~/.cache/clip").expanduser() / os.path.basename(url)).is_file()


def _download_host(cfg: dict[str, Any]) -> str:
    if cfg.get("hf_hub") or not cfg.get("url"):
        return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    return urlparse(cfg["url"]).hostname or ""


def hub_reachable(host: str, timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``host``:443 (or the ``HTTPS_PROXY``) opens within ``timeout`` s."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = (host, 443)
    if proxy:
        parsed = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        target = (parsed.hostname or host, parsed.port or 80)
    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection(target, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


def _offline_env() -> str | None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name} is set"
    return None


def check_available(choice: ClipChoice, method: str) -> None:
    """Raise :class:`ClipUnavailable` unless the weights of ``choice`` are random, a file, cached or downloadable now; a
    ``ValueError`` for a tag open_clip does not know."""
    import open_clip

    if choice.schema == "local-dir":
        if not Path(choice.model.split(":", 1)[1]).expanduser().is_dir():
            raise ValueError(f"--clip {choice}: no such folder")
        return
    if not choice.schema and choice.model not in open_clip.list_models():
        raise ValueError(f"--clip {choice}: open_clip has no model {choice.model!r} (open_clip.list_models())")
    if choice.pretrained == RANDOM_INIT or (choice.pretrained and Path(choice.pretrained).expanduser().is_file()):
        return
    cfg: dict[str, Any] = {"hf_hub": choice.model.split(":", 1)[1] + "/"} if choice.schema else _pretrained_cfg(choice)
    if not cfg:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(choice.model)) or "none"
        raise ValueError(f"--clip {choice}: {choice.pretrained!r} is neither a pretrained tag of {choice.model} "
                         f"(known: {tags}) nor a weight file")
    if choice.schema:
        repo = choice.model.split(":", 1)[1]
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(repo, "open_clip_config.json"), str):
            return
    elif _cached(choice, cfg):
        return
    host = _download_host(cfg)
    reason = _offline_env() or (None if hub_reachable(host) else f"{host} cannot be reached")
    if reason is None:
        return
    raise ClipUnavailable(
        f"{method} trains on pseudo-labels from CLIP {choice}, whose weights are not in the local cache and cannot "
        f"be downloaded here ({reason}). Either run once where {host} can be reached (the weights are downloaded "
        "once into the Hugging Face cache), or compute the pseudo-labels on a machine that can and pass the file: "
        "every run of a method with pseudo-labels writes RUN/pseudo_labels.npz, which --pseudo-labels FILE reads "
        "(same dataset; it is checked to cover this run's training images). --clip MODEL:FILE takes weights from a "
        "file instead")


@dataclass
class ClipModel:
    """A loaded CLIP model with its tokenizer and input size (height, width)."""

    model: torch.nn.Module
    tokenizer: Any
    size: tuple[int, int]
    choice: ClipChoice


def load_clip(choice: ClipChoice, device: torch.device) -> ClipModel:
    """The CLIP model of ``choice`` on ``device`` in eval mode (downloaded if needed; ``none`` is seeded)."""
    import open_clip

    cfg = _pretrained_cfg(choice) if choice.pretrained != RANDOM_INIT else {}
    pretrained: str | None = None
    if choice.pretrained not in ("", RANDOM_INIT):
        file = Path(choice.pretrained).expanduser()
        pretrained = str(file) if file.is_file() else choice.pretrained
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            model = open_clip.create_model(choice.model, pretrained=pretrained, device=device,
                                           force_quick_gelu=bool(cfg.get("quick_gelu", False)))
        except RuntimeError as exc:  # open_clip's download and loading errors
            raise ValueError(f"--clip {choice}: could not load the CLIP model ({exc})") from exc
    model.eval()
    size = model.visual.image_size
    size = (int(size[0]), int(size[1])) if isinstance(size, (tuple, list)) else (int(size), int(size))
    return ClipModel(model, open_clip.get_tokenizer(choice.model), size, choice)


def prompt_name(class_name: str) -> str:
    """The class name as prompts say it (``_`` as a space; a CUB attribute as AEVLP words it:
    ``has_bill_shape::curved_(up_or_down)`` -> ``curved bill``)."""
    if _CUB_ATTRIBUTE.match(class_name):
        value = class_name.split("::", 1)[1].split("_(")[0]
        class_name = f"{value} {class_name.split('_')[1]}"
    return class_name.replace("_", " ")


def class_prompts(classes: Sequence[str], template: str) -> list[str]:
    """One prompt per class: ``template`` with ``{}`` replaced by :func:`prompt_name` of the class."""
    return [template.replace("{}", prompt_name(name)) for name in classes]


@torch.no_grad()
def text_features(clip: ClipModel, prompts: Sequence[str], device: torch.device) -> torch.Tensor:
    """``(C, D)`` L2-normalised text features of ``prompts``."""
    tokens = clip.tokenizer(list(prompts)).to(device)
    features = clip.model.encode_text(tokens).float()
    return features / features.norm(dim=-1, keepdim=True)


def vlpl_view(image: Image.Image, pre_resize: int, size: tuple[int, int]) -> torch.Tensor:
    """VLPL's CLIP input ``(1, 3, H, W)``: the training image at ``pre_resize`` px (PIL bilinear squash,
    ImageNet-normalised), resized as a tensor to CLIP's ``size`` (bilinear, antialiased)."""
    full = clip_input(image, (pre_resize, pre_resize))
    return TF.resize(full, list(size), antialias=True).unsqueeze(0)


def image_views(spec: PseudoLabelSpec, image: Image.Image, size: tuple[int, int]) -> torch.Tensor:
    """The CLIP inputs of one decoded image for ``spec``: ``(V, 3, H, W)``, V = 1 (vlpl) or 1 + g^2 (aevlp)."""
    if spec.kind == WHOLE_IMAGE:
        return vlpl_view(image, spec.pre_resize, size)
    return aevlp_views(image, spec.grid_size, size)


def view_count(spec: PseudoLabelSpec) -> int:
    """Views per image: 1 (vlpl) or 1 + grid^2 (aevlp)."""
    return 1 + spec.grid_size ** 2 if spec.kind == IMAGE_AND_GRID else 1


class _Views(Dataset[tuple[int, torch.Tensor, bool]]):
    """The CLIP views of some images; an unreadable image yields zeros and ``False``."""

    def __init__(self, paths: Sequence[Path], rows: Sequence[int], spec: PseudoLabelSpec,
                 size: tuple[int, int]) -> None:
        self.paths, self.rows, self.spec, self.size = paths, rows, spec, size

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, bool]:
        row = self.rows[i]
        try:
            with Image.open(self.paths[row]) as raw:
                image = to_rgb(raw)
            return row, image_views(self.spec, image, self.size), True
        except Exception:  # any decoder failure: no pseudo-labels for this image
            return row, torch.zeros(view_count(self.spec), 3, *self.size), False


def _collate(items: list[tuple[int, torch.Tensor, bool]]) -> tuple[list[int], torch.Tensor, list[bool]]:
    return [i[0] for i in items], torch.stack([i[1] for i in items]), [i[2] for i in items]


@torch.no_grad()
def view_cosines(clip: ClipModel, views: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``(V, C)`` of ``views`` ``(V, 3, H, W)`` with the normalised ``text`` features."""
    features = clip.model.encode_image(views).float()
    return (features / features.norm(dim=-1, keepdim=True)) @ text.t()


@torch.no_grad()
def score_images(clip: ClipModel, text: torch.Tensor, spec: PseudoLabelSpec, paths: Sequence[Path],
                 rows: Sequence[int], device: torch.device, batch_size: int, workers: int,
                 progress: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Score ``paths[rows]``: the softmax scores per view ``(len(rows), C)``, and which images were read."""
    dataset = _Views(paths, rows, spec, clip.size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_collate)
    c = text.shape[0]
    position = {row: i for i, row in enumerate(rows)}
    names = ("global",) if spec.kind == WHOLE_IMAGE else ("global", "crop_max", "crop_min", "crop_mean")
    out = {name: np.zeros((len(rows), c), dtype=np.float32) for name in names}
    readable = np.zeros(len(rows), dtype=bool)
    bar = tqdm(total=len(rows), desc=f"CLIP {clip.choice} ({spec.kind} pseudo-labels)", disable=not progress,
               unit="img", leave=False)
    for batch_rows, views, ok in loader:
        b, v = views.shape[:2]
        cosines = view_cosines(clip, views.flatten(0, 1).to(device), text)
        scores = F.softmax(cosines / spec.temperature, dim=-1).reshape(b, v, c)
        parts = {"global": scores[:, 0]} if spec.kind == WHOLE_IMAGE else aggregate_views(scores)
        where = [position[r] for r in batch_rows]
        for name in names:
            out[name][where] = parts[name].cpu().numpy()
        readable[where] = ok
        bar.update(b)
    bar.close()
    for name in names:
        out[name][~readable] = 0.0
    return out, readable


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "RANDOM_INIT", "ClipChoice", "ClipModel", "ClipUnavailable",
           "check_available", "class_prompts", "hub_reachable", "image_views", "load_clip", "parse_clip",
           "prompt_name", "score_images", "text_features", "view_cosines", "vlpl_view"]
