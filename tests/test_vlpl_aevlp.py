"""The methods vlpl and aevlp: losses and gradients equal to the references' (tests/data/vlp: mvrl/VLPL's
``loss_EM_PL`` through ``compute_batch_loss`` and its ``run_train_phase``; Fsoft-AIC/AEVLP's ``GPR_loss`` with its
``train.run_train`` schedules), their presets, and one epoch end to end through the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_clip import save_tiny_clip

from models import load_checkpoint
from train.config import TrainConfig
from train.methods import METHODS, EpochEndContext, MethodContext, make_hparams
from train.trainer import Trainer

DATA = Path(__file__).parent / "data" / "vlp"


def method(name: str, observed: np.ndarray, pseudo: np.ndarray, epochs: int = 1, **hp: str) -> torch.nn.Module:
    ctx = MethodContext(num_classes=observed.shape[1], num_train=len(observed),
                        train_observed=torch.tensor(observed, dtype=torch.float32), expected_positives=float("nan"),
                        epochs=epochs, pseudo_positives=torch.tensor(pseudo, dtype=torch.bool))
    return METHODS[name](ctx, make_hparams(METHODS[name], hp))


def loss_and_grad(m: torch.nn.Module, logits: np.ndarray, observed: np.ndarray,
                  index: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    x = torch.tensor(logits, requires_grad=True)
    index = np.arange(len(logits)) if index is None else index
    out = m.loss(x, {"observed": torch.tensor(observed, dtype=x.dtype), "index": torch.tensor(index)})
    out.loss.backward()
    assert x.grad is not None
    return out.loss.item(), x.grad.numpy()


@pytest.mark.parametrize("alpha_index", [0, 1, 2])
def test_vlpl_loss_and_gradient_equal_the_reference_in_float64(alpha_index: int) -> None:
    ref = np.load(DATA / "vlpl.npz")
    alpha = float(ref["batch_alphas"][alpha_index])
    m = method("vlpl", ref["batch_observed"], ref["batch_pseudo"] == 1, alpha=str(alpha), beta_pos="0.7")
    loss, grad = loss_and_grad(m, ref["batch_logits"], ref["batch_observed"])
    assert loss == pytest.approx(float(ref["batch_loss"][alpha_index]), rel=1e-13)
    np.testing.assert_allclose(grad, ref["batch_grad"][alpha_index], rtol=1e-11, atol=1e-16)


def test_vlpl_steps_of_the_reference_loop() -> None:
    """run_train_phase's steps (float32 logits, pseudo-labels of its own forward) give the same loss and
    gradient."""
    ref = np.load(DATA / "vlpl.npz")
    for s in range(len(ref["settings"])):
        m = method("vlpl", ref["observed"], ref[f"s{s}_logits_pl"] == 1, alpha="0.2")
        for step, index in enumerate(ref[f"s{s}_step_index"]):
            loss, grad = loss_and_grad(m, ref[f"s{s}_step_logits"][step], ref["observed"][index], index)
            assert loss == pytest.approx(float(ref[f"s{s}_step_loss"][step]), rel=1e-6)
            np.testing.assert_allclose(grad, ref[f"s{s}_step_grad"][step], rtol=1e-5, atol=1e-9)


def aevlp_hparams(cfg: dict[str, object]) -> dict[str, str]:
    """``--hp`` values of an AEVLP config of the fixtures."""
    beta, alpha, q2q3 = cfg["beta"], cfg["alpha"], cfg["q2q3"]
    return {"beta": ",".join(map(str, beta)), "alpha": ",".join(map(str, alpha)),  # type: ignore[arg-type]
            "q2": str(q2q3[0]), "q3": str(q2q3[1]), "lam": f"{cfg['lam_1']},{cfg['lam_2']}",  # type: ignore[index]
            "rho": str(cfg["rho"]), "reg": str(cfg["reg"]), "k": str(cfg["expected_num_pos"])}


def advance(m: torch.nn.Module, epoch: int) -> None:
    """Move the method's schedule to ``epoch`` as the trainer does (an epoch end after each epoch)."""
    while int(m.epoch) < epoch:  # type: ignore[call-overload]
        m.on_epoch_end(EpochEndContext(epoch=int(m.epoch), predict_train=lambda _augment: torch.zeros(0)))


