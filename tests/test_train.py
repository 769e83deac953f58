"""Training: runs on the tiny built-in dataset, resume equivalence, CLI errors, method losses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_clip import save_tiny_clip
from tiny_runs import FAST, tiny_config

from models import load_checkpoint
from train import epoch as epoch_module
from train.__main__ import main
from train.config import TrainConfig
from train.methods import METHODS, get_method, make_hparams
from train.methods.an import assume_negative_loss
from train.run_records import held_out_line
from train.trainer import Trainer


def test_run_folder_contents(builtin_cache: Path, tmp_path: Path) -> None:
    summary = Trainer(tiny_config(tmp_path, name="r", ema=0.9, clip_grad=1.0, lgconv=True)).fit()
    run = tmp_path / "r"
    assert {p.name for p in run.iterdir()} >= {"config.json", "metrics.jsonl", "best.pt", "last.pt", "summary.json"}
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    assert all(0 <= x["val_mAP"] <= 100 and x["loss"] > 0 and "val_mAP_ema" in x for x in lines)
    assert summary["test"]["num_images"] == 80 and 0 < summary["test"]["mAP"] <= 100
    assert summary["train_recovery"]["num_images"] == 160  # single-positive: hidden labels are scored
    best = load_checkpoint(run / "best.pt")
    assert best.training is None and best.meta.metrics["test"]["mAP"] == pytest.approx(summary["test"]["mAP"])
    assert best.meta.data["source"] == "builtin:tiny@seed0" and len(best.meta.data["fingerprint"]) == 16
    assert best.meta.method == "an" and best.meta.image_size == 32 and len(best.meta.classes) == 20
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["ema"] == 0.9 and config["resolved"]["device"] == "cpu"


def test_patience_gives_the_network_its_epochs_after_linear_init(builtin_cache: Path, tmp_path: Path) -> None:
    """--linear-init 3 with a head that does not move (its best epoch is the first), then the whole network with
    --patience 2: the end-to-end phase still runs at least 2 epochs to beat the head (it would stop after one if the
    patience counted from the head's best epoch)."""
    run = tmp_path / "li"
    assert main([*FAST, "--linear-init", "3", "--linear-init-lr", "1e-12", "--epochs", "4", "--lr", "1e-12",
                 "--patience", "2", "--runs-dir", str(tmp_path), "--name", "li"]) == 0
    epochs = [json.loads(x)["epoch"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs[:5] == [1, 2, 3, 4, 5]
    assert json.loads((run / "summary.json").read_text())["epochs_run"] >= 5


def test_end_of_run_line_says_what_each_figure_is() -> None:
    """mAP names the classes it averages when some have no positive; F1 names its threshold and the tags it gives."""
    metrics = {"mAP": 69.87, "classes_without_positives": 13, "OF1": 25.04, "CF1": 17.52}
    logits = np.array([[1.0, -1.0, -2.0], [-1.0, -1.0, -1.0]])
    line = held_out_line(metrics, logits, 57)
    assert "mAP 69.87 (over the 44 of 57 classes with a positive)" in line
    assert "at threshold 0.5, 0.50 tags per image" in line and "calibrates per-class thresholds" in line
    assert held_out_line({"mAP": 50.0, "classes_without_positives": 0, "OF1": None}, None, 5) == "mAP 50.00"


def test_training_beats_the_untrained_model(squares_csv: Path, tmp_path: Path) -> None:
    """A real learning signal: two epochs of AN lift the test mAP far above the untrained network's on the same
    test images (measured, seeds 0-7: +15.6 to +38.7 points; seed 0: 41.9 -> 76.9)."""
    trainer = Trainer(tiny_config(tmp_path, data=f"csv:{squares_csv}", name="learns"))
    test = trainer.run.predictor.eval_loader(trainer.run.splits.test)
    untrained = trainer.evaluate(trainer.run.model, test, "test").metrics
    summary = trainer.fit()
    assert summary["test"]["num_images"] == untrained["num_images"] == 48
    assert summary["test"]["mAP"] >= untrained["mAP"] + 10.0


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_trains_end_to_end(squares_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        method: str) -> None:
    """Every method trains; only one that trains on the full labels (an oracle) finds them in its batches."""
    batch_keys: list[set[str]] = []
    original = epoch_module.method_step

    def spy(model: torch.nn.Module, m: object, batch: dict[str, torch.Tensor]) -> object:
        batch_keys.append(set(batch))
        return original(model, m, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(epoch_module, "method_step", spy)
    observed = "single?neg=3" if METHODS[method].uses_observed_negatives else "single"  # iu trains on negatives
    clip = save_tiny_clip(tmp_path / "clip") if METHODS[method].uses_pseudo_labels else ""  # vlpl, aevlp
    summary = Trainer(tiny_config(tmp_path, data=f"csv:{squares_csv}", name=method, method=method, epochs=1,
                           observed=observed, clip=clip)).fit()
    assert 0 < summary["test"]["mAP"] <= 100
    assert batch_keys and all(("full" in keys) == METHODS[method].trains_on_full_labels for keys in batch_keys)
    best = load_checkpoint(tmp_path / method / "best.pt")
    hparams = json.loads(json.dumps(make_hparams(METHODS[method], {}).__dict__))  # the meta is JSON: tuples are lists
    assert best.meta.method == method and best.meta.method_hparams == hparams


def test_without_hidden_labels_oracles_are_refused_and_nothing_is_scored(
        squares_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Training labels declared partial (--labels partial): the reference bounds refuse to start (exit 2, no run
    folder). --observed full: nothing is hidden, so no full-label diagnostic is computed."""
    data = ["--data", f"csv:{squares_csv}", "--image-size", "32", "--no-progress", "--labels", "partial"]
    for oracle in (m for m in METHODS if METHODS[m].trains_on_full_labels):
        assert main([*data, "--method", oracle, "--runs-dir", str(tmp_path), "--name", oracle]) == 2
        err = capsys.readouterr().err
        assert "reference bound that trains on the training images' full labels" in err and "partial" in err
        assert "--labels full" in err  # partial labels may be complete after all: the user may say so
        assert not (tmp_path / oracle).exists()
    # one label per image: declaring them full would make the oracle treat them as complete, so it is not offered
    single = tmp_path / "single" / "labels.csv"
    single.parent.mkdir()
    rows = squares_csv.read_text().splitlines()
    single.write_text("\n".join([rows[0], *(f"{squares_csv.parent / r.split(',')[0]},{r.split(',')[1].split(';')[0]},"
                                             f"{r.split(',')[2]}" for r in rows[1:])]) + "\n")
    assert main(["--data", f"csv:{single}", "--image-size", "32", "--no-progress", "--method", "iun",
                 "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "single-positive" in err and "--method auto" in err and "--labels full" not in err
    cfg = tiny_config(tmp_path, data=f"csv:{squares_csv}", name="role-full", method="role", observed="full", epochs=1)
    summary = Trainer(cfg).fit()
    assert "train_recovery" not in summary and summary["test"]["num_images"] == 48
    line = json.loads((tmp_path / "role-full" / "metrics.jsonl").read_text())
    assert "estimator_unobserved_mean" in line and "estimator_recovery_mAP" not in line


def test_train_never_imports_gradio_or_onnxruntime(builtin_cache: Path, tmp_path: Path) -> None:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['train', *{FAST!r}, '--epochs', '1', '--runs-dir', {str(tmp_path)!r}, '--name', 'iso']\n"
        "try:\n    runpy.run_module('train', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0, e\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('gradio', 'onnxruntime', 'gradio_client'))\n"
        "print('IMPORTED', bad)\n"
    )
    env = {**os.environ, "SPML_CACHE": str(builtin_cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED []" in out.stdout
    assert (tmp_path / "iso" / "best.pt").is_file()


def test_cli_help_and_usage_errors(builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "--observed" in capsys.readouterr().out
    assert main([*FAST, "--observed", "partial:2", "--runs-dir", str(tmp_path)]) == 2
    assert "partial:R" in capsys.readouterr().err
    assert main([*FAST, "--hp", "nope=1", "--runs-dir", str(tmp_path)]) == 2
    assert "no hyperparameter 'nope'" in capsys.readouterr().err
    assert main(["--data", "csv:/does/not/exist.csv", "--runs-dir", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--method", "nope"])
    assert exc.value.code == 2


def test_existing_run_name_is_refused(builtin_cache: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert main([*FAST, "--runs-dir", str(tmp_path), "--name", "taken"]) == 2


def test_an_loss_value_by_hand() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.5, 3.0, -2.0]])
    z = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    p = [[1 / (1 + math.exp(-v)) for v in row] for row in logits.tolist()]
    expected = 0.0
    for i in range(2):
        for j in range(3):
            expected += -math.log(p[i][j] + 1e-5) if z[i, j] == 1 else -math.log(1 - p[i][j] + 1e-5)
    expected /= 6
    assert assume_negative_loss(logits, z).item() == pytest.approx(expected, rel=1e-6)


def test_bce_oracle_trains_on_full_labels_and_an_on_observed() -> None:
    from train.methods.base import MethodContext

    ctx = MethodContext(num_classes=3, num_train=2, train_observed=torch.zeros(2, 3), expected_positives=1.5,
                        epochs=1)
    batch = {"observed": torch.tensor([[1.0, 0, 0]]), "full": torch.tensor([[1.0, 1, 0]])}
    logits = torch.tensor([[0.3, 0.2, -0.1]])
    an = get_method("an")(ctx, make_hparams(METHODS["an"], {}))
    bce = get_method("bce")(ctx, make_hparams(METHODS["bce"], {}))
    assert an.loss(logits, batch).loss.item() == pytest.approx(assume_negative_loss(logits, batch["observed"]).item())
    assert bce.loss(logits, batch).loss.item() == pytest.approx(assume_negative_loss(logits, batch["full"]).item())
    assert an.loss(logits, batch).loss.item() != pytest.approx(bce.loss(logits, batch).loss.item())
    with pytest.raises(ValueError, match="unknown method"):
        get_method("magic")


def test_diverged_loss_stops_with_a_clear_error(builtin_cache: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from train.methods.an import AssumeNegative
    from train.methods.base import LossOutput

    def nan_loss(self: AssumeNegative, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        return LossOutput(logits.sum() * float("nan"))

    monkeypatch.setattr(AssumeNegative, "loss", nan_loss)
    assert main([*FAST, "--epochs", "1", "--workers", "0", "--runs-dir", str(tmp_path), "--name", "nan"]) == 1
    err = capsys.readouterr().err
    assert "loss is nan at epoch 1, step 1" in err and "--clip-grad" in err


def test_linear_init_trains_only_the_head_first_then_end_to_end(builtin_cache: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = Trainer(tiny_config(tmp_path, name="li", method="role", linear_init=2, epochs=1, linear_init_lr=1e-2))
    backbone_before = {k: v.clone() for k, v in trainer.run.model.backbone.state_dict().items()}
    head_before = trainer.run.model.head.weight.detach().clone()
    phase1_backbones = []
    original = Trainer.save_last

    def spy(self: Trainer, epoch: int) -> None:
        if epoch <= 2:
            phase1_backbones.append({k: v.clone() for k, v in self.run.model.backbone.state_dict().items()})
        original(self, epoch)

    monkeypatch.setattr(Trainer, "save_last", spy)
    summary = trainer.fit()
    for state in phase1_backbones:  # the backbone (weights and BN statistics) is frozen in phase 1
        for key, value in backbone_before.items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
    assert not torch.equal(trainer.run.model.head.weight, head_before)
    moved = [k for k, v in trainer.run.model.backbone.state_dict().items() if not torch.equal(v, backbone_before[k])]
    assert moved  # phase 2 trains end to end
    lines = [json.loads(x) for x in (tmp_path / "li" / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3] and [x.get("phase") for x in lines] == [1.0, 1.0, None]
    assert summary["test"]["num_images"] == 80


def test_linear_probe_keeps_the_backbone_and_reports_the_best_linear_epoch(builtin_cache: Path,
                                                                          tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, name="probe", method="role", linear_init=3, epochs=0, linear_init_lr=1e-2))
    backbone_before = {k: v.clone() for k, v in trainer.run.model.backbone.state_dict().items()}
    summary = trainer.fit()
    for key, value in trainer.run.model.backbone.state_dict().items():  # no end-to-end phase: never trained
        torch.testing.assert_close(value, backbone_before[key], rtol=0, atol=0, msg=key)
    lines = [json.loads(x) for x in (tmp_path / "probe" / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3] and all(x["phase"] == 1.0 for x in lines)
    best = max(lines, key=lambda x: x["val_mAP"])
    assert summary["best_epoch"] == best["epoch"]
    # the reported checkpoint is the best linear epoch's head on the untouched backbone
    assert summary["val"]["mAP"] == pytest.approx(best["val_mAP"], abs=1e-6)
    assert summary["test"]["num_images"] == 80


def test_epochs_zero_needs_linear_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*FAST, "--epochs", "0", "--runs-dir", str(tmp_path)]) == 2
    assert "--epochs must be >= 1 (0 only with --linear-init N" in capsys.readouterr().err


def test_the_quick_start_is_a_pretrained_head_on_the_small_built_in_shapes() -> None:
    """No option at all: builtin:small, Lite0's ImageNet weights at the preset's 96 px, a head on fixed features for 25
    epochs; a method that cannot train a head alone, a named backbone, no weights or --trainable all keep theirs."""
    from train.config import FINE_TUNE_DEFAULTS, HEAD_EPOCHS
    from train.options import build_parser, config_from_args

    def resolve(*argv: str) -> TrainConfig:
        return config_from_args(build_parser().parse_args(list(argv)))

    quick = resolve()
    assert (quick.data, quick.arch, quick.weights, quick.image_size) == ("builtin:small", "tf_efficientnet_lite0",
                                                                         "imagenet", 96)
    assert (quick.trainable, quick.epochs, quick.bn_stats, quick.linear_init) == ("head", HEAD_EPOCHS, "frozen", 0)
    assert quick.sources["trainable"] == quick.sources["image_size"] == "auto: the built-in shapes"
    assert resolve("--data", "builtin:tiny").image_size == 64 and resolve("--epochs", "3").epochs == 3
    lac = resolve("--method", "lac")  # its label-wise head needs feature maps: end to end, the fine-tune defaults
    assert (lac.trainable, lac.weights, lac.lr) == ("all", "imagenet", FINE_TUNE_DEFAULTS["lr"])
    whole = resolve("--trainable", "all")
    assert (whole.trainable, whole.linear_init, whole.epochs) == ("all", HEAD_EPOCHS, FINE_TUNE_DEFAULTS["epochs"])
    for argv in (["--weights", "none"], ["--arch", "resnet18"]):  # from random init, offline: ResNet-18 at 64 px
        scratch = resolve(*argv)
        assert (scratch.arch, scratch.weights, scratch.image_size, scratch.trainable) == ("resnet18", "none", 64,
                                                                                          "all"), argv


def test_fine_tuning_pretrained_weights_gets_the_fine_tune_defaults() -> None:
    """A pretrained backbone trained end to end gets LinearInit, the fine-tune learning rate, no schedule, patience
    and frozen BatchNorm statistics for every setting not given; random init, --trainable head and --preset paper keep
    theirs, and the runs that cannot have LinearInit's head phase are not given one."""
    from train.config import FINE_TUNE_DEFAULTS, HEAD_EPOCHS
    from train.options import build_parser, config_from_args

    def resolve(*argv: str) -> TrainConfig:
        return config_from_args(build_parser().parse_args(["--data", "folder:pets", *argv]))

    tuned = resolve()
    assert tuned.weights == "imagenet" and tuned.linear_init == HEAD_EPOCHS and tuned.bn_stats == "frozen"
    assert {k: getattr(tuned, k) for k in FINE_TUNE_DEFAULTS} == FINE_TUNE_DEFAULTS
    given = resolve("--lr", "1e-3", "--epochs", "2", "--linear-init", "0", "--bn-stats", "train")
    assert (given.lr, given.epochs, given.linear_init, given.bn_stats) == (1e-3, 2, 0, "train")
    assert given.patience == FINE_TUNE_DEFAULTS["patience"] and given.scheduler == FINE_TUNE_DEFAULTS["scheduler"]
    for argv in (["--method", "auto"], ["--method", "lac"], ["--boostlu", "5"]):
        assert resolve(*argv).linear_init == 0 and resolve(*argv).lr == FINE_TUNE_DEFAULTS["lr"], argv
    defaults = TrainConfig()
    scratch = resolve("--weights", "none")
    assert (scratch.lr, scratch.epochs, scratch.linear_init, scratch.bn_stats) == (defaults.lr, defaults.epochs, 0,
                                                                                  "train")
    head = resolve("--trainable", "head", "--bn-stats", "train")
    assert (head.lr, head.epochs, head.linear_init, head.bn_stats) == (defaults.lr, HEAD_EPOCHS, 0, "frozen")
    paper = resolve("--preset", "paper")
    assert (paper.lr, paper.linear_init, paper.patience, paper.bn_stats) == (1e-5, 0, 0, "train")


def test_every_setting_is_resolved_in_one_place_with_its_source(builtin_cache: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """resolve_settings names where each setting came from (given, --preset, the method's published settings,
    --from-run, the regime, the data's auto); the run prints the line once and config.json keeps the sources; an old
    config.json without them (nor bn_stats, head_bias, lgconv) still loads and starts a run."""
    from train.config import GIVEN, describe_settings, resolve_settings, run_config
    from train.options import build_parser, config_from_args

    tuned = resolve_settings({"data": "folder:pets", "lr": 1e-3})
    assert tuned.sources["data"] == tuned.sources["lr"] == GIVEN and tuned.lr == 1e-3
    assert tuned.sources["epochs"] == tuned.sources["linear_init"] == "fine-tune"
    assert tuned.sources["arch"] == "auto: real images" and tuned.sources["bn_stats"] == "auto: pretrained weights"
    assert "lr" not in {k for k, v in tuned.sources.items() if v == "fine-tune"}
    head = resolve_settings({"data": "folder:pets", "trainable": "head", "bn_stats": "train"})
    assert (head.epochs, head.bn_stats) == (25, "frozen") and head.sources["bn_stats"] == "fixed features"
    paper = resolve_settings({"method": "gr-loss", "data": "coco:/x"}, preset="paper")
    assert paper.sources["arch"] == "--preset paper" and paper.sources["head_lr_mult"] == "gr-loss's published settings"
    assert "sources" not in describe_settings(tuned) and "fine-tune: epochs=10" in describe_settings(tuned)

    run = tmp_path / "runs" / "first"
    assert main([*FAST, "--epochs", "1", "--workers", "0", "--runs-dir", str(tmp_path / "runs"), "--name", "first",
                 "--method", "epr", "--hp", "k=2"]) == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("settings: ")]
    assert len(printed) == 1 and "given: data=builtin:tiny" in printed[0] and "hp=k=2 " in printed[0]
    saved = json.loads((run / "config.json").read_text())["config"]
    assert saved["sources"]["epochs"] == GIVEN and saved["sources"]["arch"] == "auto: the built-in shapes"
    again = config_from_args(build_parser().parse_args(["--from-run", str(run), "--epochs", "2", "--hp", "k=3"]))
    assert again.sources["image_size"] == f"--from-run {run}" and again.sources["epochs"] == GIVEN
    assert again.hp == {"k": "3"} and again.method == "epr"

    old = {k: v for k, v in saved.items() if k not in ("sources", "bn_stats", "head_bias", "lgconv")}
    (run / "config.json").write_text(json.dumps({"config": old}))
    _, loaded = run_config(str(run))
    assert (loaded.sources, loaded.bn_stats, loaded.head_bias) == ({}, "train", "default")
    assert describe_settings(loaded).startswith("settings: given: ")
