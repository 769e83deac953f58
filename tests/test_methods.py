"""Method losses: values computed independently (plain Python math), identities, gradient signs,
numerical safety, and the state methods keep."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from train.config import FINE_TUNE_DEFAULTS, METHOD_AUTO, TrainConfig, validate
from train.diagnostics import score_label_estimates
from train.epoch import method_step
from train.methods import METHODS, EpochEndContext, MethodContext, get_method, make_hparams
from train.methods.base import dataset_family
from train.options import build_parser, config_from_args

LOGITS = [[2.0, -1.0, 0.0, 0.5], [0.5, 3.0, -2.0, -0.3]]
OBSERVED = [[1, 0, 0, 0], [0, 1, 0, 0]]
NEGATIVES = [[0, 1, 0, 0], [1, 0, 1, 0]]  # observed negatives (the protocol's -1 entries), for iu
FULL = [[1, 0, 1, 0], [0, 1, 0, 1]]
EPS = 1e-5


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def nl(x: float) -> float:
    return -math.log(x + EPS)


def mean_matrix(fn: Callable[[float, int], float]) -> float:
    """Mean over all entries of fn(p, z)."""
    vals = [fn(sig(s), z) for row, zrow in zip(LOGITS, OBSERVED, strict=True) for s, z in zip(row, zrow, strict=True)]
    return sum(vals) / len(vals)


PSEUDO = [[0, 0, 1, 0], [1, 1, 0, 0]]  # CLIP's pseudo-positives (vlpl, aevlp); one on an observed positive


def ctx(num_train: int = 2, k: float = 2.0, epochs: int = 3) -> MethodContext:
    return MethodContext(num_classes=4, num_train=num_train, train_observed=torch.tensor(OBSERVED, dtype=torch.float),
                         expected_positives=k, epochs=epochs,
                         pseudo_positives=torch.tensor(PSEUDO, dtype=torch.bool).repeat(num_train // 2 + 1, 1)[
                             :num_train])


def batch(full: bool = False) -> dict[str, torch.Tensor]:
    """The observed labels (positives and negatives) and indices of LOGITS' two images; the full labels too for a
    method that trains on them (the only ones whose batches carry them)."""
    out = {"observed": torch.tensor(OBSERVED, dtype=torch.float),
           "observed_negatives": torch.tensor(NEGATIVES, dtype=torch.float), "index": torch.tensor([0, 1])}
    return {**out, "full": torch.tensor(FULL, dtype=torch.float)} if full else out


def ctx_with_negatives() -> MethodContext:
    """:func:`ctx` whose training set also observes the NEGATIVES (-1 entries)."""
    return dataclasses.replace(ctx(), train_observed=torch.tensor(OBSERVED) - torch.tensor(NEGATIVES).float())


def loss_of(name: str, logits: torch.Tensor | None = None, **hp: str) -> torch.Tensor:
    method = get_method(name)(ctx(), make_hparams(METHODS[name], hp))
    return method.loss(torch.tensor(LOGITS) if logits is None else logits,
                       batch(full=METHODS[name].trains_on_full_labels)).loss


def test_an_ls_value_follows_the_reference_code_targets() -> None:
    def entry(p: float, z: int) -> float:
        t = 0.9 if z else 0.1
        return t * nl(p) + (1 - t) * nl(1 - p)

    assert loss_of("an-ls").item() == pytest.approx(mean_matrix(entry), rel=1e-6)
    assert loss_of("an-ls", ls_coef="0").item() == pytest.approx(loss_of("an").item(), rel=1e-6)


def test_an_ls_asymmetric_smoothing_of_coles_appendix() -> None:
    def entry(p: float, z: int) -> float:  # AN-LS(0, 0.1): the observed positive keeps its hard target 1
        return nl(p) if z else 0.1 * nl(p) + 0.9 * nl(1 - p)

    assert loss_of("an-ls", ls_pos="0").item() == pytest.approx(mean_matrix(entry), rel=1e-6)
    assert loss_of("an-ls", ls_pos="0", ls_neg="0").item() == pytest.approx(loss_of("an").item(), rel=1e-6)
    assert loss_of("an-ls", ls_coef="0.3", ls_pos="0.1", ls_neg="0.1").item() == pytest.approx(
        loss_of("an-ls").item(), rel=1e-7)
    with pytest.raises(ValueError, match="ls_neg"):
        loss_of("an-ls", ls_neg="1")


def test_wan_value_and_identity_with_an() -> None:
    gamma = 1 / 3  # 1 / (C - 1) with C = 4
    assert loss_of("wan").item() == pytest.approx(mean_matrix(lambda p, z: nl(p) if z else gamma * nl(1 - p)), rel=1e-6)
    assert loss_of("wan", gamma="1").item() == pytest.approx(loss_of("an").item(), rel=1e-7)


def test_epr_value() -> None:
    positive = mean_matrix(lambda p, z: nl(p) if z else 0.0)
    k_hat = sum(sig(s) for row in LOGITS for s in row) / 2
    expected = positive + ((k_hat - 2.0) / 4) ** 2  # k = ctx's expected positives
    assert loss_of("epr").item() == pytest.approx(expected, rel=1e-6)
    assert loss_of("epr", k="1.5").item() == pytest.approx(positive + ((k_hat - 1.5) / 4) ** 2, rel=1e-6)


def role_reference(s: list[list[float]], phi: list[list[float]], s_target: list[list[float]],
                   phi_target: list[list[float]], k: float = 2.0) -> float:
    """Cole et al.'s ROLE loss in plain Python; the stop-gradient targets are separate arguments."""
    total, n = 0.0, 0
    for i in range(len(s)):
        for j in range(len(s[0])):
            p, q, z = sig(s[i][j]), sig(phi[i][j]), OBSERVED[i][j]
            qt, pt = sig(phi_target[i][j]), sig(s_target[i][j])
            l1 = (nl(p) if z else 0.0) + qt * nl(p) + (1 - qt) * nl(1 - p)
            l2 = (nl(q) if z else 0.0) + pt * nl(q) + (1 - pt) * nl(1 - q)
            total += 0.5 * (l1 + l2)
            n += 1
    c, rows = len(s[0]), len(s)
    k_p = sum(sig(v) for row in s for v in row) / rows
    k_q = sum(sig(v) for row in phi for v in row) / rows
    return total / n + 0.5 * (((k_p - k) / c) ** 2 + ((k_q - k) / c) ** 2)


