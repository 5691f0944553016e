"""Distributed-aware batch samplers whose order is a pure function of (seed, epoch, rank).

Each is a :class:`torch.utils.data.DistributedSampler` that yields lists of indices, so Composer accepts
it as a ``batch_sampler`` on many ranks and sets its epoch itself; :class:`~composer_dynsample.callbacks.SetSamplerEpoch`
does the same for any sampler with ``set_epoch`` and on resume.
"""

from composer_dynsample.samplers.base import DistributedBatchSampler, SupportsSetEpoch
from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader, build_dataloader
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from composer_dynsample.samplers.mixed import MixedBatchSampler
from composer_dynsample.samplers.neighbours import NeighbourBatchSampler
from composer_dynsample.samplers.pk import PKBatchSampler
from composer_dynsample.samplers.two_stream import TwoStreamBatchSampler

__all__ = [
    "BatchSamplerDataLoader",
    "DistributedBatchSampler",
    "HardClassPKBatchSampler",
    "MinedNegativesPKBatchSampler",
    "MixedBatchSampler",
    "NeighbourBatchSampler",
    "PKBatchSampler",
    "SupportsSetEpoch",
    "TwoStreamBatchSampler",
    "build_dataloader",
]
