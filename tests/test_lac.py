"""LAC: the label-wise embedding head, the strong view, PLC and SupCon values computed independently, the
memory queue, numerical safety, the two training stages (resume inside stage 2) and export of the LEM head."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from interrupt import interrupt_after_saves

from models import load_checkpoint
from models.data.augment import StrongTransform, cutout
from models.label_embedding import LabelEmbeddingConfig, sine_position_encoding
from models.lgconv import fold_resnet
from models.network import build_model, model_from_meta
from models.preprocess import EvalTransform
from train.__main__ import main
from train.epoch import method_step
from train.methods import METHODS, MethodContext, get_method, make_hparams
from train.methods.lac import class_embedding_similarity, plc_loss, supcon_loss
from train.prepared_run import lem_token_warning

# plain ResNet: LgConv is not what these tests are about, and at 32 px its global branches cost about as much
# as the rest of the network (tests/test_lgconv.py and test_train.py train and resume with it)
FAST = ["--data", "builtin:tiny", "--weights", "none", "--image-size", "32", "--batch-size", "16", "--no-progress",
        "--workers", "0", "--no-lgconv"]


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def bce(s: float, t: float) -> float:
    return -(t * math.log(sig(s)) + (1 - t) * math.log(1 - sig(s)))


def lac_method(num_classes: int = 4, batch_size: int = 2, **hp: str) -> torch.nn.Module:
    ctx = MethodContext(num_classes=num_classes, num_train=batch_size,
                        train_observed=torch.zeros(batch_size, num_classes), expected_positives=1.0, epochs=2,
                        batch_size=batch_size, feature_width=8)
    return get_method("lac")(ctx, make_hparams(METHODS["lac"], hp))


# ----------------------------------------------------------------------------- model
def test_lem_head_shapes_metadata_round_trip_and_fold() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", 5, head="lem", lgconv=True).eval()
    assert model.head_meta() == {"kind": "lem", **LabelEmbeddingConfig().to_dict()}
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits, emb = model.forward_embeddings(x)
        assert emb.shape == (2, 5, 512) and logits.shape == (2, 5)
        torch.testing.assert_close(model(x), logits)
        # the classifier is group-wise: logit_c = <W_c, f_c> + b_c
        w, b = model.head.class_weight, model.head.class_bias
        torch.testing.assert_close(logits[1, 3], emb[1, 3] @ w[3] + b[3])
        torch.testing.assert_close(fold_resnet(model)(x), logits, rtol=1e-5, atol=1e-5)
    # a second image in the batch does not change the first one's scores (no cross-image mixing)
    with torch.no_grad():
        torch.testing.assert_close(model(x[:1]), logits[:1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="--head lem"):
        build_model("resnet18", 5).forward_embeddings(x)


def test_sine_position_encoding_values() -> None:
    pe = sine_position_encoding(2, 3, 8, torch.device("cpu"))
    assert pe.shape == (6, 8)
    # token (row 1, col 2): y = 2/2 * 2pi, x = 3/3 * 2pi; per axis 4 features with frequencies 10000^(0, 0, .5, .5)
    y = x = 2 * math.pi
    expected = [math.sin(y), math.cos(y), math.sin(y / 100), math.cos(y / 100),
                math.sin(x), math.cos(x), math.sin(x / 100), math.cos(x / 100)]
    torch.testing.assert_close(pe[5], torch.tensor(expected), atol=1e-6, rtol=0)
    row0_col1 = [math.sin(math.pi), math.cos(math.pi), math.sin(math.pi / 100), math.cos(math.pi / 100),
                 math.sin(4 * math.pi / 3), math.cos(4 * math.pi / 3),
                 math.sin(4 * math.pi / 300), math.cos(4 * math.pi / 300)]
    torch.testing.assert_close(pe[1], torch.tensor(row0_col1), atol=1e-6, rtol=0)


def test_strong_view_is_augmented_but_shaped_like_the_weak_one() -> None:
    random.seed(0)
    torch.manual_seed(0)
    image = torch.full((3, 40, 50), 128, dtype=torch.uint8)
    cut = cutout(image)
    changed = (cut != image).any(0)
    assert changed.any() and changed.float().mean() <= 0.25 + 1e-6  # at most a (0.5 H) x (0.5 W) rectangle
    assert (image == 128).all()  # input untouched
    strong = StrongTransform(EvalTransform(32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    views = torch.stack([strong(torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)) for _ in range(4)])
    assert views.shape == (4, 3, 32, 32) and views.dtype == torch.float32 and torch.isfinite(views).all()


# ----------------------------------------------------------------------------- losses
def test_plc_value_selection_and_observed_positive_included() -> None:
    weak = torch.tensor([[3.0, -3.0, 0.2], [0.0, 2.5, -0.3]])
    strong = torch.tensor([[1.0, -0.5, 0.7], [-1.0, 0.4, 2.0]])
    z = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    loss, target = plc_loss(strong, weak, z, threshold=0.6)
    terms = []
    for i in range(2):
        for c in range(3):
            q = sig(float(weak[i, c])) + float(z[i, c])
            if q >= 0.6:
                terms.append(bce(float(strong[i, c]), 1.0))
            elif q < 0.4:
                terms.append(bce(float(strong[i, c]), 0.0))
    # q: [0.95, 0.047, 1.55], [0.5, 0.92, 0.43] -> selected: 4 entries; (1,0) and (1,2) are in the ignored band
    assert len(terms) == 4
    assert float(loss) == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    assert target.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    # no selected entry: 0, not a division by zero
    empty, _ = plc_loss(strong, torch.zeros(2, 3), torch.zeros(2, 3), threshold=0.9)
    assert float(empty) == 0.0


def test_supcon_value_matches_a_direct_computation() -> None:
    torch.manual_seed(0)
    feats = torch.nn.functional.normalize(torch.randn(3, 2, 4), dim=-1)
    labels = torch.tensor([0, 1, 0])
    tau = 0.5
    got = float(supcon_loss(feats, labels, tau))
    vecs = [feats[i, v].tolist() for v in range(2) for i in range(3)]  # view-major, like the reference
    labs = [int(labels[i]) for _ in range(2) for i in range(3)]
    total = 0.0
    for a in range(6):
        dots = {j: sum(p * q for p, q in zip(vecs[a], vecs[j], strict=True)) / tau for j in range(6) if j != a}
        log_den = math.log(sum(math.exp(d) for d in dots.values()))
        positives = [j for j in dots if labs[j] == labs[a]]
        total += -sum(dots[j] - log_den for j in positives) / len(positives)
    assert got == pytest.approx(total / 6, rel=1e-5)
    assert float(supcon_loss(torch.zeros(0, 2, 4), torch.zeros(0, dtype=torch.long), tau)) == 0.0


def test_supcon_gradient_pulls_same_class_views_together() -> None:
    a = torch.nn.functional.normalize(torch.tensor([[[1.0, 0.2], [0.2, 1.0]], [[-1.0, 0.1], [0.0, -1.0]]]), dim=-1)
    a.requires_grad_(True)
    supcon_loss(a, torch.tensor([0, 1]), 0.5).backward()
    before = float((a[0, 0] * a[0, 1]).sum().detach())
    with torch.no_grad():
        stepped = a - 0.1 * a.grad
    unit = torch.nn.functional.normalize(stepped[0], dim=-1)
    after = float(unit[0] @ unit[1])
    assert after > before


def test_queue_holds_a_whole_batch_wraps_and_keeps_only_the_current_batch_differentiable() -> None:
    method = lac_method(num_classes=3, batch_size=2, queue_size="4")
    assert method.queue.shape == (6, 2, 128)  # max(4, batch 2 x 3 classes): one batch can never overflow it
    first = torch.nn.functional.normalize(torch.randn(4, 2, 128), dim=-1).requires_grad_(True)
    feats, labels = method._enqueue(first, torch.tensor([0, 1, 2, 0]))
    assert feats.shape == (4, 2, 128) and labels.tolist() == [0, 1, 2, 0] and int(method.queue_ptr) == 4
    second = torch.nn.functional.normalize(torch.randn(3, 2, 128), dim=-1).requires_grad_(True)
    feats, labels = method._enqueue(second, torch.tensor([2, 2, 1]))  # 4 + 3 >= 6: wraps to slot 0
    assert int(method.queue_ptr) == 3 and labels.tolist() == [2, 2, 1, 0]
    feats.sum().backward()
    assert second.grad is not None and first.grad is None  # old entries are detached
    torch.testing.assert_close(method.queue[:3], second.detach())
    torch.testing.assert_close(method.queue[3], first[3].detach())


class _StubModel(torch.nn.Module):
    """Returns fixed logits/embeddings for a 2N batch (weak then strong)."""

    def __init__(self, logits: torch.Tensor, emb: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.emb = logits, emb

    def forward_embeddings(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits, self.emb


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("stage", [1, 2])
def test_extreme_logits_give_finite_loss_and_gradients(autocast: bool, stage: int) -> None:
    method = lac_method()
    if stage == 2:
        method.start_stage(2)
    logits = torch.tensor([[50.0, -50.0, 50.0, -50.0], [-50.0, 50.0, -50.0, 50.0]] * 2, requires_grad=True)
    emb = (torch.randn(4, 4, 8) * 50).requires_grad_(True)
    batch = {"images": torch.zeros(2, 3, 4, 4), "images_strong": torch.zeros(2, 3, 4, 4),
             "observed": torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]), "index": torch.tensor([0, 1])}
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = method_step(_StubModel(logits.to(torch.bfloat16), emb.to(torch.bfloat16)), method, batch)
    else:
        out = method_step(_StubModel(logits, emb), method, batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logits.grad).all()
    assert ("lac" in out.logs) == (stage == 2)
    assert (emb.grad is not None) == (stage == 2)  # embeddings enter the loss only through stage 2's LAC term
    if stage == 2:
        assert torch.isfinite(emb.grad).all()


def test_hyperparameter_checks_and_cub_preset() -> None:
    with pytest.raises(ValueError, match="stages"):
        lac_method(stages="3")
    with pytest.raises(ValueError, match="thresholds"):
        lac_method(threshold_stage1="0.3")
    assert make_hparams(METHODS["lac"], {}, "cub200").threshold_stage1 == pytest.approx(0.5)
    assert make_hparams(METHODS["lac"], {}, "coco2014").threshold_stage1 == pytest.approx(0.6)


def test_class_embedding_similarity_and_the_few_tokens_warning() -> None:
    same = torch.randn(3, 1, 8).expand(3, 4, 8)  # every class of an image has the same embedding
    assert class_embedding_similarity(same) == pytest.approx(1.0, abs=1e-6)
    orthogonal = torch.eye(4).unsqueeze(0).repeat(2, 1, 1) * 5.0  # classes along different axes
    assert class_embedding_similarity(orthogonal) == pytest.approx(0.0, abs=1e-6)
    pair = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])  # one image, two classes 45 degrees apart
    assert class_embedding_similarity(pair) == pytest.approx(math.cos(math.pi / 4))
    warning = lem_token_warning("lem", 64)
    assert warning is not None and "2x2 = 4" in warning
    assert lem_token_warning("lem", 224) is None and lem_token_warning("linear", 64) is None


# ----------------------------------------------------------------------------- training
@pytest.fixture
def narrow_lem_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LEM head with a 128-wide feed-forward layer (default: 4x the width, 2048 for ResNet-18): the same graph
    and state, for half the training time. Stored in the checkpoints' metadata like any head shape."""
    heads, encoder_layers, decoder_layers, _, dropout = LabelEmbeddingConfig.__init__.__defaults__
    monkeypatch.setattr(LabelEmbeddingConfig.__init__, "__defaults__",
                        (heads, encoder_layers, decoder_layers, 128, dropout))