def numeric_grad(f: Callable[[list[list[float]]], float], x: list[list[float]], h: float = 1e-5) -> list[list[float]]:
    grad = []
    for i in range(len(x)):
        row = []
        for j in range(len(x[0])):
            up = [r[:] for r in x]
            down = [r[:] for r in x]
            up[i][j] += h
            down[i][j] -= h
            row.append((f(up) - f(down)) / (2 * h))
        grad.append(row)
    return grad


def test_role_value_initialisation_and_gradient_routing() -> None:
    method = get_method("role")(ctx(), make_hparams(METHODS["role"], {}))
    est = method.estimator.detach()
    assert torch.allclose(est[torch.tensor(OBSERVED) > 0], torch.tensor(math.log(0.995 / 0.005)))
    unobs = est[torch.tensor(OBSERVED) == 0]
    assert (unobs.abs() <= math.log(0.6 / 0.4) + 1e-6).all() and unobs.std() > 0
    assert method.param_groups(1e-3)[0]["lr"] == pytest.approx(1e-2)  # 10x learning rate

    phi = [[1.0, -0.5, 0.2, 0.0], [-1.0, 2.0, 0.3, -0.2]]
    with torch.no_grad():
        method.estimator.copy_(torch.tensor(phi, dtype=torch.float64))
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)
    method = method.double()
    loss = method.loss(logits, batch()).loss
    assert loss.item() == pytest.approx(role_reference(LOGITS, phi, LOGITS, phi), rel=1e-9)
    loss.backward()
    # each side sees the other only through detached targets (and its own regulariser)
    grad_s = numeric_grad(lambda s: role_reference(s, phi, LOGITS, phi), LOGITS)
    grad_phi = numeric_grad(lambda q: role_reference(LOGITS, q, LOGITS, phi), phi)
    torch.testing.assert_close(logits.grad, torch.tensor(grad_s, dtype=torch.float64), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(method.estimator.grad, torch.tensor(grad_phi, dtype=torch.float64), rtol=1e-5,
                               atol=1e-8)


def test_role_logs_its_estimator_without_changing_it() -> None:
    method = get_method("role")(ctx(), make_hparams(METHODS["role"], {}))
    phi = [[5.0, -2.0, 1.0, -1.0], [-3.0, 5.0, 0.5, 2.0]]  # unobserved entries: -2, 1, -1 and -3, 0.5, 2
    with torch.no_grad():
        method.estimator.copy_(torch.tensor(phi))
    before = method.estimator.detach().clone()
    full = torch.tensor(FULL, dtype=torch.float)
    logs = method.on_epoch_end(EpochEndContext(epoch=1, predict_train=lambda augment: torch.zeros(2, 4)))
    assert torch.equal(method.estimator.detach(), before)
    unobserved = [-2.0, 1.0, -1.0, -3.0, 0.5, 2.0]
    assert logs["estimator_unobserved_abs_logit"] == pytest.approx(sum(map(abs, unobserved)) / 6, rel=1e-6)
    assert logs["estimator_unobserved_mean"] == pytest.approx(sum(map(sig, unobserved)) / 6, rel=1e-6)
    assert "estimator_recovery_mAP" not in logs  # the method never sees full labels: the trainer scores them
    # per class, hand-ranked against FULL: classes 0 and 1 rank their positive first (AP 1); class 2's positive
    # (image 0, logit 1.0) is above image 1's 0.5 (AP 1); class 3's positive (image 1, 2.0) above -1.0 (AP 1)
    scored = score_label_estimates(method.label_estimates(), full)
    assert scored == {"estimator_recovery_mAP": pytest.approx(100.0)}
    flipped = full.flip(0)  # every class's positive now sits on the lower-ranked image: AP 1/2 each
    assert score_label_estimates(method.label_estimates(), flipped)["estimator_recovery_mAP"] == pytest.approx(50.0)


def test_em_unobserved_term_is_minimal_at_one_half_and_pushes_towards_it() -> None:
    grid = torch.linspace(-6, 6, 121)
    method = get_method("em")(ctx(), make_hparams(METHODS["em"], {}))
    values = []
    for s in grid:
        logits = torch.tensor([[5.0, s.item(), 0.0, 0.0], [0.0, 5.0, 0.0, 0.0]])
        values.append(method.loss(logits, batch()).loss.item())
    assert abs(grid[int(torch.tensor(values).argmin())].item()) < 1e-6  # p = 0.5
    logits = torch.tensor([[5.0, 2.0, -2.0, 0.0], [0.0, 5.0, 0.0, 0.0]], requires_grad=True)
    method.loss(logits, batch()).loss.backward()
    assert logits.grad[0, 1] > 0 and logits.grad[0, 2] < 0  # descent moves both towards 0
    assert logits.grad[0, 0] < 0  # the observed positive is pushed up
    # value: -log p at positives, -alpha * H(p) elsewhere
    def entry(p: float, z: int) -> float:
        return nl(p) if z else -0.1 * (p * nl(p) + (1 - p) * nl(1 - p))

    assert loss_of("em").item() == pytest.approx(mean_matrix(entry), rel=1e-6)


def test_em_apl_pseudo_labels_lowest_unobserved_accumulate_and_enter_the_loss() -> None:
    observed = torch.tensor([[1, 0], [0, 1], [0, 0], [0, 0], [0, 0]], dtype=torch.float)
    c = MethodContext(num_classes=2, num_train=5, train_observed=observed, expected_positives=1.0, epochs=3)
    method = get_method("em-apl")(c, make_hparams(METHODS["em-apl"], {"theta": "0.5", "warmup_epochs": "1"}))
    probs = torch.tensor([[0.9, 0.05], [0.3, 0.8], [0.2, 0.6], [0.4, 0.1], [0.01, 0.7]])
    full = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0], [0, 0]], dtype=torch.float)  # (2, 0): hidden positive
    seen_augment = []

    def predict(augment: bool) -> torch.Tensor:
        seen_augment.append(augment)
        return probs

    # U = [4, 4] unobserved, theta 0.5 over T - Tw = 2 rounds -> int(0.5 * 4 / 2) = 1 per class per round
    assert score_label_estimates(method.label_estimates(), full) == {}  # no pseudo-label yet: nothing to score
    logs = method.on_epoch_end(EpochEndContext(1, predict))
    assert seen_augment == [True]  # the reference code predicts with the training transform
    assert method.pseudo[4, 0].item() == pytest.approx(0.01) and method.pseudo[0, 1].item() == pytest.approx(0.05)
    assert logs["apl_added"] == 2 and "apl_negative_precision" not in logs
    assert score_label_estimates(method.label_estimates(), full) == {"apl_negative_precision": 1.0}
    method.on_epoch_end(EpochEndContext(2, predict))  # next lowest, previous ones excluded
    assert method.pseudo[2, 0].item() == pytest.approx(0.2) and method.pseudo[3, 1].item() == pytest.approx(0.1)
    assert int((method.pseudo >= 0).sum()) == 4 and "pseudo" in method.state_dict()
    # (2, 0) is a true positive taken as a negative: 3 of the 4 pseudo-negatives are right
    assert score_label_estimates(method.label_estimates(), full)["apl_negative_precision"] == pytest.approx(0.75)

    logits = torch.tensor([[1.0, -1.0], [0.0, 2.0], [-0.5, 0.5], [0.2, 0.3], [-1.0, 0.4]])
    b = {"observed": observed, "index": torch.arange(5)}
    soft = method.pseudo.tolist()
    total = 0.0
    for i in range(5):
        for j in range(2):
            p = sig(logits[i, j].item())
            if observed[i, j] > 0:
                total += nl(p)
            elif soft[i][j] >= 0:
                total += 0.9 * (soft[i][j] * nl(p) + (1 - soft[i][j]) * nl(1 - p))
            else:
                total += -0.1 * (p * nl(p) + (1 - p) * nl(1 - p))
    assert method.loss(logits, b).loss.item() == pytest.approx(total / 10, rel=1e-6)


