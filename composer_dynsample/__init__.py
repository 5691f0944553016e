"""composer-dynsample: model-aware sampling for metric learning with MosaicML Composer.

The public names are re-exported here:

- samplers: :class:`PKBatchSampler`, :class:`TwoStreamBatchSampler`, :class:`DistributedBatchSampler`,
  :func:`build_dataloader`;
- callbacks: :class:`SetSamplerEpoch`;
- mining: :class:`HardNegativeMining` (the Composer algorithm), :class:`CrossBatchMemory`,
  :class:`MinedBatch` (what the loss receives), the miners in :mod:`composer_dynsample.mining`;
- models and losses: :class:`EmbeddingModel`, :class:`Conv1dEncoder`, :class:`MLPEncoder`,
  :class:`TripletMarginLoss`, :class:`ContrastiveLoss`, :class:`MultiSimilarityLoss`;
- evaluation: :class:`RetrievalGallery` (the train-set gallery for retrieval metrics, in
  :mod:`composer_dynsample.metrics`); data loading in :mod:`composer_dynsample.data`; the YAML builders
  in :mod:`composer_dynsample.config` behind ``composer-dynsample train``.
"""

from composer_dynsample.algorithms import CrossBatchMemory, HardNegativeMining, mine
from composer_dynsample.callbacks import RetrievalGallery, SetSamplerEpoch, find_epoch_target
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

__version__ = "0.1.0"

__all__ = [
    "BatchSamplerDataLoader",
    "ContrastiveLoss",
    "Conv1dEncoder",
    "CrossBatchMemory",
    "DistributedBatchSampler",
    "EmbeddingModel",
    "HardNegativeMining",
    "MLPEncoder",
    "MinedBatch",
    "MultiSimilarityLoss",
    "PKBatchSampler",
    "RetrievalGallery",
    "SetSamplerEpoch",
    "SupportsSetEpoch",
    "TripletMarginLoss",
    "TwoStreamBatchSampler",
    "build_dataloader",
    "find_epoch_target",
    "mine",
]
