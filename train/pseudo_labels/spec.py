"""What a method asks of the pseudo-label stage; a leaf module (standard library only) the methods can import."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# the kinds of scoring: VLPL's (the whole image) and AEVLP's (the whole image and a grid of crops)
WHOLE_IMAGE, IMAGE_AND_GRID = "whole-image", "image-and-grid"
KINDS = (WHOLE_IMAGE, IMAGE_AND_GRID)

# The scoring settings: a stored file's scores are reused only when these are equal. The others (thresholds,
# top-k, eta, negative ratio) only select pseudo-positives from the scores and are applied again at every load.
SCORING_FIELDS = ("kind", "temperature", "pre_resize", "grid_size")
SELECTION_FIELDS = ("threshold", "top_k", "eta", "negative_ratio")


@dataclass(frozen=True)
class PseudoLabelSpec:
    """The pseudo-labelling of one method: the ``kind`` of scoring (``whole-image`` or ``image-and-grid``), the default
    CLIP model and prompt, the softmax ``temperature`` and the selection settings (docs/methods.md)."""

    kind: str
    clip: str
    prompt: str
    temperature: float
    threshold: float
    pre_resize: int = 0
    grid_size: int = 0
    top_k: int = 0
    eta: float = 0.0
    negative_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"pseudo-label kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.temperature > 0:
            raise ValueError(f"the CLIP softmax temperature must be > 0, got {self.temperature}")
        if "{}" not in self.prompt:
            raise ValueError(f"the prompt template must hold {{}} for the class name, got {self.prompt!r}")
        grid_ok = self.grid_size >= 1 and self.top_k >= 1 and 0 <= self.negative_ratio < 1
        if self.kind == IMAGE_AND_GRID and not grid_ok:
            raise ValueError(f"{IMAGE_AND_GRID} pseudo-labels need grid_size >= 1, top_k >= 1 and "
                             f"0 <= negative_ratio < 1, got {self}")

    def scoring(self) -> dict[str, Any]:
        """The settings that the stored scores depend on."""
        return {key: value for key, value in asdict(self).items() if key in SCORING_FIELDS}

    def selection(self) -> dict[str, Any]:
        """The settings that pick pseudo-positives from the scores."""
        return {key: value for key, value in asdict(self).items() if key in SELECTION_FIELDS}
