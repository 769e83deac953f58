"""GR-Loss against values the authors' own code computed on the same inputs (tests/data/gr_loss, see
tests/data/README.md): the loss and its gradient, the schedules, a replay of the reference training loop; its
hyperparameters, presets, state and the LinearInit epochs."""

from __future__ import annotations

import dataclasses
import io
import json
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from models import load_checkpoint
from train.config import TrainConfig
from train.fixed_features import FixedFeaturePhase
from train.methods import METHODS, EpochEndContext, MethodContext, make_hparams
from train.methods.base import _convert, paper_settings_for
from train.methods.gr_loss import GeneralizedRobustLoss, GrLossHparams, gr_entry_loss, gr_schedule
from train.options import build_parser, config_from_args
from train.trainer import Trainer

DATA = Path(__file__).resolve().parent / "data" / "gr_loss"
CONFIGS = ("voc", "cub", "coco_linear_init")


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


def hp_strings(ref: dict[str, np.ndarray]) -> dict[str, str]:
    """The fixture's settings as ``--hp`` strings (so every comparison also goes through the parser)."""
    q2, q3 = ref["q2q3"]
    return {"beta": ",".join(f"{v:g}" for v in ref["beta"]), "alpha": ",".join(f"{v:g}" for v in ref["alpha"]),
            "q2": f"{q2:g}", "q3": f"{q3:g}"}


def make_method(ref: dict[str, np.ndarray], observed: np.ndarray | None = None) -> GeneralizedRobustLoss:
    """gr-loss with the fixture's settings, over a run of its T epochs with its n LinearInit epochs."""
    labels = torch.from_numpy(np.asarray(ref["batch_observed"] if observed is None else observed, dtype=np.float32))
    ctx = MethodContext(num_classes=labels.shape[1], num_train=labels.shape[0], train_observed=labels,
                        expected_positives=float("nan"), epochs=int(ref["epochs"]),
                        linear_init_epochs=int(ref["linear_init"]))
    method = METHODS["gr-loss"](ctx, make_hparams(METHODS["gr-loss"], hp_strings(ref)))
    assert isinstance(method, GeneralizedRobustLoss)
    return method


def end_epoch(method: GeneralizedRobustLoss, epoch: int) -> dict[str, float]:
    return method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=lambda _augment: torch.zeros(0)))


def round_trip(method: GeneralizedRobustLoss, ref: dict[str, np.ndarray]) -> GeneralizedRobustLoss:
    """A fresh method loaded from ``method``'s state through a weights_only checkpoint (what --resume does)."""
    buffer = io.BytesIO()
    torch.save(method.state_dict(), buffer)
    buffer.seek(0)
    fresh = make_method(ref)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    return fresh


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_and_gradient_equal_the_reference_at_every_epoch(name: str) -> None:
    """float64, saturated logits (+-40, -200) on unobserved entries and on observed positives."""
    ref = reference(name)
    method = make_method(ref)
    batch = {"observed": torch.from_numpy(ref["batch_observed"].astype(np.float64)),
             "index": torch.arange(ref["batch_observed"].shape[0])}
    losses = []
    for epoch in range(1, int(ref["epochs"]) + 1):
        logits = torch.from_numpy(ref["batch_logits"]).requires_grad_()
        loss = method.loss(logits, batch).loss
        loss.backward()
        assert loss.dtype == torch.float64
        assert loss.item() == pytest.approx(float(ref["batch_loss"][epoch - 1]), rel=1e-13, abs=0), epoch
        # atol: at logit 20 the reference's 1 - sigmoid(20) keeps 8 digits (the package's log-sigmoid form all)
        np.testing.assert_allclose(logits.grad.numpy(), ref["batch_grad"][epoch - 1], rtol=1e-10, atol=1e-15,
                                   err_msg=f"epoch {epoch}")
        losses.append(loss.item())
        end_epoch(method, epoch)
    assert len(set(losses)) > len(losses) // 2  # the schedule changes the loss over the run


@pytest.mark.parametrize("name", CONFIGS)
def test_schedule_equals_the_reference_loop(name: str) -> None:
    """(w, b, mu, sigma) of every epoch as the reference's run_train built them (recorded from its KFunction and
    VFunction calls), with the offsets 1 (w, b) and 0 (mu, sigma) after the LinearInit epochs."""
    ref = reference(name)
    method = make_method(ref)
    epochs, linear_init = int(ref["epochs"]), int(ref["linear_init"])
    for epoch in range(1, epochs + 1):
        assert method.schedule() == tuple(ref["loop_schedule"][epoch - 1]), epoch
        logs = end_epoch(method, epoch)
        assert (logs["gr_w"], logs["gr_b"], logs["gr_mu"], logs["gr_sigma"]) == tuple(ref["loop_schedule"][epoch - 1])
    assert int(method.epoch) == epochs + 1
    # the reference freezes its trunk in exactly the n LinearInit epochs, during which nothing moves
    np.testing.assert_array_equal(ref["loop_frozen"], np.arange(1, epochs + 1) <= linear_init)
    beta, alpha = ref["beta"], ref["alpha"]
    first = ref["loop_schedule"][linear_init]  # the first end-to-end epoch: w, b not moved yet, mu, sigma moved
    assert (first[0], first[1]) == (beta[0], beta[2]) and first[2] != alpha[0]
    last = ref["loop_schedule"][-1]  # the last epoch: mu, sigma at their final values, w, b one step short
    assert (last[2], last[3]) == pytest.approx((alpha[2], alpha[3]), abs=1e-15) and last[0] != beta[1]
    for epoch in range(1, linear_init + 1):
        assert tuple(ref["loop_schedule"][epoch - 1]) == (beta[0], beta[2], alpha[0], alpha[1])


