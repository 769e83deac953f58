"""Regenerate tests/data/large_loss/*.npz, tests/data/boostlu/*.npz and tests/data/gr_loss/*.npz by running the
authors' own code.

Not part of the test suite (nothing here is imported by a test). Needs checkouts of the reference repositories
at the commits named in tests/data/README.md; their modules are imported from there, never copied:

    python tests/data/make_reference_fixtures.py --large-loss PATH/LargeLossMatters \\
        --bridge-gap PATH/BridgeGapExplanationPAMC --gr-loss PATH/GRLoss

Each group is written when its checkouts are given (``--large-loss`` and ``--bridge-gap`` together: Large Loss
and BoostLU; ``--gr-loss``: GR-Loss). Inputs are fabricated (seeded); every stored value is an output of the
reference code (``losses.compute_batch_loss`` of both Large Loss repositories, ``models.ImageClassifier.forward``
of the BoostLU one; GRLoss's ``losses.GR_loss`` with ``models.KFunction`` / ``models.VFunction``, and its
``train.run_train`` loop with stand-ins for the data, the network and the metrics).
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
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


# ----------------------------------------------------------------------------------------------- GR-Loss
# The siblings GRLoss's train.py imports by plain name, in an order where each one's own imports resolve
GR_MODULES = ("metrics", "instrumentation", "datasets", "models", "losses")
# name -> (epochs T, linear_init n, beta, alpha, q2q3): the repository's defaults (VOC), AEVLP's CUB config, and
# AEVLP's COCO GR values with two LinearInit epochs (the reference's n = --linear_init)
GR_CONFIGS: dict[str, tuple[int, int, list[float], list[float], list[float]]] = {
    "voc": (8, 0, [0, 2, -2, -2], [0.5, 2, 0.8, 0.5], [0.01, 1]),
    "cub": (10, 0, [0, 10, -2, -8], [0.5, 2, 0.8, 0.5], [0.01, 1.5]),
    "coco_linear_init": (6, 2, [0, 10, -2, -8], [0.5, 2, 0.8, 0.5], [0.01, 1]),
}


def gr_modules(root: Path) -> dict[str, ModuleType]:
    """GRLoss's ``metrics``, ``instrumentation``, ``datasets``, ``models``, ``losses`` and ``train`` modules from
    the checkout ``root``. Its files import one another by plain name, so each is registered in ``sys.modules``
    under that name while the next ones load; the previous entries are put back afterwards."""
    import sys

    import matplotlib

    matplotlib.use("Agg")  # instrumentation.py imports pyplot
    saved = {name: sys.modules.get(name) for name in (*GR_MODULES, "train")}
    modules: dict[str, ModuleType] = {}
    try:
        for name in (*GR_MODULES, "train"):
            modules[name] = load_module(root / f"{name}.py", name)
            sys.modules[name] = modules[name]
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return modules


class FakeFeatures(torch.nn.Module):
    """Stand-in of the ResNet-50 trunk: a per-class scale (ones), so that the "images" are the logits."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(c))


