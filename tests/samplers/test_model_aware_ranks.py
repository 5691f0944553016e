"""Both model-aware samplers on simulated worlds of 1 to 8 ranks: layout, lengths, shards, determinism, coverage."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
from composer_dynsample.samplers.neighbours import NeighbourBatchSampler
from tests.samplers.helpers import all_ranks_or_none, assert_disjoint_across_ranks

SETTINGS = settings(max_examples=30, deadline=None)


def on_any_world(**strategies):
    """30 examples of a world of 1 to 8 ranks and a seed in 0..5, with ``strategies`` for the rest."""
    return lambda test: SETTINGS(given(world=st.integers(1, 8), seed=st.integers(0, 5), **strategies)(test))


def snapshot(num_classes: int, seed: int) -> torch.Tensor:
    return torch.randn(num_classes, 3, generator=torch.Generator().manual_seed(seed))


@on_any_world(
    per_class=st.lists(st.integers(3, 12), min_size=4, max_size=16),
    p=st.integers(2, 4),
    k=st.integers(1, 3),
    hard_fraction=st.sampled_from([0.25, 0.5, 0.75]),
)
def test_hard_class_batches_on_any_world(per_class, p, k, world, hard_fraction, seed):
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
    centroids = snapshot(len(per_class), seed)

    def build(rank):
        sampler = HardClassPKBatchSampler(
            labels,
            p,
            k,
            hard_fraction=hard_fraction,
            num_replicas=world,
            rank=rank,
            seed=seed,
            require_positive_pairs=False,  # K = 1 too
        )
        sampler.update_class_embeddings(centroids)
        return sampler

    samplers = all_ranks_or_none(build, world)
    if samplers is None:
        return  # P x K or the world cannot be satisfied: PKBatchSampler's own error
    for epoch in (1, 2):
        assert_disjoint_across_ranks(samplers, epoch)  # also activates the snapshot
        assert len({len(s) for s in samplers}) == 1 and all(len(list(s)) == len(s) for s in samplers)
        for sampler in samplers:
            for batch in sampler:
                classes = labels[batch].view(p, k)
                assert bool((classes == classes[:, :1]).all()) and len(set(classes[:, 0].tolist())) == p
    # Coverage as under P x K: every class with two chunks or more appears in the epoch; the epoch's
    # chunk count is cut to a multiple of P, so fewer than P classes with a single chunk may sit it out.
    chunks = samplers[0]._chunks
    used = set(labels[samplers[0].global_batches(1).reshape(-1)].tolist())
    missing = {c for c in range(len(per_class)) if chunks[c] > 0} - used
    assert all(chunks[c] == 1 for c in missing) and len(missing) < p
    # A pure function of (seed, epoch, snapshot), with a new order each epoch.
    again = build(0)
    again.set_epoch(1)
    assert np.array_equal(again.global_batches(1), samplers[0].global_batches(1))
    if samplers[0].num_global_batches >= 4:  # a new order each epoch (a tiny epoch may repeat by chance)
        assert not np.array_equal(samplers[0].global_batches(1), samplers[0].global_batches(2))


@on_any_world(
    per_class=st.lists(st.integers(2, 10), min_size=2, max_size=10),
    seeds_per_batch=st.integers(1, 4),
    negatives=st.integers(1, 3),
    with_snapshot=st.booleans(),
)
def test_neighbour_batches_on_any_world(per_class, seeds_per_batch, negatives, world, seed, with_snapshot):
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
    embeddings = torch.randn(len(labels), 4, generator=torch.Generator().manual_seed(seed))

    def build(rank):
        sampler = NeighbourBatchSampler(
            labels, seeds_per_batch, negatives, num_replicas=world, rank=rank, seed=seed, drop_last=True
        )
        if with_snapshot:
            sampler.update_neighbours(embeddings)
        return sampler

    samplers = all_ranks_or_none(build, world)
    if samplers is None:
        return  # fewer global batches than ranks
    group = 2 + negatives
    for epoch in (1, 2):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        assert len({len(s) for s in samplers}) == 1
        rows = [np.asarray(list(s)).reshape(-1, group) for s in samplers]
        seeds = np.concatenate([r[:, 0] for r in rows])
        assert (
            np.unique(seeds).size == seeds.size
        )  # shards of seeds disjoint; each sample a seed at most once
        for r in rows:
            assert bool((labels[r[:, 1]] == labels[r[:, 0]]).all())
            assert bool((labels[r[:, 2:]] != labels[r[:, :1]]).all())
    again = build(0)
    again.set_epoch(2)
    assert list(again) == list(samplers[0])
    if samplers[0].num_global_batches >= 4:
        assert not np.array_equal(samplers[0].global_batches(1), samplers[0].global_batches(2))
