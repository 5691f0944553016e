"""Composer algorithms: one folder each, a pure function plus a thin ``Algorithm``."""

from composer_dynsample.algorithms.augmentation import BatchAugmentation, random_affine
from composer_dynsample.algorithms.embedding_table import EmbeddingTable, class_centroids
from composer_dynsample.algorithms.hard_negative_mining import CrossBatchMemory, HardNegativeMining

__all__ = [
    "BatchAugmentation",
    "CrossBatchMemory",
    "EmbeddingTable",
    "HardNegativeMining",
    "class_centroids",
    "random_affine",
]