def test_em_apl_does_nothing_during_warm_up() -> None:
    method = get_method("em-apl")(ctx(epochs=10), make_hparams(METHODS["em-apl"], {"warmup_epochs": "5"}))
    method.on_epoch_end(EpochEndContext(4, lambda _aug: torch.rand(2, 4)))
    assert (method.pseudo < 0).all()


@pytest.mark.parametrize(("epochs", "warmup"), [(1, 1), (2, 1), (3, 1), (4, 2), (9, 4), (10, 5), (15, 5), (80, 5)])
def test_em_apl_default_warm_up_is_half_the_run_between_1_and_the_papers_5(epochs: int, warmup: int) -> None:
    method = get_method("em-apl")(ctx(epochs=epochs), make_hparams(METHODS["em-apl"], {}))
    assert method.warmup_epochs() == warmup
    method.on_epoch_end(EpochEndContext(warmup - 1, lambda _aug: torch.rand(2, 4)))  # still warming up
    assert (method.pseudo < 0).all()
    explicit = get_method("em-apl")(ctx(epochs=epochs), make_hparams(METHODS["em-apl"], {"warmup_epochs": "2"}))
    assert explicit.warmup_epochs() == 2  # --hp wins
    preset = get_method("em-apl")(ctx(epochs=epochs), make_hparams(METHODS["em-apl"], {}, "coco2014"))
    assert preset.warmup_epochs() == 5  # the paper's T_w, whatever the run's length


