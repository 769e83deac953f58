"""Large Loss (LL-R, LL-Ct, LL-Cp) against values the authors' own code computed on the same inputs
(tests/data/large_loss, see tests/data/README.md), its schedule, its state and its settings."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from train.methods import METHODS, EpochEndContext, MethodContext, make_hparams
from train.methods.large_loss import LargeLoss, large_loss_entries
from train.options import build_parser, config_from_args

DATA = Path(__file__).resolve().parent / "data" / "large_loss"
SCHEMES = {"LL-R": "ll-r", "LL-Ct": "ll-ct", "LL-Cp": "ll-cp"}


def make_method(name: str, observed: np.ndarray, **hp: str) -> LargeLoss:
    """A Large Loss method on a training set whose observed labels are ``observed``."""
    labels = torch.from_numpy(observed)
    ctx = MethodContext(num_classes=labels.shape[1], num_train=labels.shape[0], train_observed=labels,
                        expected_positives=1.0, epochs=10)
    method = METHODS[name](ctx, make_hparams(METHODS[name], hp))
    assert isinstance(method, LargeLoss)
    return method


def end_epochs(method: LargeLoss, first: int, count: int) -> None:
    """Run ``count`` epoch ends (epochs ``first``, ``first + 1``, ...); no method here predicts anything."""
    for epoch in range(first, first + count):
        method.on_epoch_end(EpochEndContext(epoch=epoch, predict_train=lambda _augment: torch.zeros(0)))


@pytest.mark.parametrize("case", ["random", "ties"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_loss_gradient_and_corrections_equal_the_reference(case: str, scheme: str) -> None:
    """Every delta_rel and epoch of the stored schedule: the loss, its gradient and the modified entries."""
    ref = np.load(DATA / f"{case}.npz")
    observed = ref["observed"]
    rows = torch.arange(observed.shape[0])
    batch = {"observed": torch.from_numpy(observed), "index": rows}
    checked_ties = False
    for delta in ref["deltas"]:
        for epoch in range(1, int(ref["epochs"]) + 1):
            key = f"{scheme}_{delta:g}_{epoch}"
            method = make_method(SCHEMES[scheme], observed, delta_rel=f"{delta:g}")
            end_epochs(method, 1, epoch - 1)
            logits = torch.from_numpy(ref["logits"]).requires_grad_()
            loss = method.loss(logits, batch).loss
            loss.backward()
            assert loss.item() == pytest.approx(float(ref[f"{key}_loss"]), rel=1e-6, abs=1e-7), key
            np.testing.assert_allclose(logits.grad.numpy(), ref[f"{key}_grad"], rtol=1e-5, atol=1e-9, err_msg=key)
            bce = torch.nn.functional.binary_cross_entropy_with_logits(logits.detach(), batch["observed"],
                                                                       reduction="none")
            share = method.modified_share()
            chosen = large_loss_entries(bce, batch["observed"] < 0.5, share) if share else torch.zeros_like(bce) > 0
            np.testing.assert_array_equal(chosen.numpy(), ref[f"{key}_marked"], err_msg=key)
            if scheme == "LL-Cp":  # the permanent corrections are the same entries
                np.testing.assert_array_equal(method.corrected.bool().numpy(), ref[f"{key}_marked"], err_msg=key)
            checked_ties |= int(ref[f"{key}_marked"].sum()) > int(ref[f"{key}_marked_strict"].sum()) + 1
    assert checked_ties == (case == "ties")  # the tie fixture really has ties at the threshold


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_schedule_and_state_replay_the_reference_training_loop(scheme: str) -> None:
    """Shuffled batches over four epochs, the rate decremented at each epoch end, LL-Cp's corrections kept
    between epochs; the method state goes through a checkpoint (weights_only) after epoch 2."""
    ref = np.load(DATA / "schedule.npz")
    observed, orders, logits, size = ref["observed"], ref["orders"], ref["logits"], int(ref["batch"])
    method = make_method(SCHEMES[scheme], observed, delta_rel=f"{float(ref['delta_rel']):g}")
    losses = np.zeros(ref[f"{scheme}_losses"].shape)
    for epoch in range(orders.shape[0]):
        for step in range(logits.shape[1]):
            index = torch.from_numpy(orders[epoch, step * size:(step + 1) * size])
            batch = {"observed": torch.from_numpy(observed)[index], "index": index}
            losses[epoch, step] = method.loss(torch.from_numpy(logits[epoch, step]), batch).loss.item()
        end_epochs(method, epoch + 1, 1)
        if epoch == 1:  # resume from a checkpoint of the method state
            buffer = io.BytesIO()
            torch.save(method.state_dict(), buffer)
            buffer.seek(0)
            method = make_method(SCHEMES[scheme], observed, delta_rel=f"{float(ref['delta_rel']):g}")
            method.load_state_dict(torch.load(buffer, weights_only=True))
    np.testing.assert_allclose(losses, ref[f"{scheme}_losses"], rtol=1e-6)
    assert losses[0].tolist() != losses[1].tolist()  # the schedule changes the loss from the second epoch
    if scheme == "LL-Cp":
        labels = np.maximum(observed, method.corrected.numpy())
        np.testing.assert_array_equal(labels, ref["LL-Cp_labels"])
    assert float(method.clean_rate) == pytest.approx(1 - 4 * 0.04)


def test_first_epoch_is_assume_negative_and_observed_positives_are_never_modified() -> None:
    observed = np.eye(3, 4, dtype=np.float32)
    logits = torch.tensor([[-3.0, 2.0, -1.0, 0.5], [1.0, -2.0, 4.0, -0.5], [0.2, 0.3, -4.0, 1.5]])
    batch = {"observed": torch.from_numpy(observed), "index": torch.arange(3)}
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["observed"], reduction="none")
    for name in SCHEMES.values():
        assert make_method(name, observed).loss(logits, batch).loss.item() == pytest.approx(bce.mean().item())
    # delta_rel 100: after one epoch every entry is asked for; the reference would then zero the observed
    # positives' loss too (threshold 0), here they keep it
    reject_all = make_method("ll-r", observed, delta_rel="100")
    end_epochs(reject_all, 1, 1)
    kept = bce[batch["observed"] > 0.5].sum() / bce.numel()
    assert reject_all.loss(logits, batch).loss.item() == pytest.approx(kept.item())


def test_ll_cp_marks_only_unobserved_entries_and_logs_its_state() -> None:
    observed = np.eye(4, 5, dtype=np.float32)
    method = make_method("ll-cp", observed, delta_rel="20")
    end_epochs(method, 1, 1)
    logits = torch.full((4, 5), 3.0)  # every unobserved loss equal: every one ties at the threshold
    method.loss(logits, {"observed": torch.from_numpy(observed), "index": torch.arange(4)})
    assert method.corrected.sum().item() == 16 and not method.corrected.bool()[torch.from_numpy(observed) > 0].any()
    logs = method.on_epoch_end(EpochEndContext(epoch=2, predict_train=lambda _augment: torch.zeros(0)))
    assert logs == {"ll_clean_rate": pytest.approx(0.6), "llcp_corrected": 16.0}


def test_presets_defaults_and_paper_settings(tmp_path: Path) -> None:
    assert [make_hparams(METHODS[n], {}).delta_rel for n in ("ll-r", "ll-ct", "ll-cp")] == [0.5, 0.2, 0.1]
    assert [make_hparams(METHODS[n], {}, "coco2014").delta_rel for n in ("ll-r", "ll-ct", "ll-cp")] == [0.4, 0.2, 0.2]
    assert [make_hparams(METHODS[n], {}, "cub").delta_rel for n in ("ll-r", "ll-ct", "ll-cp")] == [0.4, 0.4, 0.2]
    assert make_hparams(METHODS["ll-r"], {"delta_rel": "0.3"}, "voc2012").delta_rel == 0.3  # the flag wins
    with pytest.raises(ValueError, match="delta_rel"):
        make_hparams(METHODS["ll-ct"], {"delta_rel": "-1"})

    def paper(*argv: str) -> tuple[object, ...]:
        cfg = config_from_args(build_parser().parse_args(["--preset", "paper", "--runs-dir", str(tmp_path), *argv]))
        return cfg.optimizer, cfg.lr, cfg.batch_size, cfg.epochs, cfg.head_lr_mult

    assert paper("--method", "ll-r", "--data", "voc:/x") == ("sgd", 5e-3, 16, 10, 10.0)
    assert paper("--method", "ll-cp", "--data", "coco:/x") == ("adam", 1e-5, 16, 10, 10.0)
    assert paper("--method", "ll-ct", "--data", "cub:/x") == ("adam", 7.5e-5, 16, 10, 10.0)
    assert paper("--method", "ll-r", "--data", "voc:/x", "--head-lr-mult", "1")[-1] == 1.0  # the flag wins
