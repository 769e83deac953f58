"""Multi-process training (torchrun, gloo on CPU): two-process runs against one process with the same global
batch. Exactness is checked on LinearInit epochs (fixed features, no augmentation, no BatchNorm in training
mode), where one step of two processes must equal one step of one process; end-to-end runs differ by design
on CPU (per-process BatchNorm statistics, see docs/distributed.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models import load_checkpoint
from train.__main__ import main
from train.config import TrainConfig
from train.distributed import PerSampleSeeded, World, gather_indexed_rows, per_rank_batch, sample_seed
from train.trainer import Trainer

# val 39 images: 2 ranks read 20 each, so the DistributedSampler pads one duplicate that the gather must drop;
# train 161 = 13 global batches of 12 + one of 5 (split 3 + 2)
COMMON = ["--data", "builtin:tiny", "--arch", "resnet18", "--image-size", "32", "--no-lgconv", "--batch-size", "12",
          "--workers", "0", "--no-progress", "--val-fraction", "0.195"]
PROBE = ["--epochs", "0", "--linear-init", "1"]  # one LinearInit epoch: 14 exact steps of the global batch
EXACT = {  # method -> extra flags; each must give the one-process loss and state
    "an": [],
    "role": [],
    "em-apl": ["--hp", "warmup_epochs=1", "--hp", "total_epochs=2"],  # pseudo-labels after epoch 1
    "opml-sp": ["--hp", "high_rank=0"],  # label correction and training APs from gathered predictions
    # epoch 2 corrects large losses: the threshold over the global batch, corrections merged at the epoch end
    "ll-cp": ["--linear-init", "2", "--hp", "delta_rel=5"],
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
REPO = Path(__file__).resolve().parent.parent


def torchrun(args: list[str], script: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Two gloo processes of ``python -m train ARGS`` (or of ``script``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*TORCHRUN, *(script or ["-m", "train"]), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=240)


def metrics(run: Path) -> list[dict[str, float]]:
    """The run's metrics.jsonl lines."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference over the float tensors of two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())