@pytest.mark.parametrize("config", ["pascal", "varied"])
def test_aevlp_gpr_loss_equals_the_reference_in_float64_at_every_epoch(config: str) -> None:
    ref = np.load(DATA / f"aevlp_{config}.npz")
    cfg = json.loads(str(ref["settings"]))
    epochs = int(cfg["num_epochs"])
    m = method("aevlp", ref["batch_observed"], ref["batch_pseudo"] == 1, epochs=epochs, **aevlp_hparams(cfg))
    for epoch in range(1, epochs + 1):
        advance(m, epoch)
        np.testing.assert_allclose(m.schedule(), ref["schedule"][epoch - 1], rtol=1e-15)
        loss, grad = loss_and_grad(m, ref["batch_logits"], ref["batch_observed"])
        assert loss == pytest.approx(float(ref["batch_loss"][epoch - 1]), rel=1e-12)
        np.testing.assert_allclose(grad, ref["batch_grad"][epoch - 1], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("config", ["pascal", "varied"])
def test_aevlp_steps_of_the_reference_training_loop(config: str) -> None:
    """run_train's steps over 3 epochs: its own pseudo-labels (the same at every step: no flips), the schedule of
    each epoch, float32 logits: the same loss and gradient."""
    ref = np.load(DATA / f"aevlp_{config}.npz")
    cfg = json.loads(str(ref["settings"]))
    pseudo = np.zeros(ref["observed"].shape, dtype=bool)
    for index, step_pseudo in zip(ref["step_index"], ref["step_pseudo"], strict=True):
        pseudo[index] = step_pseudo == 1
    for index, step_pseudo in zip(ref["step_index"], ref["step_pseudo"], strict=True):
        np.testing.assert_array_equal(pseudo[index], step_pseudo == 1)
    m = method("aevlp", ref["observed"], pseudo, epochs=int(cfg["num_epochs"]), **aevlp_hparams(cfg))
    for step, index in enumerate(ref["step_index"]):
        advance(m, int(ref["step_epoch"][step]))
        loss, grad = loss_and_grad(m, ref["step_logits"][step], ref["step_observed"][step], index)
        assert loss == pytest.approx(float(ref["step_loss"][step]), rel=1e-6)
        np.testing.assert_allclose(grad, ref["step_grad"][step], rtol=1e-5, atol=1e-9)


def test_presets_follow_the_published_settings() -> None:
    voc = make_hparams(METHODS["aevlp"], {}, "voc2012")
    assert (voc.lam, voc.reg, voc.k, voc.eta, voc.beta) == ((0.7, 0.4), 0.05, 1.5, 0.0, (0.0, 2.0, -2.0, -2.0))
    cub = make_hparams(METHODS["aevlp"], {}, "cub")
    assert (cub.lam, cub.reg, cub.q3, cub.top_k, cub.grid_size, cub.k) == ((0.8, 0.2), 0.01, 1.5, 32, 5, 31.4)
    assert make_hparams(METHODS["aevlp"], {}, "nus").threshold == 0.6
    assert make_hparams(METHODS["aevlp"], {"lam": "0.6,0.3"}, "coco2014").lam == (0.6, 0.3)
    assert [make_hparams(METHODS["vlpl"], {}, d).alpha for d in ("voc", "coco", "nus", "cub")] == [0.2, 0.1, 0.1,
                                                                                                    0.01]
    assert make_hparams(METHODS["vlpl"], {}, "voc").beta_pos == 0.7
    with pytest.raises(ValueError, match="lam2 <= lam1"):
        make_hparams(METHODS["aevlp"], {"lam": "0.2,0.7"})


def test_a_method_without_pseudo_labels_is_refused() -> None:
    ctx = MethodContext(num_classes=3, num_train=2, train_observed=torch.zeros(2, 3), expected_positives=1.0,
                        epochs=1)
    for name in ("vlpl", "aevlp"):
        with pytest.raises(ValueError, match="pseudo_positives is missing"):
            METHODS[name](ctx, make_hparams(METHODS[name], {}))


@pytest.mark.parametrize("name", ["vlpl", "aevlp"])
def test_one_epoch_end_to_end(squares_csv: Path, tmp_path: Path, name: str) -> None:
    """Through the trainer with the tiny CLIP: the pseudo-labels reach the method, their precision is logged (the
    squares data hides full labels behind single positives), the checkpoint records the method."""
    cfg = TrainConfig(data=f"csv:{squares_csv}", arch="resnet18", weights="none", image_size=32, batch_size=16,
                      epochs=1, workers=0, progress=False, runs_dir=str(tmp_path), lgconv=False, method=name,
                      labels="full", observed="single",  # the squares are a benchmark: full labels, one observed
                      name=name, clip=save_tiny_clip(tmp_path / "clip", 32, 8, 0), hp={"threshold": "0.2"})
    trainer = Trainer(cfg)
    assert trainer.run.pseudo_labels is not None
    np.testing.assert_array_equal(trainer.run.method.pseudo_positives.numpy(), trainer.run.pseudo_labels.positives)
    summary = trainer.fit()
    assert 0 < summary["test"]["mAP"] <= 100
    line = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    assert line["loss"] > -10 and ("clip_positive_precision" in line) == bool(
        (trainer.run.pseudo_labels.positives & (trainer.run.splits.train_observed == 0)).any())
    assert load_checkpoint(tmp_path / name / "best.pt").meta.method == name
