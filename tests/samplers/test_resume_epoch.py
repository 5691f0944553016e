"""DistributedBatchSampler.resume_epoch: the rest of an epoch, shared by a new number of ranks."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from composer_dynsample import PKBatchSampler, TwoStreamBatchSampler
from tests.samplers.helpers import all_ranks

LABELS = torch.arange(192) % 8  # 16 global PK batches of 4 x 3 per epoch


def _pk(world: int, drop_last: bool = True) -> list[PKBatchSampler]:
    return all_ranks(
        lambda rank: PKBatchSampler(LABELS, 4, 3, num_replicas=world, rank=rank, seed=5, drop_last=drop_last),
        world,
    )


def _resumed(samplers: list, epoch: int, done: int, skip: int) -> list[list[list[int]]]:
    for sampler in samplers:
        sampler.set_epoch(epoch)
        sampler.resume_epoch(epoch, done, skip)
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_remaining_global_batches_are_shared_by_the_new_ranks(world):
    samplers = _pk(world)
    remaining = samplers[0].global_batches(1)[5:].tolist()
    yielded = _resumed(samplers, epoch=1, done=5, skip=7)
    for rank, batches in enumerate(yielded):
        assert len(batches) == len(samplers[rank]) == 7 + 11 // world
        assert all(len(batch) == 1 for batch in batches[:7])  # placeholders, discarded by the trainer
        assert batches[7:] == remaining[rank : (11 // world) * world : world]


def test_drop_last_false_pads_the_remainder_from_the_start_of_the_epoch():
    samplers = _pk(2, drop_last=False)
    batches = samplers[0].global_batches(1).tolist()
    yielded = _resumed(samplers, epoch=1, done=7, skip=3)
    trained = Counter(tuple(batch) for rank in yielded for batch in rank[3:])
    assert trained == Counter(tuple(batch) for batch in batches[7:] + batches[:1])


def test_other_epochs_are_the_normal_ones():
    sampler = _pk(2)[1]
    normal = {epoch: sampler.rank_batches(epoch).tolist() for epoch in (0, 2)}
    _resumed([sampler], epoch=1, done=4, skip=2)
    for epoch in (0, 2):  # Composer spins through the earlier epochs, and goes on after the resumed one
        sampler.set_epoch(epoch)
        assert list(sampler) == normal[epoch] and len(sampler) == 8
    sampler.set_epoch(1)
    assert len(sampler) == 2 + 6


def test_two_stream_batches_resume_too():
    samplers = all_ranks(
        lambda rank: TwoStreamBatchSampler(
            range(120), range(120, 192), 10, 2, num_replicas=2, rank=rank, seed=3
        ),
        2,
    )
    batches = samplers[0].global_batches(0).tolist()
    yielded = _resumed(samplers, epoch=0, done=1, skip=1)
    assert Counter(tuple(b) for rank in yielded for b in rank[1:]) == Counter(tuple(b) for b in batches[1:11])


def test_resume_epoch_checks_its_arguments():
    with pytest.raises(ValueError, match="global_batches_done"):
        _pk(1)[0].resume_epoch(1, -1, 0)
    with pytest.raises(ValueError, match=r"batches_to_skip must be an integer >= 0, got 1\.5"):
        _pk(1)[0].resume_epoch(1, 0, 1.5)