def test_two_stages_resume_inside_stage_two_and_export(builtin_cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       narrow_lem_head: None) -> None:
    """lac with 2 epochs per stage: a kill after epoch 3 (inside stage 2, queue filled) resumes exactly."""
    args = [*FAST, "--method", "lac", "--epochs", "2", "--ema", "0.5", "--runs-dir", str(tmp_path)]
    assert main([*args, "--name", "straight"]) == 0
    run = tmp_path / "straight"
    summary = json.loads((run / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == [1, 2]
    assert summary["stages"][0]["best_epoch"] in (1, 2) and summary["stages"][1]["best_epoch"] in (3, 4)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == [1, 1, 2, 2]
    assert all(-1.0 <= x["class_embedding_cos"] <= 1.0 for x in lines)
    assert all("lac" not in x for x in lines[:2]) and all(x["lac"] > 0 for x in lines[2:])
    best1 = load_checkpoint(run / "best-stage1.pt")
    assert best1.meta.epoch in (1, 2) and best1.meta.head["kind"] == "lem" and best1.meta.head["ffn"] == 128

    with monkeypatch.context() as patch:
        interrupt_after_saves(patch, saves=3)
        assert main([*args, "--name", "resumed"]) == 130
    state = load_checkpoint(tmp_path / "resumed" / "last.pt").training
    assert state["epoch"] == 3 and int(state["method"]["stage"]) == 2
    assert int((state["method"]["queue_labels"] >= 0).sum()) > 0
    assert main(["--resume", str(tmp_path / "resumed")]) == 0
    a = load_checkpoint(run / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "last.pt")
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=0, msg=key)
    for key, value in a.training["method"].items():  # projector, queue, pointer, stage
        torch.testing.assert_close(b.training["method"][key], value, rtol=0, atol=0, msg=key)

    # the LEM head model exports and runs in ONNX Runtime like PyTorch
    from export.__main__ import main as export_main

    assert export_main([str(run), "--precision", "fp32", "--no-progress", "--calibrate", "none"]) == 0
    best = load_checkpoint(run / "best.pt")
    model = model_from_meta(best.meta)
    model.load_state_dict(best.model)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    got = ort.InferenceSession(str(run / "export" / "model.onnx")).run(None, {"images": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)

    # INT8 keeps the whole transformer head in float: no activation produced inside the head is quantized
    import onnx

    from export.quantize import _head_namespace_nodes, load_fp32_model, quantize_int8

    fp32, _ = load_fp32_model(run / "export" / "model.onnx")
    head = set(_head_namespace_nodes(fp32, any_op=True))
    assert len(head) > 50  # the encoder/decoder layers, not only the final classifier
    calibration = np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32)
    quantize_int8(run / "export" / "model.onnx", tmp_path / "q.onnx", calibration)
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    producer = {o: n.name for n in quantized.graph.node for o in n.output}
    quantized_in_head = [n.name for n in quantized.graph.node
                         if n.op_type == "QuantizeLinear" and producer.get(n.input[0]) in head]
    assert not quantized_in_head


def test_head_and_linear_init_usage_errors(builtin_cache: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    base = [*FAST, "--runs-dir", str(tmp_path)]
    assert main([*base, "--method", "lac", "--head", "linear", "--name", "a"]) == 2
    assert "needs --head lem" in capsys.readouterr().err
    assert main([*base, "--method", "lac", "--linear-init", "1", "--name", "b"]) == 2
    assert "cannot use --linear-init" in capsys.readouterr().err


def test_any_method_trains_with_the_lem_head(builtin_cache: Path, tmp_path: Path, narrow_lem_head: None) -> None:
    assert main([*FAST, "--method", "an", "--head", "lem", "--epochs", "1", "--runs-dir", str(tmp_path),
                 "--name", "an-lem"]) == 0
    best = load_checkpoint(tmp_path / "an-lem" / "best.pt")
    assert best.meta.head["kind"] == "lem" and model_from_meta(best.meta).head_kind == "lem"
