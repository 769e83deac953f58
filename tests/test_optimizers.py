"""The trainer's optimisers: fused kernels where PyTorch has them, with the same steps as the per-tensor loop."""

from __future__ import annotations

import pytest
import torch

from train.epoch import OPTIMIZERS, build_optimizer, build_scheduler, fusable


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(7, 5, generator=g)), torch.nn.Parameter(torch.randn(5, generator=g))]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_steps_match_the_per_tensor_loop(name: str) -> None:
    fused_params, loop_params, start = _params(), _params(), _params()
    fused = build_optimizer(name, [{"params": fused_params}], lr=0.01, weight_decay=1e-3)
    assert all(group["fused"] for group in fused.param_groups)
    loop_kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]
    extra = {"momentum": 0.9, "nesterov": True} if name == "sgd" else {}
    loop = loop_kind(loop_params, lr=0.01, weight_decay=1e-3, foreach=False, **extra)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in fused_params]
        for params in (fused_params, loop_params):
            for p, grad in zip(params, grads, strict=True):
                p.grad = grad.clone()
        fused.step()
        loop.step()
    for a, b, before in zip(fused_params, loop_params, start, strict=True):
        assert not torch.equal(a, before)  # the steps moved it
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_only_floating_cpu_or_cuda_parameters_are_fused() -> None:
    assert fusable([{"params": _params()}])
    assert not fusable([{"params": []}])
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    assert not fusable([{"params": [*_params(), meta]}])
    assert build_optimizer("adam", [{"params": [meta]}], lr=0.1).param_groups[0]["fused"] is None


def test_a_checkpoint_of_an_unfused_optimiser_resumes_unfused() -> None:
    params = _params()
    old = torch.optim.Adam(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    old.step()
    new = build_optimizer("adam", [{"params": params}], lr=0.1)
    new.load_state_dict(old.state_dict())
    assert new.param_groups[0]["fused"] is None  # the same kernels as before the interruption
    new.step()


def test_unknown_optimizer_names_the_choices() -> None:
    with pytest.raises(ValueError, match="adam, adamw, sgd"):
        build_optimizer("lion", [{"params": _params()}], lr=0.1)


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 9, 10, 50])
def test_onecycle_warms_up_for_at_least_one_step_at_any_length(total: int) -> None:
    """5 steps in all (1 epoch of the tiny dataset at batch 32) once made OneCycleLR divide by zero."""
    optimizer = build_optimizer("adam", [{"params": _params()[:1]}, {"params": _params()[1:], "lr": 0.1}], lr=0.01)
    scheduler = build_scheduler("onecycle", optimizer, total)
    if total <= 2:
        assert scheduler is None and optimizer.param_groups[0]["lr"] == 0.01  # no room for a cycle: the peak lr
        return
    assert scheduler is not None
    lrs = []
    for _ in range(total):
        lrs.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    first, second = zip(*lrs, strict=True)
    for peak, lr in ((0.01, first), (0.1, second)):  # each group cycles up to its own peak and back down
        assert lr[0] == pytest.approx(peak / 25) and max(lr) == pytest.approx(peak) and lr[-1] < lr[0]
        assert lr.index(max(lr)) == max(1, round(0.2 * total) - 1)


def test_cosine_none_and_unknown_schedules() -> None:
    optimizer = build_optimizer("sgd", [{"params": _params()}], lr=0.1)
    assert build_scheduler("none", optimizer, 100) is None
    assert build_scheduler("onecycle", optimizer, 0) is None
    cosine = build_scheduler("cosine", optimizer, 4)
    assert isinstance(cosine, torch.optim.lr_scheduler.CosineAnnealingLR)
    for _ in range(4):
        optimizer.step()
        cosine.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="none, onecycle, cosine"):
        build_scheduler("step", optimizer, 10)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Linear(6, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class _Wrapped(torch.nn.Module):  # what DistributedDataParallel looks like from outside: the network in .module
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.module = net


def test_the_head_learns_at_its_multiple_of_the_learning_rate() -> None:
    from train.epoch import model_param_groups

    torch.manual_seed(0)
    net = _Net()
    assert [len(g["params"]) for g in model_param_groups(net, 1e-3)] == [4]  # one group by default
    groups = model_param_groups(_Wrapped(net), 1e-3, head_lr_mult=10.0)
    assert [{id(p) for p in g["params"]} for g in groups] == [{id(p) for p in net.backbone.parameters()},
                                                              {id(p) for p in net.head.parameters()}]
    assert "lr" not in groups[0] and groups[1]["lr"] == pytest.approx(1e-2)
    # one Adam step moves every weight by about its group's learning rate: the head 10x the backbone
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    optimizer = build_optimizer("adam", groups, lr=1e-3)
    net(torch.randn(8, 6)).square().mean().backward()
    optimizer.step()
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in net.named_parameters()}
    assert moved["backbone.weight"] == pytest.approx(1e-3, rel=1e-3)
    assert moved["head.weight"] == pytest.approx(1e-2, rel=1e-3)
    # a schedule peaks each group at its own rate
    schedule = build_scheduler("onecycle", build_optimizer("adam", model_param_groups(net, 1e-3, 10.0), lr=1e-3), 10)
    assert schedule is not None
    assert [g["max_lr"] for g in schedule.optimizer.param_groups] == pytest.approx([1e-3, 1e-2])
    # the backbone fixed (--trainable head): the head alone, at its rate
    for p in net.backbone.parameters():
        p.requires_grad_(False)
    groups = model_param_groups(net, 1e-3, head_lr_mult=10.0)
    assert len(groups) == 1 and groups[0]["lr"] == pytest.approx(1e-2)
