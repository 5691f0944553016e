"""Distributed-aware batch samplers whose order is a pure function of (seed, epoch, rank).

Each is a :class:`torch.utils.data.DistributedSampler` that yields lists of indices, so Composer accepts
it as a ``batch_sampler`` on many ranks and sets its epoch itself; :class:`~composer_dynsample.callbacks.SetSamplerEpoch`
does the same for any sampler with ``set_epoch`` and on resume. Each name is imported on first use (PEP 562):
``PKBatchSampler`` does not load the model-aware samplers and their corpus search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

_MODULES = {
    "composer_dynsample.samplers.base": "DistributedBatchSampler SupportsSetEpoch",
    "composer_dynsample.samplers.dataloader": "BatchSamplerDataLoader build_dataloader",
    "composer_dynsample.samplers.hard_class": "HardClassPKBatchSampler",
    "composer_dynsample.samplers.mined_negatives": "MinedNegativesPKBatchSampler",
    "composer_dynsample.samplers.mixed": "MixedBatchSampler",
    "composer_dynsample.samplers.neighbours": "NeighbourBatchSampler",
    "composer_dynsample.samplers.pk": "PKBatchSampler",
    "composer_dynsample.samplers.two_stream": "TwoStreamBatchSampler",
}

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

if TYPE_CHECKING:
    from composer_dynsample.samplers.base import DistributedBatchSampler, SupportsSetEpoch
    from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader, build_dataloader
    from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
    from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
    from composer_dynsample.samplers.mixed import MixedBatchSampler
    from composer_dynsample.samplers.neighbours import NeighbourBatchSampler
    from composer_dynsample.samplers.pk import PKBatchSampler
    from composer_dynsample.samplers.two_stream import TwoStreamBatchSampler

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