@pytest.fixture(scope="module")
def runs(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """For each method: a two-process run ``NAME-2`` and a one-process run ``NAME-1``; plus an interrupted
    two-process role run, an end-to-end two-process lac run and a global batch that does not split. The two-process
    runs share one torchrun group (tests/ddp_train_runs.py), the one-process runs run here."""
    root = tmp_path_factory.mktemp("ddp")
    two_epochs = [*COMMON, "--epochs", "0", "--linear-init", "2", "--method", "role", "--runs-dir", str(root)]
    # a timm backbone in the fixed-feature mode: sharded extraction into the feature cache, then exact head steps
    head = [*COMMON, "--arch", "test_efficientnet", "--weights", "none", "--trainable", "head", "--epochs", "2",
            "--method", "role", "--runs-dir", str(root)]
    probes = {method: [*COMMON, *PROBE, "--method", method, *extra, "--runs-dir", str(root)]
              for method, extra in {**EXACT, "pu-mlc": []}.items()}
    two_process = {
        **{f"{method}-2": [*args, "--name", f"{method}-2"] for method, args in probes.items()},
        "timm-head-2": [*head, "--name", "timm-head-2"],
        "lac-2": [*COMMON, "--epochs", "1", "--method", "lac", "--hp", "queue_size=64", "--runs-dir", str(root),
                  "--name", "lac-2"],
        "uneven-2": [*COMMON, "--batch-size", "15", "--epochs", "1", "--runs-dir", str(root), "--name", "uneven"],
        "role-killed": ["interrupt", *two_epochs, "--name", "role-killed"],  # last: it ends with an interrupt
    }
    codes_file = root / "codes.json"
    done = torchrun([str(codes_file), *(part for args in two_process.values() for part in ["--", *args])],
                    script=["tests/ddp_train_runs.py"])
    assert codes_file.is_file(), done.stderr[-3000:]
    codes = dict(zip(two_process, json.loads(codes_file.read_text()), strict=True))
    assert codes == {**dict.fromkeys(two_process, 0), "uneven-2": 2, "role-killed": 130}, done.stderr[-3000:]
    (root / "stderr.log").write_text(done.stderr)
    out = {name: root / name for name in two_process if name != "uneven-2"}
    for method, args in probes.items():
        assert main([*args, "--name", f"{method}-1"]) == 0
        out[f"{method}-1"] = root / f"{method}-1"
    assert main([*head, "--name", "timm-head-1"]) == 0
    assert main([*two_epochs, "--name", "role-straight"]) == 0
    out["timm-head-1"], out["role-straight"], out["stderr"] = root / "timm-head-1", root / "role-straight", root
    return out


@pytest.mark.parametrize("method", sorted(EXACT))
def test_two_processes_equal_one(runs: dict[str, Path], method: str) -> None:
    """Loss of every step (their epoch mean), weights and method state equal one process with the same batch."""
    two, one = runs[f"{method}-2"], runs[f"{method}-1"]
    assert sorted(p.name for p in two.glob("*.pt")) == ["best.pt", "last.pt"]
    for epoch_two, epoch_one in zip(metrics(two), metrics(one), strict=True):
        assert abs(epoch_two["loss"] - epoch_one["loss"]) < 1e-5
    a, b = load_checkpoint(two / "last.pt"), load_checkpoint(one / "last.pt")
    assert max_difference(a.model, b.model) < 1e-5
    assert a.training is not None and b.training is not None
    if method != "an":  # an keeps no state
        assert max_difference(a.training["method"], b.training["method"]) < 1e-5
    config = json.loads((two / "config.json").read_text())["resolved"]
    assert (config["world_size"], config["global_batch_size"], config["batch_size_per_process"]) == (2, 12, 6)


def test_timm_backbone_on_fixed_features_two_processes_equal_one(runs: dict[str, Path]) -> None:
    """--trainable head on a timm backbone under torchrun: the features the two ranks extracted (and cached) give the
    one-process run its features, and every head step equals the one-process step."""
    two, one = runs["timm-head-2"], runs["timm-head-1"]
    for epoch_two, epoch_one in zip(metrics(two), metrics(one), strict=True):
        assert abs(epoch_two["loss"] - epoch_one["loss"]) < 1e-5
    a, b = load_checkpoint(two / "last.pt"), load_checkpoint(one / "last.pt")
    assert a.meta.arch == "test_efficientnet" and max_difference(a.model, b.model) < 1e-5
    assert a.training is not None and b.training is not None
    assert max_difference(a.training["method"], b.training["method"]) < 1e-5


def test_method_state_is_updated_from_gathered_predictions(runs: dict[str, Path]) -> None:
    """The states compared above are not trivially equal: they moved in the epoch."""
    pseudo = load_checkpoint(runs["em-apl-2"] / "last.pt").training
    opml = load_checkpoint(runs["opml-sp-2"] / "last.pt").training
    assert pseudo is not None and opml is not None
    assert int((pseudo["method"]["pseudo"] >= 0).sum()) > 0  # EM-APL pseudo-labels from all 160 images
    assert float(opml["method"]["class_ap"].sum()) > 0  # OPML-SP's training APs


def test_large_loss_corrections_of_every_rank_reach_every_rank(runs: dict[str, Path]) -> None:
    """LL-Cp's permanent corrections (logged after the epoch-end merge) equal one process's; each rank alone
    marks only its own images' entries."""
    two, one = metrics(runs["ll-cp-2"]), metrics(runs["ll-cp-1"])
    assert two[0]["llcp_corrected"] == one[0]["llcp_corrected"] == 0  # the first epoch is plain AN
    assert two[1]["llcp_corrected"] == one[1]["llcp_corrected"] > 0


def test_pu_mlc_batch_statistics_are_per_process(runs: dict[str, Path]) -> None:
    """Documented deviation: PU-MLC's adaptive temperature and mixup use each process's share of the batch,
    so its loss differs from one process (both runs still complete and train)."""
    two, one = metrics(runs["pu-mlc-2"])[0]["loss"], metrics(runs["pu-mlc-1"])[0]["loss"]
    assert np.isfinite(two) and np.isfinite(one) and abs(two - one) > 1e-5


def test_gathered_eval_equals_one_process_eval(runs: dict[str, Path], tmp_path: Path) -> None:
    """The two-process summary (val/test gathered, padding dropped) equals evaluating its best.pt in one process."""
    run = tmp_path / "role-2"
    shutil.copytree(runs["role-2"], run)
    summary = json.loads((run / "summary.json").read_text())
    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text())["config"])
    trainer = Trainer(cfg, run_dir=run, resume=True)
    best = load_checkpoint(run / "best.pt")
    trainer.run.model.load_state_dict(best.model)
    val = trainer.evaluate(trainer.run.model, trainer.run.val_loader, "val").metrics
    assert val["num_images"] == summary["val"]["num_images"] == 39
    assert abs(val["mAP"] - summary["val"]["mAP"]) < 1e-6


