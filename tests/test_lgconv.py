"""LgConv: the branch's math, insertion, start-up equivalence, trainable scopes, the exact fold, ONNX parity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torchvision import models as tvm

from export.onnx_export import export_to_file
from models import ModelMeta, build_model, load_checkpoint, model_from_meta, save_checkpoint
from models.data.registry import load_dataset
from models.lgconv import FoldedLgConv2d, GlobalBranch, LgConv2d, convert_to_lgconv, fold_resnet, global_branches
from models.preprocess import EvalTransform
from train.config import TrainConfig, resolve_model_defaults


def _naive_branch(gb: GlobalBranch, x: torch.Tensor) -> torch.Tensor:
    """GB(x) written out position by position and head by head (docs/methods.md, "PU-MLC and LgConv"; eval-mode
    BN)."""
    n, c, h, w = x.shape
    heads, k = gb.heads, c // gb.heads
    w_r, b_r = gb.reduce.weight[:, :, 0, 0], gb.reduce.bias
    w_a, b_a = gb.attention.weight[:, :, 0, 0], gb.attention.bias
    w_g, b_g = gb.gate.weight[:, :, 0, 0], gb.gate.bias
    w_v, b_v = gb.value.weight[:, :, 0, 0], gb.value.bias
    w_p, b_p = gb.proj.weight[:, :, 0, 0], gb.proj.bias
    s = gb.proj.stride[0]
    bn = gb.bn
    out = torch.zeros(n, w_p.shape[0], (h - 1) // s + 1, (w - 1) // s + 1, dtype=torch.float64)
    for i in range(n):
        pixels = [x[i, :, r, q] for r in range(h) for q in range(w)]  # C-vectors in row-major order
        local = [torch.relu(w_r @ v + b_r) for v in pixels]
        mean_local = sum(local) / len(local)
        att_logits = torch.stack([w_a @ torch.cat([v, mean_local]) + b_a for v in local])  # (HW, heads)
        att = torch.exp(att_logits - att_logits.max(0).values)
        att = att / att.sum(0)
        gates = torch.stack([torch.sigmoid(w_g @ torch.cat([v, mean_local]) + b_g) for v in local])
        values = torch.stack([w_v @ v + b_v for v in pixels])  # (HW, C)
        g = [sum(att[p, hd] * values[p, hd * k:(hd + 1) * k] for p in range(h * w)) for hd in range(heads)]
        for r in range(0, h, s):
            for q in range(0, w, s):
                p = r * w + q
                broadcast = torch.cat([g[hd] * gates[p, hd] for hd in range(heads)])
                y = w_p @ (pixels[p] + broadcast) + b_p
                y = (y - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
                out[i, :, r // s, q // s] = y
    return out


def _randomise_batchnorms(model: nn.Module, seed: int = 0) -> None:
    """Give every BatchNorm non-trivial statistics and affine parameters (as after training)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)


