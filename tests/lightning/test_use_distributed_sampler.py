"""Lightning's default ``use_distributed_sampler=True`` rebuilds a batch sampler around a DistributedSampler.

The package's batch samplers shard themselves and cannot be rebuilt so: the error says what to do
instead of Python's "unexpected keyword argument 'batch_size'". The 2-rank Trainer run that users see
is in test_two_ranks.py.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from composer_dynsample import (
    HardClassPKBatchSampler,
    NeighbourBatchSampler,
    PKBatchSampler,
    TwoStreamBatchSampler,
)

LABELS = torch.arange(24) % 4


def check_message(error: pytest.ExceptionInfo[TypeError], name: str) -> None:
    message = str(error.value)
    assert message.startswith(f"{name} cannot be rebuilt around a DistributedSampler")
    assert "Pass use_distributed_sampler=False to lightning.pytorch.Trainer" in message
    assert "composer_dynsample.lightning.SetSamplerEpoch()" in message


@pytest.mark.parametrize(
    "cls", [PKBatchSampler, HardClassPKBatchSampler, NeighbourBatchSampler, TwoStreamBatchSampler]
)
def test_rebuilding_a_batch_sampler_around_a_sampler_says_what_to_do(cls):
    # What Lightning does to a batch sampler that has batch_size and drop_last but is no BatchSampler.
    sampler = DistributedSampler(range(24), num_replicas=2, rank=0)
    with pytest.raises(TypeError) as error:
        cls(sampler, batch_size=4, drop_last=True)
    check_message(error, cls.__name__)


def test_lightning_passes_the_message_on_unchanged():
    # The function Lightning's Trainer and Fabric call to inject their DistributedSampler.
    loader = DataLoader(TensorDataset(LABELS), batch_sampler=PKBatchSampler(LABELS, 2, 2))
    with pytest.raises(TypeError) as error:
        _update_dataloader(loader, DistributedSampler(loader.dataset, num_replicas=2, rank=0))
    check_message(error, "PKBatchSampler")


def test_the_samplers_still_copy_and_pickle():
    import copy
    import pickle

    sampler = PKBatchSampler(LABELS, 2, 2, seed=3)
    assert list(copy.deepcopy(sampler)) == list(pickle.loads(pickle.dumps(sampler))) == list(sampler)
