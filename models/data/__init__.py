"""Datasets: the built-in procedural dataset, loaders for CSV / VOC / COCO / CUB / NUS-WIDE, and the SPML protocol."""

from models.data.types import DataError, DatasetSplits, LabelledImages

__all__ = ["DataError", "DatasetSplits", "LabelledImages"]