@pytest.mark.parametrize("name", sorted(n for n, m in METHODS.items() if m.required_head is None))
@pytest.mark.parametrize("autocast", [False, True])
def test_extreme_logits_give_finite_loss_and_gradients(name: str, autocast: bool) -> None:
    """(Methods that need a special head, i.e. lac, have their own version in test_lac.py.)"""
    method = get_method(name)(ctx_with_negatives() if METHODS[name].uses_observed_negatives else ctx(),
                              make_hparams(METHODS[name], {}))
    logits = torch.tensor([[50.0, -50.0, 50.0, -50.0], [-50.0, 50.0, -50.0, 50.0]], requires_grad=True)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = method_step(lambda _x: logits.to(torch.bfloat16), method,
                              {**batch(METHODS[name].trains_on_full_labels), "images": torch.zeros(2)})
    else:
        out = method.loss(logits, batch(METHODS[name].trains_on_full_labels))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logits.grad).all()


def test_presets_follow_the_dataset_family() -> None:
    assert dataset_family("voc2012") == "voc" and dataset_family("coco2014") == "coco"
    assert dataset_family("builtin-default") == "builtin" and dataset_family("mydata") == "mydata"
    assert make_hparams(METHODS["em-apl"], {}, "voc2007").beta == pytest.approx(0.02)
    assert make_hparams(METHODS["em-apl"], {"beta": "0.5"}, "voc2007").beta == pytest.approx(0.5)  # flag wins
    assert make_hparams(METHODS["epr"], {}, "coco2014").k == pytest.approx(2.9)
    assert make_hparams(METHODS["wan"], {"gamma": "none"}).gamma is None
    with pytest.raises(ValueError, match="--hp warmup_epochs=x"):
        make_hparams(METHODS["em-apl"], {"warmup_epochs": "x"})


