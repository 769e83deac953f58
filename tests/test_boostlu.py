"""BoostLU (``--boostlu``): the head against the authors' forward (tests/data/boostlu, see tests/data/README.md),
the model, its checkpoint, LgConv's fold and usage errors. A trained LL-R + BoostLU run goes through the whole
export (ONNX parity, FP16/INT8 checks, thresholds) to the tagger and the demo in tests/test_export_pipeline.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models import ModelMeta, build_model, load_checkpoint, model_from_meta, save_checkpoint
from models.lgconv import fold_resnet, global_branches
from models.network import BoostedCamHead
from train.__main__ import main as train_main
from train.config import TrainConfig
from train.options import build_parser, config_from_args

FIXTURE = Path(__file__).resolve().parent / "data" / "boostlu" / "forward.npz"


@pytest.mark.parametrize("alpha", [5.0, 2.5])
def test_head_equals_the_reference_forward(alpha: float) -> None:
    ref = np.load(FIXTURE)
    weight, bias = ref[f"alpha{alpha:g}_weight"], ref[f"alpha{alpha:g}_bias"]
    head = BoostedCamHead(weight.shape[1], weight.shape[0], alpha)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight[:, :, 0, 0]))
        head.bias.copy_(torch.from_numpy(bias))
        logits = head(torch.from_numpy(ref["features"])).numpy()
    np.testing.assert_allclose(logits, ref[f"alpha{alpha:g}_logits"], rtol=1e-6, atol=1e-7)


def _images(n: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_model_boosts_the_maps_before_pooling_and_alpha_one_is_the_linear_head() -> None:
    torch.manual_seed(0)
    plain = build_model("resnet18", 6, lgconv=False).eval()
    boosted = build_model("resnet18", 6, lgconv=False, boostlu=5.0).eval()
    identity = build_model("resnet18", 6, lgconv=False, boostlu=1.0).eval()
    boosted.load_state_dict(plain.state_dict())  # the same tensor names: a linear head's weights load
    identity.load_state_dict(plain.state_dict())
    x = _images()
    with torch.no_grad():
        maps = plain.feature_map(x)
        cam = torch.einsum("ndhw,cd->nchw", maps, plain.head.weight) + plain.head.bias[:, None, None]
        expected = torch.where(cam > 0, 5.0 * cam, cam).mean(dim=(2, 3))
        assert boosted.features(x).shape == maps.shape  # the head takes the map, not pooled features
        torch.testing.assert_close(boosted(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(identity(x), plain(x), rtol=1e-4, atol=1e-5)
        assert (boosted(x) - plain(x)).abs().max() > 0.1
    assert boosted.boostlu == 5.0 and plain.boostlu is None
    assert boosted.head_meta() == {"kind": "linear", "boostlu": 5.0} and plain.head_meta() == {"kind": "linear"}


def _activate(model: torch.nn.Module) -> None:
    """Random BatchNorm statistics and LgConv branches switched on, so that folding has real work to do."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
                m.weight.copy_(0.5 + torch.rand(m.num_features, generator=g))
        for branch in global_branches(model):
            branch.bn.weight.fill_(0.3)


def test_checkpoint_round_trip_and_lgconv_fold(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", 5, lgconv=True, boostlu=5.0)
    _activate(model)
    model.eval()
    meta = ModelMeta(classes=list("abcde"), arch="resnet18", image_size=32, lgconv=True, head=model.head_meta())
    save_checkpoint(tmp_path / "best.pt", model.state_dict(), meta)
    ckpt = load_checkpoint(tmp_path / "best.pt")  # weights_only=True inside
    assert ckpt.meta.head == {"kind": "linear", "boostlu": 5.0}
    rebuilt = model_from_meta(ckpt.meta)
    rebuilt.load_state_dict(ckpt.model)
    rebuilt.eval()
    assert isinstance(rebuilt.head, BoostedCamHead) and rebuilt.head.alpha == 5.0
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(fold_resnet(rebuilt)(x), model(x), rtol=1e-4, atol=1e-4)


def test_usage_errors(builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="linear head"):
        build_model("resnet18", 5, head="lem", boostlu=5.0)
    with pytest.raises(ValueError, match="> 0"):
        BoostedCamHead(8, 2, 0.0)

    def config(*argv: str) -> TrainConfig:
        return config_from_args(build_parser().parse_args([*argv, "--runs-dir", str(tmp_path)]))

    assert config("--boostlu").boostlu == 5.0 and config().boostlu is None
    assert config("--boostlu", "2").boostlu == 2.0
    for argv, message in ((["--boostlu", "0"], "> 0"), (["--boostlu", "--head", "lem"], "linear head"),
                          (["--boostlu", "--linear-init", "2"], "--linear-init")):
        with pytest.raises(ValueError, match=message):
            config(*argv)
    # lac's head is lem (--head auto): refused when the model is built, exit status 2
    argv = ["--data", "builtin:tiny", "--method", "lac", "--boostlu", "--image-size", "32", "--workers", "0",
            "--no-progress", "--runs-dir", str(tmp_path)]
    assert train_main(argv) == 2
    assert "linear head" in capsys.readouterr().err