@pytest.mark.parametrize("name", CONFIGS)
def test_replays_the_reference_training_loop(name: str) -> None:
    """Every step of the reference's loop (float32 logits of its network, its shuffled batches): the same loss
    and gradient; the method state goes through a checkpoint after epoch 2 (--resume)."""
    ref = reference(name)
    method = make_method(ref)
    epochs = ref["loop_step_epoch"]
    for step, epoch in enumerate(epochs):
        if step and epoch != epochs[step - 1]:
            end_epoch(method, int(epochs[step - 1]))
            if epoch == 3:
                method = round_trip(method, ref)
        logits = torch.from_numpy(ref["loop_step_logits"][step]).requires_grad_()
        observed = torch.from_numpy(ref["loop_step_observed"][step])
        loss = method.loss(logits, {"observed": observed, "index": torch.arange(3)}).loss
        loss.backward()
        assert loss.item() == pytest.approx(float(ref["loop_step_loss"][step]), rel=2e-6), step
        # float32: the reference's 1 - p near p = 1 keeps few digits (atol 1e-8 of gradients up to ~2e-2)
        np.testing.assert_allclose(logits.grad.numpy(), ref["loop_step_grad"][step], rtol=2e-5, atol=1e-8,
                                   err_msg=f"step {step}")


def test_float32_is_finite_where_the_reference_is_not() -> None:
    """The reference's float32 gradient is not finite on the batch with a logit of -200 (sigmoid underflows to 0
    and pow(0, q2 - 1) is inf); the package's equals the float64 reference there."""
    ref = reference("voc")
    assert not ref["batch_grad_finite32"]
    method = make_method(ref)
    logits = torch.from_numpy(ref["batch_logits"].astype(np.float32)).requires_grad_()
    loss = method.loss(logits, {"observed": torch.from_numpy(ref["batch_observed"]), "index": torch.arange(10)}).loss
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    assert loss.item() == pytest.approx(float(ref["batch_loss"][0]), rel=1e-6)
    np.testing.assert_allclose(logits.grad.numpy(), ref["batch_grad"][0], rtol=1e-4, atol=1e-9)


def test_labels_other_than_0_and_1_add_nothing_but_count_in_the_mean() -> None:
    ref = reference("voc")
    logits = torch.from_numpy(ref["batch_logits"]).requires_grad_()
    entries = gr_entry_loss(logits, torch.from_numpy(ref["odd_observed"].astype(np.float64)),
                            tuple(ref["loop_schedule"][0]), *ref["q2q3"])
    loss = entries.mean()
    loss.backward()
    assert loss.item() == pytest.approx(float(ref["odd_loss"]), rel=1e-13)
    np.testing.assert_allclose(logits.grad.numpy(), ref["odd_grad"], rtol=1e-10, atol=1e-15)
    assert (entries[torch.from_numpy((ref["odd_observed"] != 0) & (ref["odd_observed"] != 1))] == 0).all()


def test_hyperparameters_parse_from_hp_strings() -> None:
    gr = METHODS["gr-loss"]
    default = make_hparams(gr, {})
    assert (default.beta, default.alpha, default.q2, default.q3) == ((0.0, 2.0, -2.0, -2.0), (0.5, 2.0, 0.8, 0.5),
                                                                      0.01, 1.0)
    hp = make_hparams(gr, {"beta": "0,10,-2,-8", "alpha": "[0.5, 2, 0.8, 0.5]", "q3": "1.5"})
    assert hp.beta == (0.0, 10.0, -2.0, -8.0) and all(type(v) is float for v in hp.beta)
    assert hp.alpha == (0.5, 2.0, 0.8, 0.5) and hp.q3 == 1.5
    with pytest.raises(ValueError, match="--hp beta=0,1,2: expected 4 comma-separated values"):
        make_hparams(gr, {"beta": "0,1,2"})
    with pytest.raises(ValueError, match="--hp beta=a,b,c,d"):
        make_hparams(gr, {"beta": "a,b,c,d"})
    with pytest.raises(ValueError, match="sigmas"):
        make_hparams(gr, {"alpha": "0.5,0,0.8,0.5"})
    with pytest.raises(ValueError, match="q2 and q3"):
        make_hparams(gr, {"q2": "0"})
    assert GrLossHparams(beta=[0, 1, 2, 3]).beta == (0.0, 1.0, 2.0, 3.0)  # a JSON list becomes a tuple of floats
    # the converter's tuple forms, also inside Optional
    assert _convert("1,2,3", tuple[int, ...]) == (1, 2, 3)
    assert _convert("(1, 2)", tuple[float, float] | None) == (1.0, 2.0)
    assert _convert("none", typing.Optional[tuple[float, float]]) is None  # noqa: UP045 (the typing spelling too)
    assert _convert("0.5", float | None) == 0.5 and _convert("yes", bool) is True  # scalars unchanged
    # from the command line
    cfg = config_from_args(build_parser().parse_args(["--method", "gr-loss", "--hp", "beta=0,10,-2,-8",
                                                      "--hp", "q3=1.5"]))
    assert make_hparams(gr, cfg.hp).beta == (0.0, 10.0, -2.0, -8.0)