def paper_config(tmp_path: Path, *argv: str) -> TrainConfig:
    """The config ``python -m train --preset paper ARGV`` resolves to."""
    return config_from_args(build_parser().parse_args(["--preset", "paper", "--runs-dir", str(tmp_path), *argv]))


def test_paper_preset_adds_each_methods_published_settings_per_dataset(tmp_path: Path) -> None:
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        (voc / sub).mkdir(parents=True)
    cub = tmp_path / "cub_200"
    cub.mkdir()
    (cub / "labels.csv").write_text("image,labels\n")
    em_voc = paper_config(tmp_path, "--method", "em", "--data", f"voc:{tmp_path / 'VOCdevkit'}")
    assert (em_voc.batch_size, em_voc.lr, em_voc.epochs, em_voc.scheduler) == (8, 1e-5, 10, "none")
    em_coco = paper_config(tmp_path, "--method", "em-apl", "--data", "coco:/nowhere")
    assert (em_coco.batch_size, em_coco.lr) == (16, 1e-5)
    em_cub = paper_config(tmp_path, "--method", "em", "--data", str(cub))  # a bare path, family from its name
    assert (em_cub.batch_size, em_cub.lr) == (8, 1e-4)
    em_bare_voc = paper_config(tmp_path, "--method", "em", "--data", str(tmp_path / "VOCdevkit"))
    assert em_bare_voc.batch_size == 8
    lac = paper_config(tmp_path, "--method", "lac", "--data", "csv:/anything/else.csv")  # "*": every dataset
    assert (lac.optimizer, lac.weight_decay, lac.lr, lac.ema, lac.batch_size, lac.epochs) == (
        "adamw", 1e-2, 1e-4, 0.9997, 32, 40)
    pu = paper_config(tmp_path, "--method", "pu-mlc", "--data", "coco:/nowhere")
    assert (pu.batch_size, pu.lr, pu.ema, pu.epochs, pu.weight_decay, pu.trainable) == (
        70, 1e-4, 0.9997, 40, 1e-4, "layer4")
    assert paper_config(tmp_path, "--method", "pu-mlc", "--data", "voc:/x").batch_size == 90
    assert paper_config(tmp_path, "--method", "pu-mlc", "--data", "builtin").batch_size == 8  # no family entry
    flags_win = paper_config(tmp_path, "--method", "em", "--data", "voc:/x", "--lr", "3e-4", "--batch-size", "4")
    assert (flags_win.batch_size, flags_win.lr) == (4, 3e-4)
    an = paper_config(tmp_path, "--method", "an", "--data", "voc:/x")  # Cole et al. publish only a grid
    assert (an.batch_size, an.lr) == (8, 1e-5)
    without_preset = config_from_args(build_parser().parse_args(["--method", "em", "--data", "voc:/x"]))
    # published settings only come with --preset paper; without it, pretrained weights get the fine-tune default
    assert without_preset.lr == FINE_TUNE_DEFAULTS["lr"]


def test_paper_settings_name_real_config_fields() -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for cls in METHODS.values():
        for family, settings in cls.paper_settings.items():
            assert set(settings) <= fields, (cls.name, family)
            validate(dataclasses.replace(TrainConfig(), **settings))


def zlpr(s: list[float], pos: list[int]) -> float:
    """Su et al.'s ZLPR loss for one sample, plain Python."""
    return math.log(1 + sum(math.exp(-v) for v, y in zip(s, pos, strict=True) if y)) + math.log(
        1 + sum(math.exp(v) for v, y in zip(s, pos, strict=True) if not y))


def test_opml_with_a_b_one_is_zlpr_and_constants_enter_the_log() -> None:
    expected = sum(zlpr(row, z) for row, z in zip(LOGITS, OBSERVED, strict=True)) / 2
    assert loss_of("opml").item() == pytest.approx(expected, rel=1e-6)
    assert loss_of("opml", alpha="0.5", beta="0.5").item() == pytest.approx(expected, rel=1e-6)  # bounded form
    a, b = 2.0, 0.5
    manual = sum(
        math.log(a + sum(math.exp(-v) for v, y in zip(row, z, strict=True) if y))
        + math.log(b + sum(math.exp(v) for v, y in zip(row, z, strict=True) if not y))
        for row, z in zip(LOGITS, OBSERVED, strict=True)
    ) / 2
    assert loss_of("opml", a="2", b="0.5").item() == pytest.approx(manual, rel=1e-6)
    with pytest.raises(ValueError, match="alpha must be in"):
        loss_of("opml", alpha="1.5")
    # with full labels it is the unified multi-positive loss
    method = get_method("opml")(ctx(), make_hparams(METHODS["opml"], {}))
    full = {**batch(), "observed": torch.tensor(FULL, dtype=torch.float)}
    full_expected = sum(zlpr(row, z) for row, z in zip(LOGITS, FULL, strict=True)) / 2
    assert method.loss(torch.tensor(LOGITS), full).loss.item() == pytest.approx(full_expected, rel=1e-6)


