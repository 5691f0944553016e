"""Composer algorithms: one folder each, a pure function plus a thin ``Algorithm``.

Each name is imported on first use (PEP 562), so ``HardNegativeMining`` loads neither the embedding table
nor the augmentation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

_MODULES = {
    "composer_dynsample.algorithms.augmentation": "BatchAugmentation random_affine",
    "composer_dynsample.algorithms.embedding_table": "EmbeddingTable class_centroids",
    "composer_dynsample.algorithms.hard_negative_mining": "HardNegativeMining",
    "composer_dynsample.mining.memory": "CrossBatchMemory",
}

__all__ = [
    "BatchAugmentation",
    "CrossBatchMemory",
    "EmbeddingTable",
    "HardNegativeMining",
    "class_centroids",
    "random_affine",
]

if TYPE_CHECKING:
    from composer_dynsample.algorithms.augmentation import BatchAugmentation, random_affine
    from composer_dynsample.algorithms.embedding_table import EmbeddingTable, class_centroids
    from composer_dynsample.algorithms.hard_negative_mining import HardNegativeMining
    from composer_dynsample.mining.memory import CrossBatchMemory

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