@pytest.fixture(scope="module")
def real_images(builtin_cache: Path) -> torch.Tensor:
    """Eight validation-split images of the tiny built-in dataset at 64 px, normalised."""
    data = load_dataset("builtin:tiny")
    tf = EvalTransform(64, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    return torch.stack([tf(p) for p in data.train.paths[:8]])


@pytest.mark.parametrize("stride", [1, 2])
def test_branch_matches_a_position_by_position_computation(stride: int) -> None:
    torch.manual_seed(0)
    gb = GlobalBranch(16, 24, stride=stride).double().eval()
    _randomise_batchnorms(gb)
    x = torch.randn(2, 16, 5, 6, dtype=torch.float64)
    with torch.no_grad():
        got = gb(x)
    assert got.shape == (2, 24, (5 - 1) // stride + 1, (6 - 1) // stride + 1)
    torch.testing.assert_close(got, _naive_branch(gb, x), rtol=1e-10, atol=1e-10)


def test_every_3x3_conv_is_wrapped_and_nothing_else() -> None:
    for arch, expected in (("resnet18", 16), ("resnet50", 16)):
        net = tvm.get_model(arch)
        n3 = sum(1 for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3))
        n_other = sum(1 for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size != (3, 3))
        assert convert_to_lgconv(net) == n3 == expected
        assert sum(isinstance(m, LgConv2d) for m in net.modules()) == expected
        assert net.conv1.kernel_size == (7, 7) and type(net.conv1) is nn.Conv2d
        plain_convs = [m for m in net.modules() if type(m) is nn.Conv2d and not _in_branch(net, m)]
        assert len(plain_convs) == n_other
    # PU-MLC's count: about 2.25 C_in^2 per module, 2.88M extra parameters on ResNet-50
    extra = sum(p.numel() for g in global_branches(net) for p in g.parameters())
    assert 2.8e6 < extra < 2.95e6


def _in_branch(root: nn.Module, target: nn.Module) -> bool:
    return any(target is m for g in global_branches(root) for m in g.modules())


def test_branch_starts_switched_off_so_outputs_equal_the_plain_resnet(real_images: torch.Tensor) -> None:
    torch.manual_seed(3)
    plain = build_model("resnet18", 5).eval()
    torch.manual_seed(3)
    lg = build_model("resnet18", 5, lgconv=True).eval()
    assert any(global_branches(lg)) and not any(global_branches(plain))
    gammas = torch.cat([g.bn.weight.detach() for g in global_branches(lg)])
    assert 0.5e-4 < float(gammas.std()) < 2e-4 and abs(float(gammas.mean())) < 2e-5  # Normal(0, 1e-4)
    # the original convolutions kept their weights
    lg_state = lg.state_dict()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(lg_state[key], value, rtol=0, atol=0)
    with torch.no_grad():
        a, b = plain(real_images), lg(real_images)
        rel = float((a - b).abs().max() / a.abs().max())
        assert rel < 1e-2
        for g in global_branches(lg):
            g.bn.weight.zero_()
        torch.testing.assert_close(lg(real_images), a, rtol=1e-5, atol=1e-5)


def test_plain_resnet_weights_load_into_an_lgconv_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    donor = tvm.resnet18()
    torch.save(donor.state_dict(), tmp_path / "plain.pth")
    model = build_model("resnet18", 3, weights=str(tmp_path / "plain.pth"), lgconv=True)
    torch.testing.assert_close(model.backbone.layer2[0].conv1.weight, donor.layer2[0].conv1.weight)
    assert isinstance(model.backbone.layer2[0].conv1, LgConv2d)


def test_layer4_scope_trains_branches_layer4_and_head_only(real_images: torch.Tensor) -> None:
    """PU-MLC's published scope (``trainable_scope`` of the method, applied by --preset paper)."""
    torch.manual_seed(0)
    model = build_model("resnet18", 5, lgconv=True)
    model.set_trainable_scope("layer4")
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(n.startswith(("backbone.layer4.", "head.")) or ".global_branch." in n for n in names)
    assert "backbone.layer1.0.conv1.global_branch.value.weight" in names
    assert "backbone.layer1.0.conv1.weight" not in names and "backbone.bn1.weight" not in names
    assert "backbone.layer4.0.conv1.weight" in names and "head.weight" in names
    frozen_bn = model.backbone.layer2[0].bn1
    branch_bn = model.backbone.layer2[0].conv1.global_branch.bn
    before = frozen_bn.running_mean.clone(), branch_bn.running_mean.clone()
    model.train()
    assert not frozen_bn.training and branch_bn.training and model.backbone.layer4[0].bn1.training
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    frozen_w = model.backbone.layer3[1].conv2.weight.clone()
    model(real_images).sum().backward()
    opt.step()
    torch.testing.assert_close(frozen_bn.running_mean, before[0], rtol=0, atol=0)  # statistics fixed
    assert not torch.equal(branch_bn.running_mean, before[1])
    torch.testing.assert_close(model.backbone.layer3[1].conv2.weight, frozen_w, rtol=0, atol=0)
    model.set_trainable_scope("all")
    assert all(p.requires_grad for p in model.parameters()) and frozen_bn.training
    with pytest.raises(ValueError, match="unknown trainable scope"):
        model.set_trainable_scope("layer3")


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_fold_is_numerically_equivalent_on_real_images(arch: str, real_images: torch.Tensor) -> None:
    torch.manual_seed(1)
    model = build_model(arch, 5, lgconv=True)
    _randomise_batchnorms(model)
    with torch.no_grad():  # switch the branches on properly, as after training
        for g in global_branches(model):
            g.bn.weight.normal_(0.0, 0.3)
    model.eval()
    folded = fold_resnet(model)
    assert not any(isinstance(m, (nn.BatchNorm2d, LgConv2d, GlobalBranch)) for m in folded.modules())
    assert any(global_branches(model)) and isinstance(model.backbone.bn1, nn.BatchNorm2d)  # the original is untouched
    with torch.no_grad():
        ref = model(real_images)
        got = folded(real_images)
    rel = float((got - ref).abs().max() / ref.abs().max())
    assert rel <= 1e-5, rel
    if arch == "resnet18":  # the in-place global term also works on channels_last inputs and under autocast
        with torch.no_grad():
            last = folded(real_images.contiguous(memory_format=torch.channels_last))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = folded(real_images)
        assert float((last - ref).abs().max() / ref.abs().max()) <= 1e-5
        assert low.dtype == torch.bfloat16 and float((low.float() - ref).abs().max() / ref.abs().max()) <= 0.05


def test_fold_of_a_plain_resnet_only_fuses_batchnorm(real_images: torch.Tensor) -> None:
    torch.manual_seed(2)
    model = build_model("resnet18", 5)
    _randomise_batchnorms(model)
    model.eval()
    folded = fold_resnet(model)
    with torch.no_grad():
        torch.testing.assert_close(folded(real_images), model(real_images), rtol=1e-5, atol=1e-5)


def test_folded_lgconv_model_exports_to_onnx_with_parity(tmp_path: Path, real_images: torch.Tensor) -> None:
    torch.manual_seed(4)
    model = build_model("resnet18", 5, lgconv=True)
    _randomise_batchnorms(model)
    with torch.no_grad():
        for g in global_branches(model):
            g.bn.weight.normal_(0.0, 0.3)
    model.eval()
    meta = ModelMeta(classes=list("abcde"), arch="resnet18", image_size=64, lgconv=True)
    path = tmp_path / "lg.onnx"
    export_to_file(fold_resnet(model), meta, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (real_images[:1], real_images):
        got = session.run(None, {"images": batch.numpy()})[0]
        with torch.no_grad():
            ref = model(batch).numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


def _ort_optimised_op_counts(path: Path) -> dict[str, int]:
    """Op types (and counts) of the graph ONNX Runtime runs for ``path`` on this CPU, at its full optimisation."""
    import collections

    import onnx

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(path.with_suffix(".opt.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node))


def test_exported_global_term_stays_in_onnx_runtimes_blocked_layout(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    folded = fold_resnet(build_model("resnet18", 5, lgconv=True).eval())
    meta = ModelMeta(classes=list("abcde"), arch="resnet18", image_size=32, lgconv=True)
    export_to_file(folded, meta, tmp_path / "blocked.onnx")
    with monkeypatch.context() as m:  # the graph as exported without the identity depthwise conv
        m.setattr(torch.onnx, "is_in_onnx_export", lambda: False)
        export_to_file(folded, meta, tmp_path / "plain-add.onnx")
    before = _ort_optimised_op_counts(tmp_path / "plain-add.onnx")
    after = _ort_optimised_op_counts(tmp_path / "blocked.onnx")
    if not before.get("ReorderOutput"):
        pytest.skip("ONNX Runtime does not use its blocked (NCHWc) layout on this CPU")
    lgconvs = sum(isinstance(m, FoldedLgConv2d) for m in folded.modules())
    assert lgconvs == 16  # resnet18: both 3x3 convs of each of its 8 BasicBlocks
    assert after["Conv"] == before["Conv"] + lgconvs  # one identity depthwise conv per LgConv
    # ...which lets ONNX Runtime fuse the LgConv's Add (and the ReLU after it) into the 3x3 convolution
    assert after["Add"] < before["Add"] and after.get("Relu", 0) < before["Relu"]
    assert after["ReorderOutput"] < before["ReorderOutput"]


def test_checkpoints_record_lgconv_and_rebuild_the_right_graph(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", 3, lgconv=True)
    save_checkpoint(tmp_path / "lg.pt", model.state_dict(),
                    ModelMeta(classes=["a", "b", "c"], arch="resnet18", image_size=32, lgconv=True))
    ckpt = load_checkpoint(tmp_path / "lg.pt")
    rebuilt = model_from_meta(ckpt.meta)
    rebuilt.load_state_dict(ckpt.model)  # strict: every LgConv key has its place
    assert ckpt.meta.lgconv and any(global_branches(rebuilt))
    plain_meta = ModelMeta.from_json('{"classes": ["a"], "arch": "resnet18", "image_size": 32}')
    assert not plain_meta.lgconv and not any(global_branches(model_from_meta(plain_meta)))


def test_lgconv_is_on_by_default_and_old_run_configs_stay_plain() -> None:
    assert resolve_model_defaults(TrainConfig(weights="none")).lgconv is True  # built-in, no weights: ResNet-18
    assert resolve_model_defaults(TrainConfig(arch="test_efficientnet")).lgconv is False  # timm: no LgConv
    assert TrainConfig.from_dict({"method": "an"}).lgconv is False  # a config.json written before LgConv
    assert TrainConfig.from_dict({"lgconv": True}).lgconv is True
