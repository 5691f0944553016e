"""composer-dynsample: model-aware sampling for metric learning with MosaicML Composer.

The public names are re-exported here:

- samplers: :class:`PKBatchSampler`, :class:`TwoStreamBatchSampler`, :class:`DistributedBatchSampler`,
  :func:`build_dataloader`;
- callbacks: :class:`SetSamplerEpoch`.
"""

from composer_dynsample.callbacks import SetSamplerEpoch, find_epoch_target
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
    "DistributedBatchSampler",
    "PKBatchSampler",
    "SetSamplerEpoch",
    "SupportsSetEpoch",
    "TwoStreamBatchSampler",
    "build_dataloader",
    "find_epoch_target",
]
