"""``MinedNegativesPKBatchSampler``'s offline mode (``max_snapshots``), its confusable-pair batches
(``hard_fraction``) and its config entry ``sampler: {name: mined_negatives}``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_dynsample.samplers import HardClassPKBatchSampler
from composer_dynsample.samplers.hard_class import pair_centroids as centroids_of_pairs
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from tests.samplers.helpers import (
    SETTINGS,
    all_ranks_or_none,
    check_guards_on_snapshot,
    pairs_data,
    sampler_for,
)


def pair_centroids(embeddings, labels):
    """Each pair's mean unit row, in sorted label order: the brute-force reference."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=1)
    classes = sorted(set(labels.tolist()))
    return torch.stack([unit[torch.from_numpy(labels == c)].mean(dim=0) for c in classes])


# ------------------------------------------------------------------------------------ max_snapshots
def test_max_snapshots_keeps_the_first_snapshot_and_searches_no_more(monkeypatch):
    from composer_dynsample.samplers import mined_negatives

    labels, is_passage, texts, embeddings = pairs_data(40, 1)
    offline = sampler_for(labels, is_passage, texts, 4, 2, window=4, max_snapshots=1)
    online = sampler_for(labels, is_passage, texts, 4, 2, window=4)
    for sampler in (offline, online):
        sampler.update_neighbours(embeddings)
        sampler.set_epoch(1)
    assert np.array_equal(offline.global_batches(1), online.global_batches(1))
    first = offline.snapshot_fingerprint()
    calls = []
    real = mined_negatives.corpus_candidates
    monkeypatch.setattr(
        mined_negatives, "corpus_candidates", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    later = torch.randn(80, 4, generator=torch.Generator().manual_seed(9))
    offline.update_neighbours(later)
    online.update_neighbours(later)
    assert len(calls) == 1 and set(offline.last_skipped.values()) == {0}  # the offline one searched nothing
    for sampler in (offline, online):
        sampler.set_epoch(2)
    assert offline.snapshot_fingerprint() == first != online.snapshot_fingerprint()
    check_guards_on_snapshot(
        offline.global_batches(2),
        labels,
        is_passage,
        texts,
        embeddings,
        4,
        2,
        window=4,
        skip_top=0,
        margin=0.95,
    )
    # A resumed offline sampler still ignores later snapshots.
    resumed = sampler_for(labels, is_passage, texts, 4, 2, window=4, max_snapshots=1)
    resumed.load_state_dict(offline.state_dict())
    resumed.update_neighbours(later)
    resumed.set_epoch(3)
    offline.set_epoch(3)
    assert resumed.snapshot_fingerprint() == first and list(resumed) == list(offline)


def test_max_snapshots_must_be_positive():
    labels, is_passage, texts, _ = pairs_data(20, 0)
    with pytest.raises(ValueError, match="max_snapshots must be an integer >= 1, got 0"):
        sampler_for(labels, is_passage, texts, 2, 1, max_snapshots=0)


# ------------------------------------------------------------------------------------ hard_fraction
def test_confusable_pairs_are_hard_class_batches_over_pair_centroids():
    labels, is_passage, texts, embeddings = pairs_data(48, 2)
    sampler = sampler_for(labels, is_passage, texts, 4, 1, window=4, hard_fraction=0.5, seed=5)
    before = sampler_for(labels, is_passage, texts, 4, 1, window=4, seed=5)
    assert np.array_equal(sampler.global_batches(0), before.global_batches(0))  # no snapshot: P x K
    sampler.update_neighbours(embeddings)
    sampler.set_epoch(1)
    expected = HardClassPKBatchSampler(labels, 4, 2, hard_fraction=0.5, distance="cosine", seed=5)
    expected.update_class_embeddings(pair_centroids(embeddings, labels))
    expected.set_epoch(1)
    batches = sampler.global_batches(1)
    assert np.array_equal(batches[:, :8], expected.global_batches(1))
    check_guards_on_snapshot(
        batches, labels, is_passage, texts, embeddings, 4, 1, window=4, skip_top=0, margin=0.95
    )
    # The centroids are part of the snapshot: fingerprint, checkpoint and resume.
    resumed = sampler_for(labels, is_passage, texts, 4, 1, window=4, hard_fraction=0.5, seed=5)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.snapshot_fingerprint() == sampler.snapshot_fingerprint()
    assert np.array_equal(resumed.global_batches(1), batches)
    plain = sampler_for(labels, is_passage, texts, 4, 1, window=4, seed=5)
    plain.update_neighbours(embeddings)
    plain.set_epoch(1)
    assert plain.snapshot_fingerprint() != sampler.snapshot_fingerprint()


def test_a_pair_without_rows_has_no_centroid():
    labels, is_passage, texts, embeddings = pairs_data(24, 3)
    valid = torch.ones(48, dtype=torch.bool)
    valid[:10] = False
    sampler = sampler_for(labels, is_passage, texts, 2, 1, hard_fraction=0.5)
    centroids, counts = centroids_of_pairs(embeddings, valid, sampler._pair_of, sampler._anchors.size)
    classes = np.unique(labels)
    for k, c in enumerate(classes):
        rows = np.flatnonzero((labels == c) & valid.numpy())
        assert counts[k] == rows.size
        if rows.size:
            unit = torch.nn.functional.normalize(embeddings[rows].float(), dim=1)
            assert torch.allclose(centroids[k], unit.mean(dim=0), atol=1e-6)


@SETTINGS
@given(
    st.integers(1, 8),
    st.integers(0, 2**16),
    st.sampled_from([0.25, 0.5, 0.75]),
    st.booleans(),
    st.integers(1, 3),
)
def test_confusable_pair_batches_on_any_world_keep_every_guarantee(world, seed, fraction, duplicates, epoch):
    labels, is_passage, texts, embeddings = pairs_data(64, seed % 97, duplicates=duplicates)

    def build(rank):
        sampler = MinedNegativesPKBatchSampler(
            labels,
            3,
            2,
            is_passage=is_passage,
            duplicate_ids=texts,
            window=3,
            skip_top=1,
            hard_fraction=fraction,
            num_replicas=world,
            rank=rank,
            seed=seed,
        )
        sampler.update_neighbours(embeddings)
        sampler.set_epoch(epoch)
        return sampler

    samplers = all_ranks_or_none(build, world)
    if samplers is None:
        return
    shards = [np.asarray(list(s)) for s in samplers]
    assert len({shard.shape for shard in shards}) == 1 and shards[0].shape[1] == 3 * 4
    pair_rows = np.concatenate([shard[:, :6].ravel() for shard in shards])
    assert np.unique(pair_rows).size == pair_rows.size  # disjoint shards, each pair at most once
    for shard in shards:
        pairs = shard[:, :6].reshape(-1, 3, 2)
        assert (labels[pairs[:, :, 0]] == labels[pairs[:, :, 1]]).all()  # a pair's two rows together
    check_guards_on_snapshot(
        samplers[0].global_batches(epoch),
        labels,
        is_passage,
        texts,
        embeddings,
        3,
        2,
        window=3,
        skip_top=1,
        margin=0.95,
    )
    assert np.array_equal(build(0).global_batches(epoch), samplers[0].global_batches(epoch))


# ------------------------------------------------------------------------------------ the config entry
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_config_builds_the_sampler_from_the_pairs_store(tmp_path):
    pytest.importorskip("tokenizers")
    from composer_dynsample.config import ConfigError, build_run, load_config
    from composer_dynsample.samplers.wiring import find_epoch_target
    from tests.config.helpers import pairs_config
    from tests.data.text.helpers import write_pairs

    path = write_pairs(tmp_path / "pairs.jsonl", 60)
    sampler_section = {
        "name": "mined_negatives",
        "pairs_per_batch": 4,
        "negatives_per_anchor": 1,
        "window": 3,
    }
    config = pairs_config(
        path, tmp_path / "cache", sampler=sampler_section, algorithms={"embedding_table": {}}
    )
    run = build_run(load_config(config, ["sampler.max_snapshots=1"]), tmp_path / "run")
    store = run.splits.train
    sampler = find_epoch_target(run.trainer.state.train_dataloader)
    assert isinstance(sampler, MinedNegativesPKBatchSampler) and sampler.max_snapshots == 1
    assert np.array_equal(sampler.is_passage, ~store.is_query[: len(store)])
    assert np.array_equal(sampler.duplicate_ids, store.text_group[: len(store)])
    with pytest.raises(ConfigError, match="is_passage"):
        build_run(load_config(config, ["sampler.is_passage=[true]"]), tmp_path / "run2")