def test_presets_per_dataset_family_and_paper_settings(tmp_path: Path) -> None:
    gr = METHODS["gr-loss"]
    voc, coco, nus, cub = (make_hparams(gr, {}, d) for d in ("voc2012", "coco2014", "nuswide", "cub200"))
    assert voc == make_hparams(gr, {})  # the repository's defaults (and AEVLP's pascal.json)
    assert coco.beta == nus.beta == cub.beta == (0.0, 10.0, -2.0, -8.0)  # AEVLP's configs
    assert (coco.q3, nus.q3, cub.q3) == (1.0, 1.0, 1.5)
    assert all(h.alpha == (0.5, 2.0, 0.8, 0.5) and h.q2 == 0.01 for h in (voc, coco, nus, cub))
    assert make_hparams(gr, {"q3": "2"}, "cub200").q3 == 2.0  # the flag wins
    assert make_hparams(gr, {}, "mydata") == make_hparams(gr, {})
    assert paper_settings_for(gr, "coco2014") == {"batch_size": 8, "lr": 1e-5, "head_lr_mult": 10.0, "epochs": 8,
                                                  "optimizer": "adam", "scheduler": "none"}
    cfg = config_from_args(build_parser().parse_args(["--preset", "paper", "--method", "gr-loss", "--data",
                                                      "coco:/nowhere", "--runs-dir", str(tmp_path)]))
    assert (cfg.arch, cfg.image_size, cfg.batch_size, cfg.lr, cfg.head_lr_mult, cfg.epochs, cfg.scheduler) == (
        "resnet50", 448, 8, 1e-5, 10.0, 8, "none")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(gr.paper_settings["*"]) <= fields


def test_state_round_trip_keeps_the_schedule_and_loading_never_rewinds_it() -> None:
    ref = reference("cub")
    method = make_method(ref)
    snapshot = {k: v.clone() for k, v in method.state_dict().items()}  # before epoch 1
    for epoch in (1, 2, 3):
        end_epoch(method, epoch)
    resumed = round_trip(method, ref)
    assert int(resumed.epoch) == 4 and resumed.schedule() == method.schedule() == tuple(ref["loop_schedule"][3])
    # LinearInit's restore_best loads the method state of an earlier epoch: the schedule stays where it is
    method.load_state_dict(snapshot)
    assert int(method.epoch) == 4 and method.schedule() == tuple(ref["loop_schedule"][3])


def test_a_linear_probe_keeps_the_initial_schedule() -> None:
    """T = n (--epochs 0 --linear-init N): the reference would divide by zero."""
    hp = make_hparams(METHODS["gr-loss"], {})
    assert gr_schedule(hp, 1, 3, 3) == gr_schedule(hp, 3, 3, 3) == (0.0, -2.0, 0.5, 2.0)


def test_linear_init_epochs_enter_the_schedule_of_a_run(squares_csv: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with 2 LinearInit and 2 end-to-end epochs: T = 4, n = 2. LinearInit keeps its first epoch as best,
    so restoring it at its end loads the method state of epoch 1, which must not rewind the schedule."""
    remember = FixedFeaturePhase.remember_if_best

    def first_only(self: FixedFeaturePhase, score: float) -> bool:
        return remember(self, score) if self.best_state is None else False

    monkeypatch.setattr(FixedFeaturePhase, "remember_if_best", first_only)
    cfg = TrainConfig(data=f"csv:{squares_csv}", arch="resnet18", weights="none", image_size=32, batch_size=16,
                      epochs=2, linear_init=2, workers=0,
                      progress=False, runs_dir=str(tmp_path), lgconv=False, name="gr", method="gr-loss")
    Trainer(cfg).fit()
    lines = [json.loads(line) for line in (tmp_path / "gr" / "metrics.jsonl").read_text().splitlines()]
    hp = make_hparams(METHODS["gr-loss"], {})
    assert [(x["gr_w"], x["gr_b"], x["gr_mu"], x["gr_sigma"]) for x in lines] == [
        pytest.approx(gr_schedule(hp, epoch, 4, 2)) for epoch in (1, 2, 3, 4)]
    assert [x["gr_mu"] for x in lines] == pytest.approx([0.5, 0.5, 0.65, 0.8])
    assert int(load_checkpoint(tmp_path / "gr" / "last.pt").training["method"]["epoch"]) == 5
