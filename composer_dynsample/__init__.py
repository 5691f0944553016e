"""composer-dynsample: model-aware sampling for metric learning with MosaicML Composer.

The public names are re-exported here and imported on first use (PEP 562), so ``import
composer_dynsample`` (and ``composer-dynsample --help``) does not pay for importing Composer and torch:

- samplers: :class:`PKBatchSampler`, :class:`TwoStreamBatchSampler`, :class:`DistributedBatchSampler`,
  :func:`build_dataloader`;
- callbacks: :class:`SetSamplerEpoch`;
- mining: :class:`HardNegativeMining` (the Composer algorithm), :class:`CrossBatchMemory`,
  :class:`MinedBatch` (what the loss receives), the miners in :mod:`composer_dynsample.mining`;
- models and losses: :class:`EmbeddingModel`, :class:`Conv1dEncoder`, :class:`MLPEncoder`,
  :class:`TripletMarginLoss`, :class:`ContrastiveLoss`, :class:`MultiSimilarityLoss`;
- data: :class:`IndexDataset`, :class:`GatherCollate`, :class:`TensorStore` (index-only datasets and the
  batched collate), loaders in :mod:`composer_dynsample.data`;
- evaluation: :class:`RetrievalGallery` (the train-set gallery for retrieval metrics, in
  :mod:`composer_dynsample.metrics`); the YAML builders in :mod:`composer_dynsample.config` behind
  ``composer-dynsample train``.

Example:
    >>> import composer_dynsample
    >>> composer_dynsample.PKBatchSampler.__name__
    'PKBatchSampler'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "BatchSamplerDataLoader": "composer_dynsample.samplers.dataloader",
    "ContrastiveLoss": "composer_dynsample.losses",
    "Conv1dEncoder": "composer_dynsample.models",
    "CrossBatchMemory": "composer_dynsample.algorithms",
    "DistributedBatchSampler": "composer_dynsample.samplers",
    "EmbeddingModel": "composer_dynsample.models",
    "EmbeddingTable": "composer_dynsample.algorithms",
    "GatherCollate": "composer_dynsample.data",
    "HardNegativeMining": "composer_dynsample.algorithms",
    "IndexDataset": "composer_dynsample.data",
    "MLPEncoder": "composer_dynsample.models",
    "MinedBatch": "composer_dynsample.mined",
    "MultiSimilarityLoss": "composer_dynsample.losses",
    "PKBatchSampler": "composer_dynsample.samplers",
    "RetrievalGallery": "composer_dynsample.callbacks",
    "SetSamplerEpoch": "composer_dynsample.callbacks",
    "SupportsSetEpoch": "composer_dynsample.samplers",
    "TensorStore": "composer_dynsample.data",
    "TripletMarginLoss": "composer_dynsample.losses",
    "TwoStreamBatchSampler": "composer_dynsample.samplers",
    "build_dataloader": "composer_dynsample.samplers.dataloader",
    "find_epoch_target": "composer_dynsample.callbacks",
    "mine": "composer_dynsample.algorithms",
}

__all__ = [
    "BatchSamplerDataLoader",
    "ContrastiveLoss",
    "Conv1dEncoder",
    "CrossBatchMemory",
    "DistributedBatchSampler",
    "EmbeddingModel",
    "EmbeddingTable",
    "GatherCollate",
    "HardNegativeMining",
    "IndexDataset",
    "MLPEncoder",
    "MinedBatch",
    "MultiSimilarityLoss",
    "PKBatchSampler",
    "RetrievalGallery",
    "SetSamplerEpoch",
    "SupportsSetEpoch",
    "TensorStore",
    "TripletMarginLoss",
    "TwoStreamBatchSampler",
    "build_dataloader",
    "find_epoch_target",
    "mine",
]

if TYPE_CHECKING:
    from composer_dynsample.algorithms import CrossBatchMemory, EmbeddingTable, HardNegativeMining, mine
    from composer_dynsample.callbacks import RetrievalGallery, SetSamplerEpoch, find_epoch_target
    from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
    from composer_dynsample.losses import ContrastiveLoss, MultiSimilarityLoss, TripletMarginLoss
    from composer_dynsample.mined import MinedBatch
    from composer_dynsample.models import Conv1dEncoder, EmbeddingModel, MLPEncoder
    from composer_dynsample.samplers import (
        DistributedBatchSampler,
        PKBatchSampler,
        SupportsSetEpoch,
        TwoStreamBatchSampler,
    )
    from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader, build_dataloader


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'composer_dynsample' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
