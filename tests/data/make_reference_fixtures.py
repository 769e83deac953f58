"""Regenerate tests/data/large_loss/*.npz, tests/data/boostlu/*.npz, tests/data/gr_loss/*.npz and tests/data/vlp/*.npz
by running the authors' own code.

Not part of the test suite (nothing here is imported by a test). Needs checkouts of the reference repositories
at the commits named in tests/data/README.md; their modules are imported from there, never copied:

    python tests/data/make_reference_fixtures.py --large-loss PATH/LargeLossMatters \\
        --bridge-gap PATH/BridgeGapExplanationPAMC --gr-loss PATH/GRLoss --vlpl PATH/VLPL --aevlp PATH/AEVLP

Each group is written when its checkouts are given (``--large-loss`` and ``--bridge-gap`` together: Large Loss
and BoostLU; ``--gr-loss``: GR-Loss; ``--vlpl``, ``--aevlp``: the CLIP pseudo-labels and losses of VLPL and
AEVLP). Inputs are fabricated (seeded); every stored value is an output of the reference code
(``losses.compute_batch_loss`` of both Large Loss repositories, ``models.ImageClassifier.forward`` of the BoostLU
one; GRLoss's ``losses.GR_loss`` with ``models.KFunction`` / ``models.VFunction``, and its ``train.run_train`` loop
with stand-ins for the data, the network and the metrics; VLPL's ``main_clip.run_train_phase`` and
``losses.compute_batch_loss``; AEVLP's ``train.run_train``, ``utils.get_pseudo_labels`` and ``losses.GPR_loss``, with
the seeded tiny CLIP of tests/tiny_clip.py in place of the real one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


# ------------------------------------------------------------------------------------------------ VLPL, AEVLP
VLP_DIR = HERE / "vlp"
# The fabricated images (height, width): sizes that the crop grids do not divide
VLP_SIZES = ((37, 50), (64, 64), (90, 41), (70, 130), (33, 33), (45, 61))
# Class names of the fabricated data; the tests check that the package's prompts say them as the references do
VLP_CLASSES = ("dog", "potted_plant", "car", "tvmonitor", "red_square", "sky")
VLP_SEEDS = {"vlpl": 3, "aevlp": 4}  # tiny CLIP weight seeds (tests/tiny_clip.py)
VLPL_CLIP_SIZE, VLPL_PATCH = 336, 48  # main_clip.py resizes CLIP's input to 336 px
AEVLP_CLIP_SIZE, AEVLP_PATCH = 224, 32  # datasets.py's tx_pl resizes every view to 224 px


def vlp_images(seed: int = 21) -> None:
    """``vlp/images.npz``: six smooth fabricated RGB images (gradients and rectangles), ``image0`` ... ``image5``;
    kept when it exists (both VLPL's and AEVLP's fixtures are made from it)."""
    if (VLP_DIR / "images.npz").is_file():
        return
    rng = np.random.default_rng(seed)
    arrays = {}
    for i, (h, w) in enumerate(VLP_SIZES):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * rng.uniform(1, 4) + y * rng.uniform(0, 3)) % 256,
                         (y * rng.uniform(1, 5)) % 256, np.full((h, w), rng.uniform(0, 255))], axis=-1)
        for _ in range(3):
            top, left = int(rng.integers(0, h - 8)), int(rng.integers(0, w - 8))
            base[top:top + int(rng.integers(4, h // 2)), left:left + int(rng.integers(4, w // 2))] = rng.uniform(
                0, 255, 3)
        arrays[f"image{i}"] = base.astype(np.uint8)
    VLP_DIR.mkdir(exist_ok=True)
    np.savez_compressed(VLP_DIR / "images.npz", **arrays)


def _vlp_image_files(folder: Path) -> list[str]:
    """Write the fabricated images as PNG files into ``folder``; their file names."""
    from PIL import Image

    with np.load(VLP_DIR / "images.npz") as data:
        names = []
        for i in range(len(VLP_SIZES)):
            names.append(f"image{i}.png")
            Image.fromarray(data[f"image{i}"]).save(folder / names[-1])
    return names


def _tiny_clip(image_size: int, patch: int, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """The seeded tiny CLIP of tests/tiny_clip.py (installed open_clip) and its state dict."""
    import sys

    import open_clip

    sys.path.insert(0, str(HERE.parent))
    try:
        from tiny_clip import tiny_clip
    finally:
        sys.path.remove(str(HERE.parent))
    name, state = tiny_clip(image_size, patch, seed)
    model = open_clip.create_model(name)
    model.load_state_dict(state)
    return model.eval(), state


def repo_modules(root: Path, names: tuple[str, ...], stubs: dict[str, ModuleType] | None = None,
                 on_path: bool = False) -> dict[str, ModuleType]:
    """The files ``root/NAME.py`` as modules, each registered in ``sys.modules`` under its plain name while the
    next ones load (the repositories import one another by plain name); ``stubs`` stand in for packages that are
    not installed; ``on_path``: ``root`` on ``sys.path`` meanwhile (for a package folder such as AEVLP's ``clip``).
    The previous ``sys.modules`` entries are put back afterwards."""
    import sys

    import matplotlib

    matplotlib.use("Agg")
    stubs = stubs or {}
    touched = (*names, *stubs, "clip", "clip.clip", "clip.model", "clip.simple_tokenizer")
    saved = {name: sys.modules.get(name) for name in touched}
    modules: dict[str, ModuleType] = {}
    if on_path:
        sys.path.insert(0, str(root))
    try:
        for name in ("clip", "clip.clip", "clip.model", "clip.simple_tokenizer"):
            sys.modules.pop(name, None)
        sys.modules.update(stubs)
        for name in names:
            modules[name] = load_module(root / f"{name}.py", name)
            sys.modules[name] = modules[name]
        if on_path:
            modules["clip"] = sys.modules["clip"]
    finally:
        if on_path:
            sys.path.remove(str(root))
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return modules


def _transformers_stub() -> ModuleType:
    """``transformers``, which both repositories' models.py import at the top (not installed here, not used)."""
    stub = ModuleType("transformers")
    for name in ("CLIPProcessor", "CLIPVisionModel", "CLIPVisionModelWithProjection", "AutoTokenizer",
                 "CLIPTextModelWithProjection"):
        setattr(stub, name, None)
    return stub


def _text_features(model: Any, prompts: list[str]) -> torch.Tensor:
    """Normalised open_clip text features of ``prompts`` (what VLPL's precomputed ``*text_feature*.npy`` hold for
    its own CLIP and prompts)."""
    import open_clip

    with torch.no_grad():
        features = model.encode_text(open_clip.tokenize(prompts))
    return features / features.norm(dim=-1, keepdim=True)


VLPL_SETTINGS = ((0.01, 0.3), (0.05, 0.2))  # (temperature, threshold): the published one, and a second
VLPL_ALPHAS = (0.2, 0.1, 0.01)  # main_clip.py: pascal, coco/nuswide, cub


def vlpl_fixtures(root: Path, seed: int = 31) -> None:
    """``vlp/vlpl.npz`` from mvrl/VLPL's own code:

    - ``main_clip.run_train_phase`` over the fabricated images (batches of 3, one epoch, loss ``EM_PL``) for each
      (temperature, threshold) of :data:`VLPL_SETTINGS`: its input is ``datasets.get_transforms()['val']`` of each
      image (448 px, ImageNet-normalised; the 'val' transform: the 'train' one adds a random flip), which
      ``run_train_phase`` resizes to 336 px itself. Its model is ``models.ImageClassifier`` (arch ``resnet50``)
      built without its ``__init__`` (which downloads a ResNet-50 and ``openai/clip-vit-large-patch14-336``): the
      Hugging Face CLIP vision tower replaced by the seeded tiny open_clip model's ``encode_image`` (as
      ``image_embeds``), the ResNet by the images' mean colour, the classifier by a seeded ``FCNet(3, C)``; the
      text features (the repository ships precomputed ones) are the tiny model's, of ``prompts``. Recorded per
      step: ``similarity`` and ``logits_pl`` of ``ImageClassifier.forward``, the images' indices, the logits, the
      loss of ``losses.compute_batch_loss`` and its gradient with respect to the logits;
    - ``batch_*``: a float64 batch (logits up to +-40, a pseudo-positive on an observed positive) through
      ``compute_batch_loss`` (``EM_PL``, beta_pos 0.7) for each alpha of :data:`VLPL_ALPHAS`: loss and gradient.
    """
    import contextlib
    import io
    import tempfile

    mods = repo_modules(root, ("metrics", "instrumentation", "datasets", "losses", "models", "main_clip"),
                        {"transformers": _transformers_stub()})
    clip, _ = _tiny_clip(VLPL_CLIP_SIZE, VLPL_PATCH, VLP_SEEDS["vlpl"])
    prompts = [name.replace("_", " ") for name in VLP_CLASSES]  # the package's default VLPL template: "{}"
    text = _text_features(clip, prompts)
    c, rng = len(VLP_CLASSES), np.random.default_rng(seed)
    observed = single_positive(rng, len(VLP_SIZES), c)
    arrays: dict[str, np.ndarray] = {"classes": np.array(VLP_CLASSES), "prompts": np.array(prompts),
                                     "observed": observed, "settings": np.array(VLPL_SETTINGS),
                                     "clip_seed": np.array(VLP_SEEDS["vlpl"])}

    class ImageEmbeds(torch.nn.Module):  # the Hugging Face tower's interface: .image_embeds
        def forward(self, xs: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(image_embeds=clip.encode_image(xs))

    class MeanColour(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(2, 3))

    outputs: list[torch.Tensor] = []

    class RecordedFC(mods["models"].FCNet):  # type: ignore[misc, name-defined]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = super().forward(x)
            out.retain_grad()
            outputs.append(out)
            return out

    with tempfile.TemporaryDirectory() as tmp:
        names = _vlp_image_files(Path(tmp))
        from PIL import Image

        tx = mods["datasets"].get_transforms()["val"]
        images = []
        for name in names:
            with Image.open(Path(tmp) / name) as raw:
                images.append(tx(raw.convert("RGB")))
    for s, (temperature, threshold) in enumerate(VLPL_SETTINGS):
        torch.manual_seed(seed + s)
        f = object.__new__(mods["models"].ImageClassifier)
        torch.nn.Module.__init__(f)
        f.arch, f.threshold, f.temperature, f.partial, f.classes = "resnet50", threshold, temperature, 0.0, c
        f.scalar_pos, f.scalar_neg, f.device = torch.tensor(1.0), torch.tensor(-1.0), torch.device("cpu")
        f.feature_extractor, f.vision_extractor, f.linear_classifier = ImageEmbeds(), MeanColour(), RecordedFC(3, c)
        model = torch.nn.Module()
        model.f = f
        batches = [{"image": torch.stack(images[i:i + 3]), "label_vec_obs": torch.tensor(observed[i:i + 3]),
                    "label_vec_true": torch.tensor(observed[i:i + 3]), "idx": torch.arange(i, i + 3)}
                   for i in range(0, len(images), 3)]
        records: list[dict[str, Any]] = []

        def record(batch: dict[str, Any], into: list[dict[str, Any]] = records) -> None:
            into.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in batch.items()})

        logger = SimpleNamespace(update_phase_data=record)
        P = {"epoch": 1, "num_epochs": 1, "warmup_epoch": 0, "loss": "EM_PL", "alpha": 0.2, "beta_pos": 0.7,
             "txt_features": text}
        Z = {"device": torch.device("cpu"), "dataloaders": {"train": batches},
             "optimizer": torch.optim.Adam(f.linear_classifier.parameters(), lr=1e-2)}
        outputs.clear()
        saved_tqdm = mods["main_clip"].tqdm
        mods["main_clip"].tqdm = lambda iterable, **_kw: iterable
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                mods["main_clip"].run_train_phase(model, P, Z, logger, 1, "train")
        finally:
            mods["main_clip"].tqdm = saved_tqdm
        assert len(records) == len(outputs) == len(batches)
        arrays[f"s{s}_similarity"] = torch.cat([r["similarity"] for r in records]).numpy()
        arrays[f"s{s}_logits_pl"] = torch.cat([r["logits_pl"] for r in records]).numpy()
        arrays[f"s{s}_step_index"] = np.stack([r["idx"].numpy() for r in records])
        arrays[f"s{s}_step_logits"] = np.stack([o.detach().numpy() for o in outputs])
        arrays[f"s{s}_step_loss"] = np.array([float(r["loss_np"]) for r in records])
        arrays[f"s{s}_step_grad"] = np.stack([o.grad.numpy() for o in outputs])
    assert arrays["s0_logits_pl"].any() and not arrays["s0_logits_pl"].all()

    logits = rng.normal(0.0, 3.0, (8, c))
    logits[0, :3], logits[1, :2] = [40.0, -40.0, 20.0], [-40.0, 40.0]
    batch_observed = single_positive(rng, 8, c)
    pseudo = (rng.random((8, c)) < 0.3).astype(np.float64)
    pseudo[0, int(np.argmax(batch_observed[0]))] = 1.0  # on the observed positive: no effect there
    pseudo[0, 1] = 1.0  # a pseudo-positive at logit -40
    arrays.update({"batch_logits": logits, "batch_observed": batch_observed, "batch_pseudo": pseudo,
                   "batch_alphas": np.array(VLPL_ALPHAS)})
    losses, grads = [], []
    for alpha in VLPL_ALPHAS:
        x = torch.tensor(logits, requires_grad=True)
        batch = {"preds": torch.sigmoid(x), "label_vec_obs": torch.tensor(batch_observed),
                 "label_vec_true": torch.tensor(batch_observed), "logits_pl": torch.tensor(pseudo),
                 "similarity": torch.zeros_like(x)}
        P = {"loss": "EM_PL", "epoch": 1, "warmup_epoch": 0, "alpha": alpha, "beta_pos": 0.7}
        mods["losses"].compute_batch_loss(batch, P, {})["loss_tensor"].backward()
        losses.append(float(batch["loss_tensor"].item()))
        grads.append(x.grad.numpy().copy())
    arrays["batch_loss"], arrays["batch_grad"] = np.array(losses), np.stack(grads)
    np.savez_compressed(VLP_DIR / "vlpl.npz", **arrays)