class FakeHead(torch.nn.Module):
    """Stand-in of the linear classifier: a per-class bias (zeros)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(c))


def reference_loop(mods: dict[str, ModuleType], epochs: int, linear_init: int, beta: list[float],
                   alpha: list[float], q2q3: list[float], logits: np.ndarray, observed: np.ndarray, batch: int,
                   save_dir: Path) -> dict[str, np.ndarray]:
    """Run GRLoss's own ``train.run_train`` over fabricated data and record what its loop computes.

    Stand-ins, seen by ``train.py`` only and for this call only (its globals ``datasets``, ``models``, ``losses``
    become views of those modules with some names replaced; the modules are not modified): ``datasets.get_data``
    (the rows of ``logits`` as images, ``observed`` as observed and true labels), ``models.ImageClassifier``
    (logits = image * scale + bias, the scale in ``feature_extractor`` and the bias in ``linear_classifier``, so
    the reference's optimiser groups, 10x head learning rate and LinearInit freezing act on them),
    ``compute_metrics`` (a constant val mAP: no early stop) and ``tqdm`` (no progress bar). ``models.KFunction``,
    ``models.VFunction`` and ``losses.GR_loss`` are wrapped to record their arguments and results, then call the
    originals.

    Returns per epoch the (w, b, mu, sigma) the loop built and whether the trunk was frozen; per training step
    the epoch argument given to ``GR_loss``, the network's logits, the observed labels, the loss and its
    gradient with respect to those logits.
    """
    import contextlib
    import io

    train_mod, models_mod, losses_mod, datasets_mod = mods["train"], mods["models"], mods["losses"], mods["datasets"]
    n, c = logits.shape
    outputs: list[torch.Tensor] = []
    frozen: list[bool] = []

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"image": torch.from_numpy(logits[i]), "label_vec_obs": torch.from_numpy(observed[i]),
                    "label_vec_true": torch.from_numpy(observed[i]), "idx": i}

    class Classifier(torch.nn.Module):
        def __init__(self, _p: dict[str, Any]) -> None:
            super().__init__()
            self.feature_extractor, self.linear_classifier = FakeFeatures(c), FakeHead(c)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = x * self.feature_extractor.scale + self.linear_classifier.bias
            if self.training and out.requires_grad:
                out.retain_grad()
                outputs.append(out)
                frozen.append(not self.feature_extractor.scale.requires_grad)
            return out

    k_params: list[tuple[float, float]] = []
    v_params: list[tuple[float, float]] = []
    steps: list[dict[str, Any]] = []
    original_k, original_v, original_loss = models_mod.KFunction, models_mod.VFunction, losses_mod.GR_loss

    def recorded_k(w: float, b: float) -> torch.nn.Module:
        k_params.append((w, b))
        return original_k(w, b)

    def recorded_v(p: torch.Tensor, mu: float, sigma: float) -> torch.Tensor:
        v_params.append((mu, sigma))
        return original_v(p, mu, sigma)

    def recorded_loss(preds: torch.Tensor, label_vec: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      q: Any, epoch: int, p: Any = None) -> torch.Tensor:
        loss = original_loss(preds, label_vec, k, v, q, epoch, p)
        steps.append({"epoch": epoch, "k": k_params[-1], "v": v_params[-1], "q": tuple(q),
                      "observed": label_vec.numpy().copy(), "loss": loss.item()})
        return loss

    p = {"bsize": batch, "num_workers": 0, "lr": 1e-5, "lr_mult": 10, "optimizer": "adam", "is_train": False,
         "num_epochs": epochs, "linear_init": linear_init, "beta": beta, "alpha": alpha, "q2q3": q2q3,
         "num_classes": c, "save_path": str(save_dir)}
    def view(module: ModuleType, **overrides: Any) -> SimpleNamespace:
        """``module``'s names with ``overrides``, for train.py's global of that name (the module itself stays
        untouched: its classes look themselves up there, e.g. ``super(KFunction, self)``)."""
        return SimpleNamespace(**{**vars(module), **overrides})

    patches = {
        "datasets": view(datasets_mod, get_data=lambda _p: {phase: Rows() for phase in ("train", "val", "test")}),
        "models": view(models_mod, ImageClassifier=Classifier, KFunction=recorded_k, VFunction=recorded_v),
        "losses": view(losses_mod, GR_loss=recorded_loss),
        "compute_metrics": lambda _pred, _true: {"map": 50.0},
        "tqdm": lambda iterable: iterable,
    }
    saved = {name: getattr(train_mod, name) for name in patches}
    try:
        for name, value in patches.items():
            setattr(train_mod, name, value)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory without a GPU
            train_mod.run_train(p)
    finally:
        for name, value in saved.items():
            setattr(train_mod, name, value)
    assert len(steps) == len(outputs) == epochs * -(-n // batch)
    step_epochs = np.array([s["epoch"] for s in steps])
    per_epoch = [[s for s in steps if s["epoch"] == e] for e in range(1, epochs + 1)]
    assert all(len({(s["k"], s["v"]) for s in group}) == 1 for group in per_epoch)  # set once per epoch
    assert len(k_params) == epochs and all(tuple(s["q"]) == tuple(q2q3) for s in steps)
    return {
        "schedule": np.array([[*group[0]["k"], *group[0]["v"]] for group in per_epoch], dtype=np.float64),
        "frozen": np.array([frozen[int(np.flatnonzero(step_epochs == e)[0])] for e in range(1, epochs + 1)]),
        "step_epoch": step_epochs,
        "step_logits": np.stack([o.detach().numpy() for o in outputs]),
        "step_observed": np.stack([s["observed"] for s in steps]),
        "step_loss": np.array([s["loss"] for s in steps]),
        "step_grad": np.stack([o.grad.numpy() for o in outputs]),
    }


def gr_reference_batch(mods: dict[str, ModuleType], logits: np.ndarray, observed: np.ndarray,
                       schedule: np.ndarray, q2q3: list[float]) -> tuple[float, np.ndarray]:
    """GRLoss's loss of one batch as its train.py computes it (``preds = sigmoid(logits)``, ``K`` and ``V`` from
    the detached ``preds``, then ``losses.GR_loss``), in the dtype of ``logits``: the loss and d loss / d logits."""
    w, b, mu, sigma = (float(v) for v in schedule)
    x = torch.tensor(logits, requires_grad=True)
    preds = torch.sigmoid(x)
    detached = preds.detach()
    k = mods["models"].KFunction(w, b)(detached)
    v = mods["models"].VFunction(detached, mu, sigma)
    loss = mods["losses"].GR_loss(preds, torch.tensor(observed), k, v, q2q3, 1)
    loss.backward()
    assert x.grad is not None
    return loss.item(), x.grad.numpy().copy()


def gr_loss_fixtures(root: Path, seed: int = 11) -> None:
    """``gr_loss/{voc,cub,coco_linear_init}.npz``: for each configuration of :data:`GR_CONFIGS`,

    - ``loop_*``: the reference ``run_train`` loop (:func:`reference_loop`) over 6 images in batches of 3 (float32
      logits from the stand-in network, some saturated): the schedule per epoch, the trunk freezing, and every
      step's logits, observed labels, loss and gradient;
    - ``batch_*``: one fabricated float64 batch (logits up to +-40 and -200, on observed positives too) and, for
      every epoch with the loop's schedule of that epoch, the reference loss and gradient (``batch_loss`` (T,),
      ``batch_grad`` (T, N, C)); ``batch_grad_finite32``: whether the reference's float32 gradient is finite on
      the same batch (it is not: sigmoid(-200) is 0 in float32);
    - ``odd_*`` (voc only): a batch whose labels also hold -1 and 0.5 entries, at the first epoch's schedule.
    """
    import tempfile

    mods = gr_modules(root)
    out_dir = HERE / "gr_loss"
    out_dir.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, (epochs, linear_init, beta, alpha, q2q3) in GR_CONFIGS.items():
        loop_logits = rng.normal(0.0, 3.0, (6, 7)).astype(np.float32)
        loop_logits[0, 1], loop_logits[2, 3], loop_logits[4, 0] = 40.0, -40.0, -30.0
        loop_observed = single_positive(rng, 6, 7)
        loop_observed[2, :], loop_observed[2, 3] = 0.0, 1.0  # a saturated observed positive
        torch.manual_seed(seed)  # the loader's shuffling
        with tempfile.TemporaryDirectory() as tmp:
            loop = reference_loop(mods, epochs, linear_init, beta, alpha, q2q3, loop_logits, loop_observed, 3,
                                  Path(tmp))
        logits = rng.normal(0.0, 3.0, (10, 7))
        logits[0, :4] = [40.0, -40.0, 20.0, -200.0]
        logits[1, :3] = [-200.0, 40.0, -20.0]
        observed = single_positive(rng, 10, 7)
        observed[0, :], observed[0, 3] = 0.0, 1.0  # the observed positive at -200
        observed[1, :], observed[1, 1] = 0.0, 1.0  # the observed positive at +40
        arrays: dict[str, np.ndarray] = {
            "epochs": np.array(epochs), "linear_init": np.array(linear_init), "beta": np.array(beta, dtype=float),
            "alpha": np.array(alpha, dtype=float), "q2q3": np.array(q2q3, dtype=float),
            **{f"loop_{key}": value for key, value in loop.items()},
            "batch_logits": logits, "batch_observed": observed,
        }
        results = [gr_reference_batch(mods, logits, observed, loop["schedule"][e], q2q3) for e in range(epochs)]
        arrays["batch_loss"] = np.array([loss for loss, _ in results])
        arrays["batch_grad"] = np.stack([grad for _, grad in results])
        _, grad32 = gr_reference_batch(mods, logits.astype(np.float32), observed.astype(np.float32),
                                       loop["schedule"][0], q2q3)
        arrays["batch_grad_finite32"] = np.array(bool(np.isfinite(grad32).all()))
        if name == "voc":
            odd = observed.copy()
            odd[2, :3], odd[3, 4] = -1.0, 0.5
            arrays["odd_observed"] = odd
            arrays["odd_loss"], arrays["odd_grad"] = gr_reference_batch(mods, logits, odd, loop["schedule"][0], q2q3)
        np.savez_compressed(out_dir / f"{name}.npz", **arrays)


def main() -> None:
    """Parse the checkout paths and write the fixtures of each group given."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large-loss", type=Path, help="checkout of snucml/LargeLossMatters")
    parser.add_argument("--bridge-gap", type=Path, help="checkout of youngwk/BridgeGapExplanationPAMC")
    parser.add_argument("--gr-loss", type=Path, help="checkout of yan4xi1/GRLoss")
    args = parser.parse_args()
    if (args.large_loss is None) != (args.bridge_gap is None):
        parser.error("--large-loss and --bridge-gap go together")
    if args.large_loss is None and args.gr_loss is None:
        parser.error("give --large-loss and --bridge-gap, --gr-loss, or all three")
    if args.large_loss is not None:
        large_loss_and_boostlu(args.large_loss, args.bridge_gap)
    if args.gr_loss is not None:
        gr_loss_fixtures(args.gr_loss)


def large_loss_and_boostlu(large_loss: Path, bridge_gap: Path) -> None:
    """``large_loss/*.npz`` and ``boostlu/forward.npz`` from the two checkouts."""
    llm = load_module(large_loss / "losses.py", "llm_losses")
    bgap = load_module(bridge_gap / "losses.py", "bgap_losses")
    bgap_models = load_module(bridge_gap / "models.py", "bgap_models")
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
