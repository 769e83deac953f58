"""``--train-crop AREA``: training images as torchvision's random resized crops (then the flip), off by default, wired
into the run's training set, and refused where training reads cached features of whole images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.preprocess import EvalTransform, TrainTransform
from train.config import TrainConfig, validate
from train.trainer import Trainer


def _image() -> torch.Tensor:
    """A 40 x 60 uint8 image with a horizontal and a vertical ramp (every crop of it looks different)."""
    y, x = torch.meshgrid(torch.arange(40), torch.arange(60), indexing="ij")
    return torch.stack([x * 4, y * 6, (x + y) * 2]).to(torch.uint8)


def test_crops_replace_the_resize_and_the_flip_stays() -> None:
    evaluate = EvalTransform(32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear")
    whole, image = evaluate(_image()), _image()
    plain = TrainTransform.like(evaluate)
    torch.manual_seed(0)
    views = [plain(image) for _ in range(12)]
    assert all(torch.equal(v, whole) or torch.equal(v, whole.flip(-1)) for v in views)  # default: resize + flip
    assert any(torch.equal(v, whole) for v in views) and any(torch.equal(v, whole.flip(-1)) for v in views)
    cropped = TrainTransform.like(evaluate)
    cropped.min_area = 0.3
    torch.manual_seed(0)
    views = [cropped(image) for _ in range(12)]
    assert all(v.shape == (3, 32, 32) and v.dtype == torch.float32 for v in views)
    assert not any(torch.allclose(v, whole) or torch.allclose(v, whole.flip(-1)) for v in views)
    assert len({tuple(v.flatten()[:64].tolist()) for v in views}) == 12  # a new crop each time
    torch.manual_seed(0)
    assert torch.equal(torch.stack([cropped(image) for _ in range(12)]), torch.stack(views))  # seeded


def test_the_run_trains_on_crops_and_bad_settings_are_refused(squares_csv: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(data=f"csv:{squares_csv}", arch="resnet18", weights="none", image_size=32, workers=0,
                      progress=False, runs_dir=str(tmp_path), train_crop=0.4, epochs=1)  # type: ignore[call-arg]
    run = Trainer(cfg).run
    assert run.train.loader.dataset.transform.min_area == 0.4
    for bad, message in ((TrainConfig(train_crop=0.0), "--train-crop must be in (0, 1]"),
                         (TrainConfig(train_crop=1.5), "--train-crop must be in (0, 1]"),
                         (TrainConfig(train_crop=0.5, trainable="head"), "cached features of whole images"),
                         (TrainConfig(train_crop=0.5, trainable="top"), "cached features of whole images")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
            validate(bad)