@pytest.mark.parametrize("b", ["1", "2.5"])
def test_opml_gradients_positive_equals_bce_and_negatives_are_smaller(b: str) -> None:
    logits = torch.tensor(LOGITS, requires_grad=True)
    loss_of("opml", logits, a="1", b=b).backward()
    grad = logits.grad * 2  # undo the batch mean
    for i, row in enumerate(OBSERVED):
        for j, z in enumerate(row):
            s = LOGITS[i][j]
            if z:  # the positive logit: exactly BCE's gradient -(1 - sigmoid(s))
                assert grad[i, j].item() == pytest.approx(-(1 - sig(s)), rel=1e-5)
            elif b == "1":  # each negative: e^s / (1 + sum e^s) <= sigmoid(s) = BCE's gradient
                assert 0 < grad[i, j].item() <= sig(s) + 1e-7


def test_opml_sp_soft_weights_and_high_rank_value() -> None:
    import numpy as np

    method = get_method("opml-sp")(ctx(), make_hparams(METHODS["opml-sp"], {"high_rank": "0.1"}))
    method.class_ap.copy_(torch.tensor([0.8, 0.5, 0.25, 1.0]))
    total = 0.0
    for row, z in zip(LOGITS, OBSERVED, strict=True):
        pos = sum(math.exp(-s) * (1.0 if y else [0.8, 0.5, 0.25, 1.0][j] * sig(s))
                  for j, (s, y) in enumerate(zip(row, z, strict=True)))
        neg = sum(math.exp(s) * (1 - [0.8, 0.5, 0.25, 1.0][j] * sig(s))
                  for j, (s, y) in enumerate(zip(row, z, strict=True)) if not y)
        total += math.log(1 + pos) + math.log(1 + neg)
    sigma = np.linalg.svd(1 / (1 + np.exp(-np.array(LOGITS))), compute_uv=False)
    reg = -(0.1 / 2) * np.log(sigma + 1e-6).sum()
    out = method.loss(torch.tensor(LOGITS), batch())
    assert out.loss.item() == pytest.approx(total / 2 + reg, rel=1e-5)
    assert out.logs["high_rank"] == pytest.approx(reg, rel=1e-5)


def test_opml_sp_label_correction_flips_top_unlabelled_entries_and_accumulates() -> None:
    observed = torch.tensor([[1, 0]] * 10 + [[0, 1]] * 10, dtype=torch.float)
    c = MethodContext(num_classes=2, num_train=20, train_observed=observed, expected_positives=1.0, epochs=3)
    method = get_method("opml-sp")(c, make_hparams(METHODS["opml-sp"], {"correction_ratio": "0.5"}))
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(20, 2, generator=gen)
    probs[:10, 0] += 1.0  # class 0: its observed positives score highest -> AP 1 -> nothing to correct
    probs[10:, 1] = torch.linspace(0.0, 0.3, 10)  # class 1: observed positives score low -> AP < 1
    probs[:3, 1] = torch.tensor([0.99, 0.98, 0.97])
    full = observed.clone()
    full[:2, 1] = 1.0
    logs = method.on_epoch_end(EpochEndContext(1, lambda _aug: probs))
    ap1 = float(method.class_ap[1])
    assert float(method.class_ap[0]) == pytest.approx(1.0) and ap1 < 0.5
    n1 = math.floor(0.5 * (1 - ap1) * 10)
    assert n1 >= 3
    flipped = torch.nonzero(method.corrected[:, 1]).flatten().tolist()
    expected_rows = torch.argsort(torch.where(observed[:, 1] > 0, -1.0, probs[:, 1]), descending=True)[:n1]
    assert sorted(flipped) == sorted(expected_rows.tolist()) and {0, 1, 2} <= set(flipped)
    assert method.corrected[:, 0].sum() == 0
    assert logs["corrections_added"] == n1 and "correction_precision" not in logs
    assert score_label_estimates(method.label_estimates(), full) == {"correction_precision": pytest.approx(2 / n1)}
    before = method.corrected.clone()
    method.on_epoch_end(EpochEndContext(2, lambda _aug: probs))
    assert (method.corrected >= before).all()  # corrections accumulate, never revert
    b = {"observed": observed[:3], "index": torch.tensor([0, 1, 2])}
    assert (method.labels(b)[:, 1] == 1).all()


