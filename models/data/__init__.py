"""Datasets: loaders for CSV / folder / VOC / COCO / CUB / NUS-WIDE / formatted, the registry of dataset kinds, the
SPML protocol, and the read side of built datasets (their builders are :mod:`models.sources`)."""

from models.data.types import DataError, DatasetSplits, LabelledImages

__all__ = ["DataError", "DatasetSplits", "LabelledImages"]