# name -> pseudo-label and loss settings of an AEVLP run: configs/pascal.json, and one that exercises the other
# branches (the "negatives" clearing pseudo-positives: threshold 0 with the top 4 of 6 classes; CUB's beta and q3,
# a 2 x 2 grid)
AEVLP_CONFIGS: dict[str, dict[str, Any]] = {
    "pascal": {"temp": 0.01, "eta": 0.0, "threshold": 0.5, "grid_size": 4, "negative_ratio": 0.2, "top_k": 3,
               "beta": [0, 2, -2, -2], "alpha": [0.5, 2, 0.8, 0.5], "q2q3": [0.01, 1], "lam_1": 0.7, "lam_2": 0.4,
               "rho": 0.9, "reg": 0.05, "expected_num_pos": 1.5, "num_epochs": 3},
    "varied": {"temp": 0.02, "eta": 0.05, "threshold": 0.0, "grid_size": 2, "negative_ratio": 0.5, "top_k": 4,
               "beta": [0, 10, -2, -8], "alpha": [0.5, 2, 0.8, 0.5], "q2q3": [0.01, 1.5], "lam_1": 0.8,
               "lam_2": 0.2, "rho": 0.9, "reg": 0.01, "expected_num_pos": 2.0, "num_epochs": 3},
}


