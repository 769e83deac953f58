"""Model architectures, checkpoints with metadata, the one image preprocessing used everywhere, the ONNX metadata
schema and atomic file writes.

Layering: ``models`` imports no other package of this project; every other package may import it.
"""

from models.checkpoint import ModelMeta, load_checkpoint, save_checkpoint
from models.resnet import ARCHITECTURES, build_model, model_from_meta

__all__ = ["ARCHITECTURES", "ModelMeta", "build_model", "load_checkpoint", "model_from_meta", "save_checkpoint"]
