"""composer-dynsample: model-aware sampling for metric learning with MosaicML Composer.

The public names are re-exported here:

- samplers: :class:`PKBatchSampler`, :class:`TwoStreamBatchSampler`, :class:`DistributedBatchSampler`,
  :func:`build_dataloader`;
- callbacks: :class:`SetSamplerEpoch`;
- mining: :class:`HardNegativeMining` (the Composer algorithm), :class:`CrossBatchMemory`,
  :class:`MinedBatch` (what the loss receives), the miners in :mod:`composer_dynsample.mining`;
- models and losses: :class:`EmbeddingModel`, :class:`TripletMarginLoss`, :class:`ContrastiveLoss`,
  :class:`MultiSimilarityLoss`.
"""

from composer_dynsample.algorithms import CrossBatchMemory, HardNegativeMining, mine
from composer_dynsample.callbacks import SetSamplerEpoch, find_epoch_target
from composer_dynsample.losses import ContrastiveLoss, MultiSimilarityLoss, TripletMarginLoss
from composer_dynsample.mined import MinedBatch
from composer_dynsample.models import EmbeddingModel
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
    "CrossBatchMemory",
    "DistributedBatchSampler",
    "EmbeddingModel",
    "HardNegativeMining",
    "MinedBatch",
    "MultiSimilarityLoss",
    "PKBatchSampler",
    "SetSamplerEpoch",
    "SupportsSetEpoch",
    "TripletMarginLoss",
    "TwoStreamBatchSampler",
    "build_dataloader",
    "find_epoch_target",
    "mine",
]