def aevlp_reference_loop(mods: dict[str, ModuleType], state: dict[str, torch.Tensor], cfg: dict[str, Any],
                         observed: np.ndarray, logits: np.ndarray, folder: Path, names: list[str],
                         seed: int) -> dict[str, np.ndarray]:
    """Run AEVLP's own ``train.run_train`` over the fabricated images and record what its loop computes.

    Stand-ins, seen by ``train.py`` only and for this call only: ``datasets.get_data`` (rows with the ``logits``
    as "images", ``observed`` as observed and true labels, and the ``sub_images`` - whole image and crops - that
    the reference's own ``datasets.ds_multilabel`` makes of each image file with its ``tx_pl``, the random
    horizontal flip set to probability 0), ``models.ImageClassifier`` (logits = image * scale + bias),
    ``models.load_clip_to_cpu`` (the reference's ``clip.build_model`` of the tiny CLIP's state dict, in float32),
    ``PseudoLabelGeneratorOpenAI.gcn_forward`` (zero: the random, untrained graph convolution left out),
    ``compute_metrics`` (a rising val mAP: no early stop), ``compute_precision_recall_pl`` and ``tqdm``.
    ``get_pseudo_labels`` and ``GPR_loss`` are wrapped to record their arguments and results.
    """
    import contextlib
    import io
    import tempfile

    train_mod, models_mod, losses_mod, datasets_mod, utils_mod = (mods[k] for k in ("train", "models", "losses",
                                                                                   "datasets", "utils"))
    n, c = logits.shape
    g = cfg["grid_size"]
    no_flip = SimpleNamespace(**{**vars(mods["transforms"]),
                                 "RandomHorizontalFlip": lambda p: mods["transforms"].RandomHorizontalFlip(0.0)})
    saved_globals = {name: getattr(datasets_mod, name) for name in ("transforms", "get_metadata")}
    datasets_mod.transforms = no_flip
    datasets_mod.get_metadata = lambda _name: {"num_classes": c, "path_to_images": str(folder)}
    try:
        P0 = {"arch": "resnet50", "source": "openai"}
        tx = datasets_mod.get_transforms(P0)
        ref_ds = datasets_mod.ds_multilabel("pascal", np.array(names), observed, observed, [], tx["train"], False, g,
                                            tx["pl"], True)
        sub_images = [ref_ds[i]["sub_images"] for i in range(n)]
    finally:
        for name, value in saved_globals.items():
            setattr(datasets_mod, name, value)

    class Rows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.pseudo_label_matrix = np.zeros((n, c))
            self.accessed: list[int] = []  # the images in the order the loader takes them

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            self.accessed.append(i)
            return {"image": torch.from_numpy(logits[i]), "label_vec_obs": torch.from_numpy(observed[i]),
                    "label_vec_true": torch.from_numpy(observed[i]), "idx": i, "sub_images": sub_images[i],
                    "pseudo_label_vec": torch.FloatTensor(self.pseudo_label_matrix[i])}

    outputs: list[torch.Tensor] = []

    class Classifier(torch.nn.Module):
        def __init__(self, _p: dict[str, Any]) -> None:
            super().__init__()
            self.feature_extractor, self.linear_classifier = FakeFeatures(c), FakeHead(c)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = x * self.feature_extractor.scale + self.linear_classifier.bias
            if self.training and out.requires_grad:
                out.retain_grad()
                outputs.append(out)
            return out

    class WithoutGcn(models_mod.PseudoLabelGeneratorOpenAI):  # type: ignore[misc, name-defined]
        def gcn_forward(self, text_features: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(text_features)

    pl_calls: list[dict[str, Any]] = []
    loss_calls: list[dict[str, Any]] = []
    k_params: list[tuple[float, float]] = []
    v_params: list[tuple[float, float]] = []

    def recorded_k(w: float, b: float) -> torch.nn.Module:
        k_params.append((w, b))
        return models_mod.KFunction(w, b)

    def recorded_v(p: torch.Tensor, mu: float, sigma: float) -> torch.Tensor:
        v_params.append((mu, sigma))
        return models_mod.VFunction(p, mu, sigma)

    def recorded_pl(pl_logits: torch.Tensor, preds: torch.Tensor, pseudo_label_vec: torch.Tensor,
                    label_vec: torch.Tensor, P: Any) -> Any:
        out = utils_mod.get_pseudo_labels(pl_logits, preds, pseudo_label_vec, label_vec, P)
        pl_calls.append({"pl_logits": pl_logits.numpy().copy(), "pseudo": out[1].numpy().copy()})
        return out

    def recorded_loss(lg: torch.Tensor, pseudo: torch.Tensor, label_vec: torch.Tensor, K: Any, V: Any, Q: Any,
                      epoch: int, P: Any = None) -> torch.Tensor:
        loss = losses_mod.GPR_loss(lg, pseudo, label_vec, K, V, Q, epoch, P)
        loss_calls.append({"epoch": epoch, "observed": label_vec.numpy().copy(), "loss": loss.item(),
                           "schedule": (*k_params[-1], *v_params[-1])})
        return loss

    maps = iter(range(1, 1000))
    data = {phase: Rows() for phase in ("train", "val", "test")}
    classnames = folder / "classnames.txt"
    classnames.write_text("\n".join(VLP_CLASSES))
    relation = folder / "relation.npy"
    np.save(relation, np.random.default_rng(0).random((c, c)))
    P = {"bsize": 3, "num_workers": 0, "lr": 1e-5, "lr_mult": 10, "optimizer": "adam", "is_train": False,
         "linear_init": 0, "arch": "resnet50", "loss": "gpr_loss", "use_pl": True, "source": "openai",
         "clip_model": "ViT-B/16", "n_ctx": 4, "ctx_init": "a photo of a", "classnames": str(classnames),
         "relation": str(relation), "sparse_topk": c, "reweight_p": 0.2, "T": 0.3, "num_classes": c,
         "gpu_num": "0", **cfg}
    build = mods["clip"].model.build_model
    patches = {
        "datasets": SimpleNamespace(get_data=lambda _p: data),
        "models": SimpleNamespace(**{**vars(models_mod), "ImageClassifier": Classifier,
                                     "PseudoLabelGeneratorOpenAI": WithoutGcn, "KFunction": recorded_k,
                                     "VFunction": recorded_v}),
        "losses": SimpleNamespace(**{**vars(losses_mod), "GPR_loss": recorded_loss}),
        "get_pseudo_labels": recorded_pl,
        "compute_metrics": lambda _pred, _true: {"map": float(next(maps))},
        "compute_precision_recall_pl": lambda *_a: (0.0, 0.0, 0.0),
        "tqdm": lambda iterable: iterable,
    }
    saved = {name: getattr(train_mod, name) for name in patches}
    saved_loader = models_mod.load_clip_to_cpu
    with tempfile.TemporaryDirectory() as tmp:
        P["save_path"] = tmp
        try:
            for name, value in patches.items():
                setattr(train_mod, name, value)
            models_mod.load_clip_to_cpu = lambda _name: build({k: v.clone() for k, v in state.items()}).float()
            torch.manual_seed(seed)  # the loader's shuffling
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pin_memory without a GPU
                train_mod.run_train(P)
        finally:
            for name, value in saved.items():
                setattr(train_mod, name, value)
            models_mod.load_clip_to_cpu = saved_loader
    steps = len(loss_calls)
    assert steps == len(outputs) == len(pl_calls) == cfg["num_epochs"] * -(-n // 3)
    epochs = np.array([call["epoch"] for call in loss_calls])
    schedule = [[call["schedule"] for call in loss_calls if call["epoch"] == e]
                for e in range(1, cfg["num_epochs"] + 1)]
    assert all(len(set(group)) == 1 for group in schedule)  # set once per epoch
    return {
        "schedule": np.array([group[0] for group in schedule], dtype=np.float64),
        "step_index": np.array(data["train"].accessed).reshape(steps, -1),
        "step_epoch": epochs,
        "step_observed": np.stack([call["observed"] for call in loss_calls]),
        "step_logits": np.stack([o.detach().numpy() for o in outputs]),
        "step_loss": np.array([call["loss"] for call in loss_calls]),
        "step_grad": np.stack([o.grad.numpy() for o in outputs]),
        "step_pl_logits": np.stack([call["pl_logits"] for call in pl_calls]),
        "step_pseudo": np.stack([call["pseudo"] for call in pl_calls]),
    }


def aevlp_fixtures(root: Path, seed: int = 41) -> None:
    """``vlp/aevlp_{pascal,varied}.npz`` from Fsoft-AIC/AEVLP's own code, for each of :data:`AEVLP_CONFIGS`:

    - ``step_*``: its ``train.run_train`` loop (:func:`aevlp_reference_loop`) over the six fabricated images in
      shuffled batches of 3 for 3 epochs: per step the epoch, observed labels, logits, CLIP's view cosines
      (``pl_logits``: the batch's whole images, then crop 1 of each, crop 2 of each, ...), the pseudo-labels of
      ``get_pseudo_labels`` (its second output, the one train.py uses), the ``GPR_loss`` and its gradient;
    - ``batch_*``: a float64 batch (logits up to +-40 and -200, pseudo-positives on observed positives too) and,
      for every epoch's schedule (w, b, mu, sigma of ``train.py``), ``GPR_loss`` with ``models.KFunction`` /
      ``models.VFunction`` of the detached probabilities: loss and gradient.
    """
    import tempfile

    import torchvision.transforms

    mods = repo_modules(root, ("metrics", "instrumentation", "utils", "losses", "datasets", "models", "train"),
                        {"transformers": _transformers_stub()}, on_path=True)
    mods["transforms"] = torchvision.transforms  # type: ignore[assignment]
    _, state = _tiny_clip(AEVLP_CLIP_SIZE, AEVLP_PATCH, VLP_SEEDS["aevlp"])
    c, n = len(VLP_CLASSES), len(VLP_SIZES)
    rng = np.random.default_rng(seed)
    for name, cfg in AEVLP_CONFIGS.items():
        observed = single_positive(rng, n, c)
        logits = rng.normal(0.0, 2.0, (n, c)).astype(np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            names = _vlp_image_files(Path(tmp))
            loop = aevlp_reference_loop(mods, state, cfg, observed, logits, Path(tmp), names, seed)
        arrays: dict[str, np.ndarray] = {
            "classes": np.array(VLP_CLASSES), "observed": observed, "clip_seed": np.array(VLP_SEEDS["aevlp"]),
            "settings": np.array(json.dumps(cfg)), **loop,
        }
        batch_logits = rng.normal(0.0, 3.0, (8, c))
        batch_logits[0, :4] = [40.0, -40.0, 20.0, -200.0]
        batch_observed = single_positive(rng, 8, c)
        batch_observed[0], batch_observed[0, 3] = 0.0, 1.0  # the observed positive at -200
        batch_pseudo = (rng.random((8, c)) < 0.35).astype(np.float64)
        batch_pseudo[0, 3] = batch_pseudo[0, 1] = 1.0  # on the observed positive; at -40
        results = []
        for w, b, mu, sigma in loop["schedule"]:
            x = torch.tensor(batch_logits, requires_grad=True)
            preds = torch.sigmoid(x).detach()
            k_values = mods["models"].KFunction(w, b)(preds)
            v_values = mods["models"].VFunction(preds, mu, sigma)
            P = {"use_pl": True, "lam_1": cfg["lam_1"], "lam_2": cfg["lam_2"], "rho": cfg["rho"], "reg": cfg["reg"],
                 "expected_num_pos": cfg["expected_num_pos"], "num_classes": c}
            loss = mods["losses"].GPR_loss(x, torch.tensor(batch_pseudo), torch.tensor(batch_observed), k_values,
                                           v_values, cfg["q2q3"], 1, P)
            loss.backward()
            results.append((loss.item(), x.grad.numpy().copy()))
        arrays.update({"batch_logits": batch_logits, "batch_observed": batch_observed, "batch_pseudo": batch_pseudo,
                       "batch_loss": np.array([r[0] for r in results]),
                       "batch_grad": np.stack([r[1] for r in results])})
        np.savez_compressed(VLP_DIR / f"aevlp_{name}.npz", **arrays)


def main() -> None:
    """Parse the checkout paths and write the fixtures of each group given."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large-loss", type=Path, help="checkout of snucml/LargeLossMatters")
    parser.add_argument("--bridge-gap", type=Path, help="checkout of youngwk/BridgeGapExplanationPAMC")
    parser.add_argument("--gr-loss", type=Path, help="checkout of yan4xi1/GRLoss")
    parser.add_argument("--vlpl", type=Path, help="checkout of mvrl/VLPL")
    parser.add_argument("--aevlp", type=Path, help="checkout of Fsoft-AIC/AEVLP")
    args = parser.parse_args()
    if (args.large_loss is None) != (args.bridge_gap is None):
        parser.error("--large-loss and --bridge-gap go together")
    if all(getattr(args, name) is None for name in ("large_loss", "gr_loss", "vlpl", "aevlp")):
        parser.error("give --large-loss and --bridge-gap, --gr-loss, --vlpl, --aevlp, or several")
    if args.large_loss is not None:
        large_loss_and_boostlu(args.large_loss, args.bridge_gap)
    if args.gr_loss is not None:
        gr_loss_fixtures(args.gr_loss)
    if args.vlpl is not None or args.aevlp is not None:
        vlp_images()
    if args.vlpl is not None:
        vlpl_fixtures(args.vlpl)
    if args.aevlp is not None:
        aevlp_fixtures(args.aevlp)


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
