"""The training step as one module (train.epoch): what it holds, that it computes the method's step
unchanged in one process, and that under torchrun (two gloo processes, end to end with BatchNorm in training
mode and EMA) DistributedDataParallel runs it and every rank ends with rank 0's weights, statistics and EMA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from models import load_checkpoint
from models.network import build_model
from train.epoch import TrainingStep, method_step, run_training_step, wrap_training_step
from train.methods import MethodContext, get_method, make_hparams

REPO = Path(__file__).resolve().parent.parent
NUM_TRAIN, NUM_CLASSES = 8, 5


def build(method_name: str) -> tuple[nn.Module, TrainingStep]:
    """A resnet18 and ``method_name`` on a made-up training set of 8 images, 5 classes."""
    torch.manual_seed(0)
    model = build_model("resnet18", NUM_CLASSES, "none", lgconv=False)
    observed = torch.zeros(NUM_TRAIN, NUM_CLASSES)
    observed[torch.arange(NUM_TRAIN), torch.arange(NUM_TRAIN) % NUM_CLASSES] = 1.0
    ctx = MethodContext(num_classes=NUM_CLASSES, num_train=NUM_TRAIN, train_observed=observed,
                        expected_positives=1.5, epochs=1, feature_width=model.num_features)
    cls = get_method(method_name)
    method = cls(ctx, make_hparams(cls, {}))
    return model, TrainingStep(model, method)


def batch() -> dict[str, torch.Tensor]:
    """Four 32-px images with their observed labels and dataset indices."""
    generator = torch.Generator().manual_seed(1)
    observed = torch.zeros(4, NUM_CLASSES)
    observed[torch.arange(4), torch.tensor([0, 2, 4, 1])] = 1.0
    return {"images": torch.randn(4, 3, 32, 32, generator=generator), "observed": observed,
            "index": torch.tensor([0, 3, 5, 7])}


def test_step_holds_the_model_and_the_method_parameters_but_not_its_buffers() -> None:
    model, step = build("role")
    names = {n for n, _ in step.named_parameters()}
    assert any(p is step.method.estimator for p in step.parameters())
    assert len(names) == len(list(model.parameters())) + 1
    _, em_step = build("em-apl")
    buffers = {n for n, _ in em_step.named_buffers()}
    assert "model.backbone.bn1.running_mean" in buffers
    assert not any("pseudo" in n for n in buffers)  # EM-APL's N x C pseudo-labels are never broadcast
    assert "pseudo" in dict(em_step.method.named_buffers())


def test_one_process_step_is_the_methods_step_unwrapped() -> None:
    model, plain = build("role")
    step = wrap_training_step(model, plain.method, torch.device("cpu"))
    assert type(step) is TrainingStep
    torch.manual_seed(2)
    out = run_training_step(step, batch())
    out.loss.backward()
    grads = [p.grad.clone() for p in step.parameters()]
    step.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    reference = method_step(model, plain.method, batch())
    reference.loss.backward()
    assert torch.equal(out.loss, reference.loss) and out.logs.keys() == reference.logs.keys() == {"role_reg"}
    assert all(torch.equal(out.logs[k], reference.logs[k]) for k in out.logs)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, step.parameters(), strict=True))
    assert grads[-1].abs().sum() > 0  # the estimator rows of the batch's images got a gradient


class RecordingModel(nn.Module):
    """A linear model on flattened images that records the batch size of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * 32 * 32, NUM_CLASSES)
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return self.linear(x.flatten(1))


def test_the_step_runs_views_in_one_call_and_extra_inputs_in_their_own() -> None:
    """Extra views (``images_<name>``) share the model call of ``images`` (as LAC's reference forwards 2N images);
    a method's extra inputs (PU-MLC's mixup images) get a call each; the loss sees their logits."""
    _, step = build("an")
    model = RecordingModel()
    views = {**batch(), "images_strong": batch()["images"].flip(-1)}
    loss = method_step(model, step.method, views).loss
    assert model.calls == [8] and torch.isfinite(loss)
    torch.testing.assert_close(loss, method_step(model, step.method, batch()).loss)  # AN uses the weak view only
    _, pu_step = build("pu-mlc")
    model.calls.clear()
    out = method_step(model, pu_step.method, batch())
    assert model.calls == [4, 2] and float(out.logs["mixup_reg"]) > 0


@pytest.fixture(scope="module")
def ddp_run(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One end-to-end ROLE epoch with EMA on two gloo processes; each rank dumps its states before finishing."""
    root = tmp_path_factory.mktemp("ddp-step")
    args = ["--data", "builtin:tiny", "--arch", "resnet18", "--image-size", "32", "--no-lgconv", "--batch-size", "12",
            "--workers", "0", "--no-progress", "--epochs", "1", "--method", "role", "--ema", "0.9",
            "--runs-dir", str(root), "--name", "role-e2e"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "tests/ddp_rank_states.py", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "role-e2e"


def test_ranks_agree_after_end_to_end_ddp_training(ddp_run: Path) -> None:
    """Both ranks trained inside DDP and end the epoch with the same weights, BatchNorm statistics and EMA
    (rank 0's, which last.pt holds); the weights moved."""
    ranks = [torch.load(ddp_run / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["ddp"] and ranks[1]["ddp"]
    for part in ("model", "ema"):
        a, b = ranks[0][part], ranks[1][part]
        assert a.keys() == b.keys() and len(a) > 0
        assert all(torch.equal(a[k], b[k]) for k in a), part
    last = load_checkpoint(ddp_run / "last.pt")
    assert all(torch.equal(last.model[k], ranks[1]["model"][k]) for k in last.model)
    assert not any(k.startswith("module.") for k in last.model)
    start = build_model("resnet18", len(last.meta.classes), "none", lgconv=False).state_dict()
    assert not torch.equal(start["backbone.layer1.0.bn1.running_mean"],
                           last.model["backbone.layer1.0.bn1.running_mean"])
