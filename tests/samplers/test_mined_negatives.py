"""``MinedNegativesPKBatchSampler`` and ``corpus_candidates``: brute force, guards, layout, ranks, snapshot."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_dynsample import PKBatchSampler
from composer_dynsample.samplers.mined_negatives import (
    CorpusCandidates,
    MinedNegativesPKBatchSampler,
    corpus_candidates,
)
from tests.common import IndexRecorder
from tests.samplers.helpers import (
    SETTINGS,
    all_ranks_or_none,
    check_guards,
    pairs_data,
    reference,
    sampler_for,
)

HAS_FAISS = importlib.util.find_spec("faiss") is not None


# ------------------------------------------------------------------------------------- the search
def assert_same(ours: CorpusCandidates, expected: CorpusCandidates) -> None:
    for name in ("ranked", "kept", "dropped", "searched"):
        assert np.array_equal(getattr(ours, name), getattr(expected, name)), name
    # The similarities: float64 of one summation order against Python's; NaN where no positive is known.
    assert np.allclose(ours.similarity, expected.similarity, rtol=0, atol=1e-12), "similarity"
    searched = expected.searched & np.isfinite(expected.positive)
    assert np.allclose(ours.positive[searched], expected.positive[searched], rtol=0, atol=1e-12)


SEARCHES = ["exact", "faiss", "faiss_ivf"] if HAS_FAISS else ["exact"]


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize(
    ("skip_top", "window", "margin", "duplicates", "chunk_size"),
    [(0, 3, None, False, None), (2, 4, 0.95, True, 7), (1, 6, 0.5, True, 1), (3, 2, None, True, None)],
)
@pytest.mark.parametrize("gap", [None, 0.0, 0.2])
def test_corpus_candidates_equal_brute_force(search, skip_top, window, margin, duplicates, chunk_size, gap):
    # 30 passages: faiss's IVF has one cell below 78, so it is exhaustive and must agree too.
    labels, is_passage, texts, embeddings = pairs_data(30, 1, duplicates=duplicates)
    embeddings[5] = embeddings[9]  # equal similarities: ties in row order
    options = {"skip_top": skip_top, "max_relative_similarity": margin, "duplicate_ids": texts}
    ours = corpus_candidates(
        embeddings, labels, is_passage, window, chunk_size=chunk_size, search=search, absolute_margin=gap,
        **options,
    )  # fmt: skip
    expected = reference(embeddings, labels, is_passage, window, skip_top, margin, texts, gap=gap)
    assert_same(ours, expected)


@pytest.mark.skipif(not HAS_FAISS, reason="faiss is not installed")
def test_faiss_flat_searches_a_short_last_chunk_by_matrix_product(monkeypatch):
    # faiss's flat index compares query by query below distance_compute_blas_threshold query values
    # (1000 queries at D = 128): 12 times slower at 1,000,000 passages. A last chunk of 300 is padded.
    import faiss

    from composer_dynsample.samplers import _corpus_search

    calls, real = [], _corpus_search._faiss_index

    def spied(search, fast):
        index = real(search, fast)

        class Spy:
            def search(self, queries, k):
                calls.append(queries.shape[0])
                return index.search(queries, k)

        return Spy()

    monkeypatch.setattr(_corpus_search, "_faiss_index", spied)
    labels, is_passage, texts, embeddings = pairs_data(1324, 0, dim=128)
    options = {"skip_top": 1, "max_relative_similarity": 0.95, "duplicate_ids": texts}
    found = corpus_candidates(embeddings, labels, is_passage, 3, search="faiss", **options)
    fewest = -(-faiss.cvar.distance_compute_blas_threshold // 128)
    assert calls == [1024, max(300, fewest)]
    assert_same(found, corpus_candidates(embeddings, labels, is_passage, 3, **options))


def test_rows_without_an_embedding_are_no_candidate_and_get_none():
    labels, is_passage, _, embeddings = pairs_data(20, 2)
    embeddings[3] = float("nan")
    embeddings[4] = 0.0
    valid = torch.ones(40, dtype=torch.bool)
    valid[7] = False
    for margin in (None, 0.9):
        ours = corpus_candidates(
            embeddings, labels, is_passage, 3, max_relative_similarity=margin, valid=valid
        )
        assert_same(ours, reference(embeddings, labels, is_passage, 3, 0, margin, None, valid))
        assert not set(ours.ranked.ravel().tolist()) & {3, 4, 7}
        assert not ours.searched.all() and not ours.kept[~ours.searched].any()


def test_a_subset_of_pairs_is_searched_alike():
    labels, is_passage, texts, embeddings = pairs_data(25, 3, duplicates=True)
    options = {"skip_top": 1, "max_relative_similarity": 0.9, "duplicate_ids": texts}
    every = corpus_candidates(embeddings, labels, is_passage, 4, **options)
    some = np.array([7, 0, 19])
    part = corpus_candidates(embeddings, labels, is_passage, 4, pairs=some, **options)
    for name in CorpusCandidates._fields:
        assert np.array_equal(getattr(part, name), getattr(every, name)[some])


def test_each_guard_drops_what_it_names():
    # Pair 0: anchor along x, positive at 0.9 similarity. Pair 1's passage is closer than the positive
    # (margin), pair 2's has the anchor's text (duplicate), pair 3 asks the anchor's query (same_query),
    # pair 4's passage is far and kept.
    x = [[1.0, 0.0], [0.9, 0.436], [0.0, 1.0], [1.0, 0.05], [0.0, 1.0], [0.99, 0.1]]
    x += [[1.0, 0.0], [0.98, 0.2], [0.0, 1.0], [0.5, 0.866]]
    labels = np.repeat(np.arange(5), 2)
    is_passage = np.tile([False, True], 5)
    texts = np.array([100, 101, 102, 103, 104, 100, 100, 107, 108, 109])
    found = corpus_candidates(
        torch.tensor(x), labels, is_passage, 4, max_relative_similarity=0.95, duplicate_ids=texts
    )
    assert found.ranked[0].tolist() == [3, 5, 7, 9]
    assert found.kept[0].tolist() == [False, False, False, True]
    assert found.dropped[0].tolist() == [0, 1, 1, 1]  # rank_window, duplicate, same_query, margin


def test_bad_pairs_name_the_label():
    with pytest.raises(ValueError, match=r"exactly 2 rows.*label 1 has 3"):
        corpus_candidates(torch.randn(5, 2), [0, 0, 1, 1, 1], [False, True, False, True, True], 1)
    with pytest.raises(ValueError, match="label 1 has 2 passages"):
        corpus_candidates(torch.randn(4, 2), [0, 0, 1, 1], [False, True, True, True], 1)


# ------------------------------------------------------------------------------------ the sampler
@st.composite
def setups(draw):
    p, n = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    skip_top, window = draw(st.integers(0, 2)), n + draw(st.integers(0, 3))
    num_pairs = draw(st.integers(p * (2 + n) + skip_top + window + 4, 60))
    return {
        "p": p,
        "n": n,
        "num_pairs": num_pairs,
        "world": draw(st.integers(1, 8)),
        "seed": draw(st.integers(0, 2**16)),
        "duplicates": draw(st.booleans()),
        "snapshot": draw(st.sampled_from(["none", "full", "partial"])),
        "options": {
            "skip_top": skip_top,
            "window": window,
            "max_relative_similarity": draw(st.sampled_from([None, 0.95, 0.3])),
            "absolute_margin": draw(st.sampled_from([None, 0.0, 0.1])),
            "sampling": draw(st.sampled_from(["uniform", "softmax", "simans"])),
            "drop_last": draw(st.booleans()),
        },
    }


def build_world(setup):
    labels, is_passage, texts, embeddings = pairs_data(
        setup["num_pairs"], setup["seed"], duplicates=setup["duplicates"]
    )
    valid = None
    if setup["snapshot"] == "partial":  # rows the table has not written yet
        valid = torch.from_numpy(np.random.default_rng(setup["seed"]).random(len(labels)) > 0.3)

    def build(rank):
        sampler = sampler_for(
            labels,
            is_passage,
            texts,
            setup["p"],
            setup["n"],
            num_replicas=setup["world"],
            rank=rank,
            seed=setup["seed"],
            **setup["options"],
        )
        if setup["snapshot"] != "none":
            sampler.update_neighbours(embeddings, valid)
        return sampler

    return (labels, is_passage, texts, embeddings, valid), build


@SETTINGS
@given(setups(), st.integers(1, 3))
def test_batches_on_any_world_keep_pk_and_every_guard(setup, epoch):
    data, build = build_world(setup)
    labels, is_passage, texts, embeddings, valid = data
    samplers = all_ranks_or_none(build, setup["world"])
    if samplers is None:
        return  # too few batches for the ranks, or too few passages for the batch
    p, n, world = setup["p"], setup["n"], setup["world"]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    # Lengths, sizes, and the pairs exactly as PKBatchSampler's with K = 2, shard by shard.
    assert len({len(s) for s in samplers}) == 1
    shards = [np.asarray(list(s)) for s in samplers]
    assert all(shard.shape == (len(samplers[0]), p * (2 + n)) for shard in shards)
    for rank, shard in enumerate(shards):
        pk = PKBatchSampler(
            labels,
            p,
            2,
            num_replicas=world,
            rank=rank,
            seed=setup["seed"],
            drop_last=setup["options"]["drop_last"],
        )
        pk.set_epoch(epoch)
        assert np.array_equal(shard[:, : 2 * p], np.asarray(list(pk)))
    if setup["options"]["drop_last"]:
        pair_rows = np.concatenate([shard[:, : 2 * p].ravel() for shard in shards])
        assert np.unique(pair_rows).size == pair_rows.size  # disjoint shards
    batches = samplers[0].global_batches(epoch)
    expected = None
    if setup["snapshot"] != "none":
        expected = reference(
            embeddings,
            labels,
            is_passage,
            setup["options"]["window"],
            setup["options"]["skip_top"],
            setup["options"]["max_relative_similarity"],
            texts,
            valid,
            gap=setup["options"]["absolute_margin"],
        )
    check_guards(batches, labels, is_passage, texts, p, n, expected)
    # A pure function of (seed, epoch, snapshot).
    again = build(0)
    again.set_epoch(epoch)
    assert np.array_equal(again.global_batches(epoch), batches)


@pytest.mark.parametrize("snapshot", [False, True])
def test_slots_that_random_draws_cannot_fill_are_filled_by_listing_the_allowed_passages(
    monkeypatch, snapshot
):
    from composer_dynsample.samplers import _negative_plan

    monkeypatch.setattr(_negative_plan, "_DRAWS_BEFORE_SCAN", 1)  # every rejected draw lists instead
    labels, is_passage, texts, embeddings = pairs_data(30, 4, duplicates=True)
    sampler = sampler_for(labels, is_passage, texts, 2, 3, skip_top=2, window=4, max_relative_similarity=0.5)
    if snapshot:
        sampler.update_neighbours(embeddings)
    sampler.set_epoch(1)
    expected = reference(embeddings, labels, is_passage, 4, 2, 0.5, texts) if snapshot else None
    assert sampler.guard_counts()["random"] > 0
    check_guards(sampler.global_batches(1), labels, is_passage, texts, 2, 3, expected)


def test_negatives_vary_across_epochs_and_window_equal_to_n_takes_the_hardest():
    labels, is_passage, texts, embeddings = pairs_data(60, 5)
    wide = sampler_for(labels, is_passage, texts, 4, 2, window=8, max_relative_similarity=None)
    hardest = sampler_for(labels, is_passage, texts, 4, 2, max_relative_similarity=None)
    for sampler in (wide, hardest):
        sampler.update_neighbours(embeddings)
    expected = reference(embeddings, labels, is_passage, 2, 0, None, texts)
    hardest.set_epoch(1)
    pair_of = np.searchsorted(np.unique(labels), labels)
    mined = 0
    for batch in hardest.global_batches(1):
        anchors = batch[:8][~is_passage[batch[:8]]]
        for anchor, own in zip(anchors, batch[8:].reshape(4, 2)):
            top = expected.ranked[pair_of[anchor]]
            mined += len(set(own.tolist()) & set(top.tolist()))
    assert mined >= 0.8 * hardest.num_global_batches * 8  # the two nearest, unless already in the batch
    wide.set_epoch(1)
    first = wide.global_batches(1)[:, 8:]
    wide.set_epoch(2)
    assert not np.array_equal(np.sort(first.ravel()), np.sort(wide.global_batches(2)[:, 8:].ravel()))


def test_without_a_snapshot_every_negative_is_random_and_counted():
    labels, is_passage, texts, _ = pairs_data(40, 6)
    sampler = sampler_for(labels, is_passage, texts, 4, 2)
    counts = sampler.guard_counts(0)
    slots = sampler.num_global_batches * 4
    assert counts["no_embedding"] == slots and counts["random"] == 2 * slots
    assert counts["in_batch"] == counts["margin"] == counts["rank_window"] == 0
    check_guards(sampler.global_batches(0), labels, is_passage, texts, 4, 2, None)


def test_guard_counts_match_the_snapshot_over_the_epochs_anchors():
    labels, is_passage, texts, embeddings = pairs_data(50, 7, duplicates=True)
    sampler = sampler_for(labels, is_passage, texts, 4, 2, skip_top=1, window=5, max_relative_similarity=0.6)
    sampler.update_neighbours(embeddings)
    sampler.set_epoch(1)
    expected = reference(embeddings, labels, is_passage, 5, 1, 0.6, texts)
    batches = sampler.global_batches(1)
    pair_of = np.searchsorted(np.unique(labels), labels)
    anchors = [row for batch in batches for row in batch[:8] if not is_passage[row]]
    counts = sampler.guard_counts()
    sums = expected.dropped[pair_of[anchors]].sum(axis=0).tolist()
    assert [counts[name] for name in ("rank_window", "duplicate", "same_query", "margin")] == sums
    assert sampler.last_skipped == dict(
        zip(("rank_window", "duplicate", "same_query", "margin"), expected.dropped.sum(axis=0).tolist())
    )
    mined = sum(
        len(set(own.tolist()) & set(expected.ranked[pair_of[a]][expected.kept[pair_of[a]]].tolist()))
        for batch in batches
        for a, own in zip(batch[:8][~is_passage[batch[:8]]], batch[8:].reshape(4, 2))
    )
    assert counts["random"] == batches.shape[0] * 8 - mined > 0


def test_the_snapshot_applies_from_the_next_epoch_and_survives_a_checkpoint():
    labels, is_passage, texts, embeddings = pairs_data(40, 8)
    sampler = sampler_for(labels, is_passage, texts, 4, 2, window=4)
    sampler.set_epoch(1)
    before = sampler.global_batches(1).copy()
    prints = sampler.fingerprints(1)
    sampler.update_neighbours(embeddings)
    assert np.array_equal(sampler.global_batches(1), before) and sampler.snapshot_fingerprint() == ""
    sampler.set_epoch(1)
    assert not np.array_equal(sampler.global_batches(1), before)
    assert sampler.fingerprints(1)["plan"] != prints["plan"] and sampler.snapshot_fingerprint() != ""
    restored = sampler_for(labels, is_passage, texts, 4, 2, window=4)
    restored.load_state_dict(sampler.state_dict())
    assert restored.snapshot_fingerprint() == sampler.snapshot_fingerprint()
    assert list(restored) == list(sampler)


def test_options_and_plan_cover_the_new_settings():
    labels, is_passage, texts, embeddings = pairs_data(40, 9)
    base = sampler_for(labels, is_passage, texts, 4, 2, window=4)
    options = base.options()
    assert options["type"] == "composer_dynsample.samplers.mined_negatives.MinedNegativesPKBatchSampler"
    assert {k: options[k] for k in ("pairs_per_batch", "negatives_per_anchor", "skip_top", "window")} == {
        "pairs_per_batch": 4,
        "negatives_per_anchor": 2,
        "skip_top": 0,
        "window": 4,
    }
    assert (options["max_relative_similarity"], options["search"]) == (0.95, "exact")
    for change in ({"window": 5}, {"skip_top": 1}, {"max_relative_similarity": 0.9}):
        other = sampler_for(labels, is_passage, texts, 4, 2, **{"window": 4, **change})
        for s in (base, other):
            s.update_neighbours(embeddings)
            s.set_epoch(1)
        ours, theirs = base.fingerprints(1), other.fingerprints(1)
        assert ours["options"] != theirs["options"] and ours["labels"] == theirs["labels"], change
    moved = sampler_for(labels, ~is_passage, texts, 4, 2, window=4)  # anchors and passages swapped
    assert moved.fingerprints(0)["labels"] != base.fingerprints(0)["labels"]
    untexted = sampler_for(labels, is_passage, None, 4, 2, window=4)
    assert untexted.fingerprints(0)["labels"] != base.fingerprints(0)["labels"]


def test_from_store_reads_a_pairs_store(tmp_path):
    from composer_dynsample.data.text.pairs import load_pairs
    from tests.data.text.helpers import write_pairs

    splits = load_pairs(
        write_pairs(tmp_path / "pairs.jsonl", 40),
        test_fraction=0.2,
        vocab_size=64,
        cache_dir=tmp_path / "cache",
    )
    store = splits.train
    sampler = MinedNegativesPKBatchSampler.from_store(store, 4, 1)
    assert np.array_equal(sampler.is_passage, ~store.is_query[: len(store)])
    assert np.array_equal(sampler.duplicate_ids, store.text_group[: len(store)])
    batch = next(iter(sampler))
    assert not store.is_query[batch[8:]].any() and len(batch) == 12


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 1}, "window must be an integer >= 2, got 1"),
        ({"negatives_per_anchor": 0}, "negatives_per_anchor must be an integer >= 1, got 0"),
        ({"pairs_per_batch": 1}, "pairs_per_batch must be an integer >= 2, got 1"),
        (
            {"negatives_per_anchor": 12},
            r"needs at least 40 passages of distinct texts, and the pairs hold 20",
        ),
        ({"is_passage": np.ones(40, dtype=np.int64)}, "is_passage must hold booleans, got dtype int64"),
        (
            {"is_passage": np.ones(39, dtype=bool)},
            r"is_passage must have one entry per row of labels \(40,\)",
        ),
        ({"duplicate_ids": np.zeros(40)}, "duplicate_ids must hold integers, got dtype float64"),
        (
            {"duplicate_ids": np.zeros(39, dtype=np.int64)},
            r"duplicate_ids must have one entry per row of labels \(40,\), got shape \(39,\)",
        ),
        ({"labels": torch.zeros(40)}, r"labels must hold integers, got a tensor of dtype torch\.float32"),
        ({"labels": []}, r"labels must be a non-empty 1-D sequence, got shape \(0,\)"),
        ({"max_relative_similarity": 0}, "max_relative_similarity must be a number > 0"),
        ({"search": "hnsw"}, "search must be one of"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    labels, is_passage, _, _ = pairs_data(20, 0)
    arguments = {"labels": labels, "pairs_per_batch": 2, "negatives_per_anchor": 2, "is_passage": is_passage}
    with pytest.raises(ValueError, match=match):
        MinedNegativesPKBatchSampler(**{**arguments, **kwargs})


def test_embeddings_of_another_size_are_refused():
    labels, is_passage, texts, _ = pairs_data(20, 0)
    sampler = sampler_for(labels, is_passage, texts, 2, 1)
    with pytest.raises(
        ValueError, match=r"embeddings must be \(40, dim\), one row per sample, got \(39, 4\)"
    ):
        sampler.update_neighbours(torch.randn(39, 4))


# -------------------------------------------------------------------------- through the Trainer
def make_run(**kwargs):
    """48 pairs of 6-dimensional features around 8 topics; 4 pairs x (2 + 2 negatives): 12 batches an epoch."""
    from composer import Trainer

    from composer_dynsample import EmbeddingModel, HardNegativeMining, SetSamplerEpoch, build_dataloader
    from composer_dynsample.algorithms.embedding_table import EmbeddingTable
    from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

    gen = torch.Generator().manual_seed(0)
    pairs = (torch.randn(8, 6, generator=gen) * 2)[torch.arange(48) % 8] + torch.randn(48, 6, generator=gen)
    data = TensorStore(
        pairs.repeat_interleave(2, 0) + 0.3 * torch.randn(96, 6, generator=gen), torch.arange(96) // 2
    )
    sampler = MinedNegativesPKBatchSampler(
        data.labels, 4, 2, is_passage=torch.arange(96) % 2 == 1, window=4, seed=3
    )
    torch.manual_seed(0)
    model = EmbeddingModel(torch.nn.Linear(6, 4))
    recorder = IndexRecorder()
    trainer = Trainer(
        model=model,
        train_dataloader=build_dataloader(IndexDataset(data.labels), sampler, collate_fn=GatherCollate(data)),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=[HardNegativeMining("semi_hard"), EmbeddingTable()],
        callbacks=[recorder, SetSamplerEpoch()],
        max_duration="3ep",
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    return trainer, sampler, recorder


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_table_drives_the_sampler_and_a_mid_epoch_resume_trains_the_same_batches(tmp_path):
    trainer, sampler, full = make_run(save_folder=str(tmp_path / "ck"), save_interval="6ba")
    trainer.fit()
    trainer.close()
    assert sampler.snapshot_fingerprint() != "" and sampler.guard_counts()["no_embedding"] == 0
    assert all(len(batch) == 16 for batch in full.in_order()) and len(full.in_order()) == 36
    # Batch 18 is epoch 1, batch 6: that epoch's candidate lists come back from the checkpoint.
    resumed_trainer, resumed_sampler, resumed = make_run(load_path=str(tmp_path / "ck" / "ep1-ba18-rank0.pt"))
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[18:]
    assert resumed_sampler.snapshot_fingerprint() == sampler.snapshot_fingerprint()
