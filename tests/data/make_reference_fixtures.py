"""Regenerate tests/data/large_loss/*.npz and tests/data/boostlu/*.npz by running the authors' own code.

Not part of the test suite (nothing here is imported by a test). Needs checkouts of the two reference
repositories at the commits named in tests/data/README.md; their modules are imported from there, never copied:

    python tests/data/make_reference_fixtures.py --large-loss PATH/LargeLossMatters \\
        --bridge-gap PATH/BridgeGapExplanationPAMC

Inputs are fabricated (seeded); every stored value is an output of the reference functions
(``losses.compute_batch_loss`` of both repositories, ``models.ImageClassifier.forward`` of the BoostLU one).
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
SCHEMES = ("LL-R", "LL-Ct", "LL-Cp")


def load_module(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` as module ``name`` (both repositories call theirs ``losses``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def literal(function: Any, text: str) -> str:
    """The string constant ``text`` of ``function``'s code: LargeLossMatters compares the scheme with ``is``,
    which only its own constant object passes (``text`` itself when the code holds no such constant)."""
    return next((c for c in function.__code__.co_consts if c == text), text)


def clean_rate_after(epochs_done: int, delta_rel: float) -> float:
    """The reference's ``P['clean_rate']`` after ``epochs_done`` epoch ends (``-= delta_rel`` each)."""
    rate = 1
    for _ in range(epochs_done):
        rate -= delta_rel
    return rate


def run_both(llm: ModuleType, bgap: ModuleType, logits: np.ndarray, observed: np.ndarray, scheme: str,
             delta_percent: float, clean_rate: float) -> dict[str, np.ndarray]:
    """Loss, d loss / d logits and the correction masks of both repositories' ``compute_batch_loss``; asserts
    that the two losses and gradients agree."""
    out: dict[str, np.ndarray] = {}
    for tag, module in (("llm", llm), ("bgap", bgap)):
        x = torch.tensor(logits, requires_grad=True)
        key = "mod_scheme" if tag == "llm" else "largelossmod_scheme"
        p = {key: literal(module.compute_batch_loss, scheme) if tag == "llm" else scheme,
             "delta_rel": delta_percent / 100, "clean_rate": clean_rate, "dataset": "coco"}
        loss, idx = module.compute_batch_loss(x, torch.tensor(observed), p)
        loss.backward()
        mask = np.zeros(observed.shape, dtype=bool)
        if idx is not None and len(idx[0]):
            mask[idx[0].long().numpy(), idx[1].long().numpy()] = True
        out[f"{tag}_loss"], out[f"{tag}_grad"], out[f"{tag}_marked"] = (
            np.float64(loss.item()), x.grad.numpy().copy(), mask)
    assert out["llm_loss"] == out["bgap_loss"] and np.array_equal(out["llm_grad"], out["bgap_grad"])
    return {"loss": out["llm_loss"], "grad": out["llm_grad"], "marked": out["bgap_marked"],
            "marked_strict": out["llm_marked"]}


def single_positive(rng: np.random.Generator, n: int, c: int) -> np.ndarray:
    """One observed positive per row."""
    observed = np.zeros((n, c), dtype=np.float32)
    observed[np.arange(n), rng.integers(0, c, n)] = 1.0
    return observed


def batch_losses(llm: ModuleType, bgap: ModuleType, name: str, logits: np.ndarray, observed: np.ndarray,
                 deltas: tuple[float, ...], epochs: int) -> None:
    """``large_loss/NAME.npz``: every scheme, delta_rel (percent) and epoch of the schedule on one batch."""
    arrays: dict[str, np.ndarray] = {"logits": logits, "observed": observed, "deltas": np.array(deltas),
                                     "epochs": np.array(epochs)}
    for scheme in SCHEMES:
        for d in deltas:
            for epoch in range(1, epochs + 1):
                rate = clean_rate_after(epoch - 1, d / 100)
                for key, value in run_both(llm, bgap, logits, observed, scheme, d, rate).items():
                    arrays[f"{scheme}_{d:g}_{epoch}_{key}"] = value
    np.savez_compressed(HERE / "large_loss" / f"{name}.npz", **arrays)