def pu_reference(logits: list[list[float]], observed: list[list[int]], gamma: float, alpha: float | None) -> float:
    """PU-MLC's variational loss in plain Python (population std temperature, sum over classes)."""
    n, c = len(logits), len(logits[0])
    total = 0.0
    for j in range(c):
        col = [logits[i][j] for i in range(n)]
        if alpha is not None:
            mean = sum(col) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in col) / n)
            tau = min(alpha * std, 1.0) if std > 1e-6 else 1.0
            col = [v / tau for v in col]
        probs = [sig(v) for v in col]
        mean_p = sum(probs) / n
        positives = [math.log(probs[i] + 1e-10) for i in range(n) if observed[i][j]]
        total += mean_p**gamma * math.log(mean_p + 1e-10)
        if positives:
            total -= sum(positives) / len(positives)
    return total


def test_pu_mlc_variational_loss_values() -> None:
    # gamma = 0 and no temperature: the plain variational loss log mean p - mean_P log p, summed over classes
    plain = pu_reference(LOGITS, OBSERVED, 0.0, None)
    assert loss_of("pu-mlc", gamma="0", alpha="none").item() == pytest.approx(plain, rel=1e-6)
    assert loss_of("pu-mlc").item() == pytest.approx(pu_reference(LOGITS, OBSERVED, 0.55, 1.0), rel=1e-5)
    assert loss_of("pu-mlc", gamma="0.85", alpha="2").item() == pytest.approx(
        pu_reference(LOGITS, OBSERVED, 0.85, 2.0), rel=1e-5)


def test_pu_mlc_guards_zero_std_and_keeps_u_term_for_classes_without_positives() -> None:
    same = torch.tensor([[1.5, 1.5, 1.5, 1.5], [1.5, 1.5, 1.5, 1.5]])  # std 0 in every class
    out = loss_of("pu-mlc", same)
    assert torch.isfinite(out)
    assert out.item() == pytest.approx(pu_reference(same.tolist(), OBSERVED, 0.55, 1.0), rel=1e-5)
    one = get_method("pu-mlc")(ctx(num_train=1), make_hparams(METHODS["pu-mlc"], {}))
    single = {"observed": torch.tensor([[1.0, 0, 0, 0]]), "index": torch.tensor([0]),
              "images": torch.randn(1, 3, 8, 8)}
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4))
    assert torch.isfinite(method_step(model, one, single).loss)  # a batch of one: mixup with itself


