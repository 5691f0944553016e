"""MixedBatchSampler with sources whose samplers draw from the embedding table: mined negatives, nearest rows
and hard classes fed through the mix, each from its own source's rows only, each building the batches it
builds fed by a table of its source alone, and resumed mid-epoch, also on another number of ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample import EmbeddingTable, PKBatchSampler
from composer_dynsample.samplers import (
    HardClassPKBatchSampler,
    MinedNegativesPKBatchSampler,
    NeighbourBatchSampler,
)
from composer_dynsample.samplers.mixed import MixedBatchSampler

SIZES = {"pk": 16, "pairs": 48, "classes": 32, "near": 24}
PAIRS = np.arange(48) // 2  # rows 2k and 2k + 1 are pair k: an anchor and its passage
PASSAGES = np.arange(48) % 2 == 1
CLASSES = np.arange(32) % 8
NEAR = np.arange(24) % 6
OFFSETS = dict(zip(SIZES, np.cumsum([0, *SIZES.values()])[:-1].tolist(), strict=True))
FED = ("pairs", "classes", "near")


def _alone(name: str):
    """Source ``name``'s sampler, over its own rows ``0 .. n - 1``."""
    if name == "pk":
        return PKBatchSampler(np.arange(16) // 2, 4, 2, seed=1)
    if name == "pairs":
        return MinedNegativesPKBatchSampler(
            PAIRS, 4, 2, is_passage=PASSAGES, window=6, max_relative_similarity=None, seed=2
        )
    if name == "classes":
        return HardClassPKBatchSampler(CLASSES, 2, 2, hard_fraction=0.5, seed=3)
    return NeighbourBatchSampler(NEAR, seeds_per_batch=2, negatives_per_seed=2, seed=4)


def _mixed(**options: object) -> MixedBatchSampler:
    samplers = {name: _alone(name) for name in SIZES}
    return MixedBatchSampler(samplers, list(SIZES.values()), labels={"classes": CLASSES}, seed=0, **options)


def _table(rows: int, seed: int = 0) -> EmbeddingTable:
    """A table of ``rows`` random rows, every seventh never written."""
    embeddings = torch.randn(rows, 8, generator=torch.Generator().manual_seed(seed))
    table = EmbeddingTable(num_items=rows)
    written = torch.arange(rows)[torch.arange(rows) % 7 != 3]
    table.write(written, embeddings[written], step=5)
    return table


def _feed(sampler, table: EmbeddingTable) -> None:
    """What ``EmbeddingTable`` hands the train sampler at an epoch start (its ``_feed_sampler``)."""
    if callable(getattr(sampler, "update_neighbours", None)):
        sampler.update_neighbours(table.rows.float(), table.written_at >= 0)
    else:  # the classes here are 0 .. C - 1: the labels are their own positions
        sampler.update_class_embeddings(*table.centroids(torch.from_numpy(CLASSES), 8))


def _own_table(table: EmbeddingTable, name: str) -> EmbeddingTable:
    """A table of source ``name`` alone: its rows of the mix's table, as they were written."""
    start, size = OFFSETS[name], SIZES[name]
    own = EmbeddingTable(num_items=size)
    written = torch.nonzero(table.written_at[start : start + size] >= 0).flatten()
    own.write(written, table.rows[start + written], step=5)
    return own


def _source_of(index: int) -> str:
    return next(name for name in SIZES if OFFSETS[name] <= index < OFFSETS[name] + SIZES[name])


def test_each_table_fed_source_builds_from_its_own_rows_the_batches_it_builds_alone():
    mix = _mixed(weights=[1, 3, 1, 1])  # the pairs source gives two of its epochs an epoch of the mix
    assert mix.batch_counts["pairs"] > _alone("pairs").num_global_batches
    table = _table(mix.num_indices)
    before = mix.global_batches(0)
    _feed(mix, table)
    assert np.array_equal(mix.global_batches(0), before)  # a snapshot applies from the next set_epoch
    mix.set_epoch(1)
    assert mix.snapshot_fingerprint() != ""
    for position, name in enumerate(SIZES):
        alone = _alone(name)
        rounds = -(-mix.batch_counts[name] // alone.num_global_batches)

        def epoch_of_mix(epoch: int, alone=alone, rounds=rounds) -> np.ndarray:
            return np.concatenate([alone.global_batches(epoch * rounds + t) for t in range(rounds)])

        unfed = epoch_of_mix(2)
        if name in FED:
            _feed(alone, _own_table(table, name))
        alone.set_epoch(rounds)
        for epoch in (1, 2):
            expected = epoch_of_mix(epoch)[: mix.batch_counts[name]] + OFFSETS[name]
            assert np.array_equal(mix.source_batches(position, epoch), expected), (name, epoch)
        assert np.array_equal(epoch_of_mix(2), unfed) == (name not in FED)  # the snapshot changed them
    for batch in mix:  # brute force: every row of a batch, mined negatives and hard classes too, one source
        assert len({_source_of(index) for index in batch}) == 1, batch
        if _source_of(batch[0]) == "pairs":
            negatives = np.asarray(batch[8:]) - OFFSETS["pairs"]
            assert PASSAGES[negatives].all()  # the source's own passages


def test_a_table_fed_mix_resumed_mid_epoch_on_two_ranks_yields_the_rest_of_the_epoch():
    mix = _mixed()
    _feed(mix, _table(mix.num_indices))
    mix.set_epoch(1)
    full = [list(map(int, batch)) for batch in mix]
    saved = mix.state_dict()  # what the table's checkpoint holds of its sampler
    ranks = [_mixed(num_replicas=2, rank=rank) for rank in (0, 1)]
    for sampler in ranks:
        sampler.load_state_dict(saved)
        sampler.set_epoch(1)
        sampler.resume_epoch(1, global_batches_done=5, batches_to_skip=0)
        assert sampler.snapshot_fingerprint() == mix.snapshot_fingerprint()
    resumed = [list(map(int, b)) for pair in zip(*ranks, strict=True) for b in pair]
    assert resumed == full[5 : 5 + len(resumed)] and len(resumed) == 2 * ((len(full) - 5) // 2)
    fresh = _mixed()
    fresh.set_epoch(1)
    assert [list(map(int, b)) for b in fresh] != full  # without the saved snapshots: other batches


def test_what_a_mix_cannot_feed_is_refused_naming_the_source():
    refreshing = MinedNegativesPKBatchSampler(PAIRS, 4, 2, is_passage=PASSAGES, refresh_every=2)
    with pytest.raises(ValueError, match=r"source 'pairs': MinedNegativesPKBatchSampler\(refresh_every"):
        MixedBatchSampler({"pairs": refreshing}, [48])
    with pytest.raises(ValueError, match=r"source 'classes': .*pass labels=\{'classes'"):
        MixedBatchSampler({"classes": _alone("classes")}, [32])
    with pytest.raises(ValueError, match="are not the labels its sampler was built from"):
        MixedBatchSampler({"classes": _alone("classes")}, [32], labels={"classes": CLASSES + 1})
    with pytest.raises(ValueError, match=r"embeddings must be \(120, dim\), one row per index of the mix"):
        _mixed().update_neighbours(torch.zeros(48, 8))
