"""Datasets: the loaders, the registry of kinds, the SPML protocol and the read side of built datasets."""

from models.data.types import DataError, DatasetSplits, LabelledImages

__all__ = ["DataError", "DatasetSplits", "LabelledImages"]