def test_pu_mlc_mixup_regulariser_value_and_training_step() -> None:
    phi = [[1.0, 0.3], [0.6, 0.2]]
    s = [[0.5, -1.0], [2.0, 0.1]]
    expected = sum(
        sum((math.log(phi[i][j] + 1e-10) - math.log(sig(s[i][j]) + 1e-10)) ** 2 for i in range(2)) / 2
        for j in range(2)
    )
    from train.methods.pu_mlc import mixup_regulariser

    assert mixup_regulariser(torch.tensor(phi), torch.tensor(s)).item() == pytest.approx(expected, rel=1e-6)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4))
    b = {**batch(), "images": torch.randn(2, 3, 2, 2)}
    b["observed"] = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    with_reg = get_method("pu-mlc")(ctx(), make_hparams(METHODS["pu-mlc"], {}))
    without = get_method("pu-mlc")(ctx(), make_hparams(METHODS["pu-mlc"], {"mixup_weight": "0"}))
    base = method_step(model, without, b).loss
    out = method_step(model, with_reg, b)
    regulariser = float(out.logs["mixup_reg"])
    assert out.loss.item() == pytest.approx(base.item() + regulariser, rel=1e-5) and regulariser > 0
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_iu_uses_the_observed_positives_and_negatives_only_and_other_methods_add_their_term() -> None:
    """The reference's loss_iu. Every other non-oracle method trains with known negatives through the term its
    :meth:`training_loss` adds: -log(1 - p) at each, over the N*C entries; the oracles train on the full labels."""
    total = 0.0
    for row, z, n in zip(LOGITS, OBSERVED, NEGATIVES, strict=True):
        for s, zz, nn in zip(row, z, n, strict=True):
            total += nl(sig(s)) if zz else (nl(1 - sig(s)) if nn else 0.0)
    method = get_method("iu")(ctx_with_negatives(), make_hparams(METHODS["iu"], {}))
    logits = torch.tensor(LOGITS, requires_grad=True)
    loss = method.loss(logits, batch()).loss
    assert loss.item() == pytest.approx(total / 8, rel=1e-6)
    loss.backward()
    assert logits.grad[0, 2] == 0 and logits.grad[1, 3] == 0 and logits.grad[0, 1] > 0  # unobserved: no gradient
    with pytest.raises(ValueError, match="have none"):
        get_method("iu")(ctx(), make_hparams(METHODS["iu"], {}))
    assert method.training_loss(logits, batch()).loss.item() == pytest.approx(total / 8, rel=1e-6)
    added = sum(nl(1 - sig(s)) for row, n in zip(LOGITS, NEGATIVES, strict=True)
                for s, nn in zip(row, n, strict=True) if nn) / 8
    an = get_method("an")(ctx_with_negatives(), make_hparams(METHODS["an"], {}))
    out = an.training_loss(torch.tensor(LOGITS), batch())
    assert out.loss.item() == pytest.approx(an.loss(torch.tensor(LOGITS), batch()).loss.item() + added, rel=1e-6)
    assert float(out.logs["known_negatives_loss"]) == pytest.approx(added, rel=1e-6)
    uses = {name: METHODS[name].known_negatives_use() for name in METHODS}
    assert uses["iu"] == "own loss" and uses["bce"] == uses["iun"] == "full labels"
    assert {uses[name] for name in set(METHODS) - {"iu", "bce", "iun"}} == {"added term"}
    for name in ("bce", "iun"):  # they train on the annotated labels, of which the observed ones are a part
        oracle = get_method(name)(ctx_with_negatives(), make_hparams(METHODS[name], {}))
        assert "known_negatives_loss" not in oracle.training_loss(torch.tensor(LOGITS), batch(full=True)).logs


def test_iun_uses_the_observed_positive_and_true_negatives_only() -> None:
    total = 0.0
    for row, z, y in zip(LOGITS, OBSERVED, FULL, strict=True):
        for s, zz, yy in zip(row, z, y, strict=True):
            total += nl(sig(s)) if zz else (nl(1 - sig(s)) if not yy else 0.0)
    assert loss_of("iun").item() == pytest.approx(total / 8, rel=1e-6)
    logits = torch.tensor(LOGITS, requires_grad=True)
    loss_of("iun", logits).backward()
    assert logits.grad[0, 2] == 0 and logits.grad[1, 3] == 0  # unobserved true positives are ignored


def test_method_lists_come_from_the_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's and docs/methods.md's tables are the registry's (regenerated by ``python -m train.methods --write``),
    the CLI's choices are its names, and no product module outside train/methods/ spells a method name."""
    import ast

    from train.methods import method_names, methods_table
    from train.methods.__main__ import BEGIN, END
    from train.methods.__main__ import main as methods_main

    def table_block(text: str) -> str | None:
        """The text between the methods-table markers of ``text`` (None when it has none)."""
        i, j = text.find(BEGIN), text.find(END)
        return text[i + len(BEGIN):j].strip("\n") + "\n" if 0 <= i < j else None

    root = Path(__file__).resolve().parent.parent
    for page in ("README.md", "docs/methods.md"):
        assert table_block((root / page).read_text()) == methods_table(), f"run python -m train.methods --write {page}"
    choices = next(a.choices for a in build_parser()._actions if a.dest == "method")
    assert list(choices) == [METHOD_AUTO, *method_names()] and sorted(method_names()) == sorted(METHODS)
    assert method_names()[:2] == ["bce", "iun"]  # the reference bounds first

    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- methods-table -->\nold rows\n<!-- /methods-table -->\nend\n")
    assert methods_main(["--write", str(page)]) == 0
    assert table_block(page.read_text()) == methods_table() and page.read_text().startswith("intro\n")
    assert page.read_text().endswith("<!-- /methods-table -->\nend\n")
    (tmp_path / "bare.md").write_text("no markers\n")
    assert methods_main(["--write", str(tmp_path / "bare.md")]) == 2 and "no <!-- methods-table -->" in \
        capsys.readouterr().err

    spelled = []
    for package in ("models", "train", "serve", "export", "bench"):
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).parts[:2] == ("train", "methods"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in METHODS:
                    spelled.append(f"{path.relative_to(root)}:{node.lineno} {node.value!r}")
    assert not spelled