def test_two_process_checkpoint_resumes_in_one_process(runs: dict[str, Path], tmp_path: Path) -> None:
    """Epoch 1 on two processes (killed after its save), epoch 2 on one = two epochs on one process."""
    run = tmp_path / "role-killed"
    shutil.copytree(runs["role-killed"], run)
    assert [m["epoch"] for m in metrics(run)] == [1]
    assert main(["--resume", str(run), "--no-progress"]) == 0
    resumed, straight = load_checkpoint(run / "last.pt"), load_checkpoint(runs["role-straight"] / "last.pt")
    assert resumed.training is not None and straight.training is not None
    assert max_difference(resumed.training["method"], straight.training["method"]) < 1e-5
    assert max_difference(resumed.model, straight.model) < 1e-5
    assert abs(metrics(run)[1]["loss"] - metrics(runs["role-straight"])[1]["loss"]) < 1e-5


def test_lac_two_stages_on_two_processes(runs: dict[str, Path]) -> None:
    """LAC's two stages run end to end; the stage-2 queue holds keys gathered from both processes."""
    run = runs["lac-2"]
    assert sorted(p.name for p in run.glob("*.pt")) == ["best-stage1.pt", "best.pt", "last.pt"]
    state = load_checkpoint(run / "last.pt").training
    assert state is not None and int(state["method"]["stage"]) == 2
    lines = metrics(run)
    assert lines[1]["stage"] == 2 and lines[1]["queue_entries"] > 0
    assert int((state["method"]["queue_labels"] >= 0).sum()) > 0
    assert "global batch 12 = 2 process(es) x 6" in (runs["stderr"] / "stderr.log").read_text()


def test_batch_that_does_not_split_is_a_clean_error(runs: dict[str, Path]) -> None:
    """Exit code 2 on every rank (checked in the fixture) and the one-line error."""
    assert "error: --batch-size 15 is the global batch" in (runs["stderr"] / "stderr.log").read_text()


def test_sync_bn_without_torchrun_is_a_clean_error(builtin_cache: Path, tmp_path: Path) -> None:
    assert main([*COMMON, "--sync-bn", "--runs-dir", str(tmp_path)]) == 2


def test_helpers() -> None:
    """Pure helpers: the global-batch split, padding-free row assembly and rank-independent augmentation seeds."""
    assert per_rank_batch(32, World(0, 4, 0)) == 8
    with pytest.raises(ValueError, match="divisible"):
        per_rank_batch(10, World(0, 4, 0))
    rows = torch.arange(6.0).reshape(3, 2)
    values, present = gather_indexed_rows(rows, torch.tensor([2, 0, 1]), 4)
    assert values.tolist() == [[2, 3], [4, 5], [0, 1], [0, 0]] and present.tolist() == [True, True, True, False]
    assert sample_seed(0, 1, 5) != sample_seed(0, 2, 5) != sample_seed(1, 1, 5)

    class Noise(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": torch.rand(3)}

    seeded = PerSampleSeeded(Noise(), seed=0)
    first = seeded[2]["x"]
    torch.rand(10)  # other draws in between do not matter
    assert torch.equal(seeded[2]["x"], first) and not torch.equal(seeded[1]["x"], first)
    seeded.set_epoch(1)
    assert not torch.equal(seeded[2]["x"], first)