def schedule(bgap: ModuleType, seed: int = 3) -> None:
    """``large_loss/schedule.npz``: a miniature training loop of the reference ``train.py`` (shuffled batches,
    LL-Cp's updates of the observed label matrix after each step, ``clean_rate -= delta_rel`` after each
    epoch) on fabricated logits, for every scheme: the loss of every step and LL-Cp's final label matrix."""
    rng = np.random.default_rng(seed)
    n, c, batch, epochs, delta = 24, 8, 6, 4, 4.0
    observed = single_positive(rng, n, c)
    orders = np.stack([rng.permutation(n) for _ in range(epochs)])
    logits = rng.normal(0.0, 2.0, (epochs, n // batch, batch, c)).astype(np.float32)
    arrays: dict[str, np.ndarray] = {"observed": observed, "orders": orders, "logits": logits,
                                     "batch": np.array(batch), "delta_rel": np.array(delta)}
    for scheme in SCHEMES:
        labels = observed.copy()
        p = {"largelossmod_scheme": scheme, "delta_rel": delta / 100, "clean_rate": 1, "dataset": "coco"}
        losses = np.zeros((epochs, n // batch))
        for e in range(epochs):
            for s in range(n // batch):
                idx = orders[e, s * batch:(s + 1) * batch]
                loss, corr = bgap.compute_batch_loss(torch.tensor(logits[e, s]), torch.tensor(labels[idx]), p)
                losses[e, s] = loss.item()
                if scheme == "LL-Cp" and corr[1].numel():  # the reference train.py's update
                    labels[idx[corr[0].long().numpy()], corr[1].long().numpy()] = 1.0
            p["clean_rate"] -= p["delta_rel"]
        arrays[f"{scheme}_losses"] = losses
        arrays[f"{scheme}_labels"] = labels
    assert not np.array_equal(arrays["LL-Cp_labels"], observed)  # the fixture exercises the permanent correction
    np.savez_compressed(HERE / "large_loss" / "schedule.npz", **arrays)


def boostlu_forward(bgap_models: ModuleType, seed: int = 5) -> None:
    """``boostlu/forward.npz``: ``ImageClassifier.forward`` of the BoostLU paper with its feature extractor
    replaced by the identity, so that the input is the feature map; its 1x1 convolution seeded at random."""
    torch.manual_seed(seed)
    n, d, h, w, c = 3, 32, 5, 4, 7
    arrays: dict[str, np.ndarray] = {"features": torch.relu(torch.randn(n, d, h, w)).numpy()}
    for alpha in (5.0, 2.5):
        p = {"arch": "resnet50", "dataset": "coco", "use_pretrained": False, "freeze_feature_extractor": False,
             "feat_dim": d, "num_classes": c, "alpha": alpha}
        model = bgap_models.ImageClassifier(p).eval()
        model.feature_extractor = torch.nn.Identity()
        with torch.no_grad():
            model.onebyone_conv.weight.normal_(0.0, 0.3)
            model.onebyone_conv.bias.normal_(0.0, 0.5)
            logits = model(torch.from_numpy(arrays["features"]))
        arrays[f"alpha{alpha:g}_weight"] = model.onebyone_conv.weight.detach().numpy().copy()
        arrays[f"alpha{alpha:g}_bias"] = model.onebyone_conv.bias.detach().numpy().copy()
        arrays[f"alpha{alpha:g}_logits"] = logits.numpy()
    np.savez_compressed(HERE / "boostlu" / "forward.npz", **arrays)


def main() -> None:
    """Parse the two checkout paths and write every fixture."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large-loss", type=Path, required=True, help="checkout of snucml/LargeLossMatters")
    parser.add_argument("--bridge-gap", type=Path, required=True,
                        help="checkout of youngwk/BridgeGapExplanationPAMC")
    args = parser.parse_args()
    llm = load_module(args.large_loss / "losses.py", "llm_losses")
    bgap = load_module(args.bridge_gap / "losses.py", "bgap_losses")
    bgap_models = load_module(args.bridge_gap / "models.py", "bgap_models")
    (HERE / "large_loss").mkdir(exist_ok=True)
    (HERE / "boostlu").mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    n, c = 16, 20
    batch_losses(llm, bgap, "random", rng.normal(0.0, 2.0, (n, c)).astype(np.float32), single_positive(rng, n, c),
                 deltas=(0.5, 5.0), epochs=4)
    # four distinct logit values: many unobserved losses tie at the threshold
    ties = rng.choice(np.array([-1.0, 0.0, 0.5, 2.0], dtype=np.float32), (8, 5))
    batch_losses(llm, bgap, "ties", ties, single_positive(rng, 8, 5), deltas=(10.0, 30.0), epochs=3)
    schedule(bgap)
    with warnings.catch_warnings():  # torchvision's notice about the reference's pretrained=False argument
        warnings.simplefilter("ignore")
        boostlu_forward(bgap_models)


if __name__ == "__main__":
    main()
