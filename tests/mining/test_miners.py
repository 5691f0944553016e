"""Every miner against a brute-force reference (loops over anchors, float64) on hypothesis-drawn inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    SemiHardMiner,
)
from composer_dynsample.mining.semi_hard import SEMI_HARD_FALLBACKS
from tests.mining import (
    DISTANCE_NAMES,
    Case,
    as_rows,
    cases,
    check_batch_hard,
    check_distance_weighted,
    check_hard_topk,
    check_index_tuple,
    check_multi_similarity,
    check_semi_hard,
)

SETTINGS = settings(max_examples=40, deadline=None)
distance_names = st.sampled_from(DISTANCE_NAMES)


@SETTINGS
@given(case=cases(), distance=distance_names)
def test_batch_hard_matches_reference(case: Case, distance: str) -> None:
    check_batch_hard(case, distance, BatchHardMiner(distance=distance)(*case.args(), **case.kwargs()))


@SETTINGS
@given(case=cases(), distance=distance_names, k=st.integers(1, 6))
def test_hard_topk_matches_reference(case: Case, distance: str, k: int) -> None:
    check_hard_topk(case, distance, k, HardTopKMiner(k=k, distance=distance)(*case.args(), **case.kwargs()))


@SETTINGS
@given(
    case=cases(),
    distance=distance_names,
    margin=st.floats(0.0, 2.0),
    fallback=st.sampled_from(SEMI_HARD_FALLBACKS),
)
def test_semi_hard_matches_reference(case: Case, distance: str, margin: float, fallback: str) -> None:
    out = SemiHardMiner(margin=margin, distance=distance, fallback=fallback)(*case.args(), **case.kwargs())
    check_semi_hard(case, distance, margin, fallback, out)


@SETTINGS
@given(case=cases(max_batch=12, max_pool=14), distance=distance_names, margin=st.floats(0.0, 1.0))
def test_semi_hard_with_many_positives_per_anchor(case: Case, distance: str, margin: float) -> None:
    """More positives per anchor than the comparison loop takes (40 or more): the grid path."""
    emb = torch.cat([case.emb, torch.randn(40, case.emb.shape[1])])
    labels = torch.cat([case.labels, torch.zeros(40, dtype=torch.int64)])
    big = Case(emb, labels, case.ref_emb, case.ref_labels)
    if case.self_offset is not None:  # the pool holds the batch: let it hold the larger batch
        start, stop = case.self_offset, case.self_offset + len(case.labels)
        big.ref_emb = torch.cat([case.ref_emb[:start], emb, case.ref_emb[stop:]])
        big.ref_labels = torch.cat([case.ref_labels[:start], labels, case.ref_labels[stop:]])
        big.self_offset = start
    elif case.ref_emb is not None:
        big.ref_emb = torch.cat([case.ref_emb, torch.randn(40, case.emb.shape[1])])
        big.ref_labels = torch.cat([case.ref_labels, torch.zeros(40, dtype=torch.int64)])
    for fallback in SEMI_HARD_FALLBACKS:
        out = SemiHardMiner(margin=margin, distance=distance, fallback=fallback)(*big.args(), **big.kwargs())
        check_semi_hard(big, distance, margin, fallback, out)


@SETTINGS
@given(case=cases(), distance=distance_names, epsilon=st.floats(0.0, 1.0))
def test_multi_similarity_matches_reference(case: Case, distance: str, epsilon: float) -> None:
    check_multi_similarity(
        case,
        distance,
        epsilon,
        MultiSimilarityMiner(epsilon=epsilon, distance=distance)(*case.args(), **case.kwargs()),
    )


@SETTINGS
@given(
    case=cases(), cutoff=st.floats(0.0, 1.0), nonzero_loss_cutoff=st.floats(0.2, 2.5), seed=st.integers(0, 99)
)
def test_distance_weighted_structure(
    case: Case, cutoff: float, nonzero_loss_cutoff: float, seed: int
) -> None:
    out = DistanceWeightedMiner(
        cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff, generator=torch.Generator().manual_seed(seed)
    )(*case.args(), **case.kwargs())
    check_distance_weighted(case, nonzero_loss_cutoff, out)


@SETTINGS
@given(case=cases(with_ref=False, max_dim=4), distance=distance_names)
def test_same_pool_objects_count_as_no_pool(case: Case, distance: str) -> None:
    """Passing the batch itself as pool (same objects) excludes self-pairs, as PML decides by identity."""
    args = (case.emb, case.labels, case.emb, case.labels)
    assert as_rows(BatchHardMiner(distance=distance)(*args)) == as_rows(
        BatchHardMiner(distance=distance)(case.emb, case.labels)
    )
    copied = BatchHardMiner(distance=distance)(case.emb, case.labels, case.emb.clone(), case.labels.clone())
    check_batch_hard(Case(case.emb, case.labels, case.emb.clone(), case.labels.clone()), distance, copied)


MINERS = {
    "batch_hard": lambda *a, **k: BatchHardMiner(**k)(*a),
    "hard_topk": lambda *a, **k: HardTopKMiner(k=3, **k)(*a),
    "semi_hard": lambda *a, **k: SemiHardMiner(**k)(*a),
    "semi_hard_none": lambda *a, **k: SemiHardMiner(fallback="none", **k)(*a),
    "semi_hard_hardest_negative": lambda *a, **k: SemiHardMiner(fallback="hardest_negative", **k)(*a),
    "multi_similarity": lambda *a, **k: MultiSimilarityMiner(**k)(*a),
    "distance_weighted": lambda *a, **k: DistanceWeightedMiner(
        generator=torch.Generator().manual_seed(0), nonzero_loss_cutoff=2.0, **k
    )(*a),
}


@pytest.mark.parametrize("name", sorted(MINERS))
@pytest.mark.parametrize("distance", DISTANCE_NAMES)
@pytest.mark.parametrize("with_ref", [False, True])
def test_chunked_equals_unchunked(
    name: str, distance: str, with_ref: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = torch.Generator().manual_seed(7)
    emb, labels = torch.randn(37, 5, generator=gen), torch.randint(0, 6, (37,), generator=gen)
    ref = (
        (torch.randn(53, 5, generator=gen), torch.randint(0, 7, (53,), generator=gen))
        if with_ref
        else (None, None)
    )
    miner = MINERS[name]
    whole = miner(emb, labels, *ref, distance=distance)
    assert whole[0].numel() > 0
    for chunk_size in (1, 5, 16):
        chunked = miner(emb, labels, *ref, distance=distance, chunk_size=chunk_size)
        assert [t.tolist() for t in chunked] == [t.tolist() for t in whole], chunk_size
    # The automatic bound splits a large pool into chunks too.
    monkeypatch.setattr("composer_dynsample.mining._common.CHUNK_BYTES", 1024)
    auto = miner(emb, labels, *ref, distance=distance)
    assert [t.tolist() for t in auto] == [t.tolist() for t in whole]


EDGE_CASES = {
    "single_sample": (torch.randn(1, 4), torch.tensor([3])),
    "all_same_label": (torch.randn(6, 4), torch.zeros(6, dtype=torch.int64)),
    "all_distinct_labels": (torch.randn(6, 4), torch.arange(6)),
    "empty_batch": (torch.randn(0, 4), torch.zeros(0, dtype=torch.int64)),
}


@pytest.mark.parametrize("name", sorted(MINERS))
@pytest.mark.parametrize("edge", sorted(EDGE_CASES))
def test_degenerate_batches_give_empty_tuples(name: str, edge: str) -> None:
    emb, labels = EDGE_CASES[edge]
    out = MINERS[name](emb, labels)
    check_index_tuple(out, 4 if name == "multi_similarity" else 3)
    assert all(t.shape == (0,) for t in out)


def test_pool_without_shared_labels_or_empty_pool_gives_empty_tuples() -> None:
    emb, labels = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    for name, miner in MINERS.items():
        n = 4 if name == "multi_similarity" else 3
        for ref_emb, ref_labels in (
            (torch.randn(5, 3), torch.full((5,), 9)),
            (torch.randn(0, 3), torch.zeros(0, dtype=torch.int64)),
        ):
            out = miner(emb, labels, ref_emb, ref_labels)
            check_index_tuple(out, n)
            assert all(t.numel() == 0 for t in out), name


def test_anchor_without_negative_in_pool_is_left_out() -> None:
    """Pool entries of the anchor's class only: positives but no negative; the other anchor has both."""
    emb, labels = torch.randn(2, 3), torch.tensor([0, 1])
    ref_emb, ref_labels = torch.randn(3, 3), torch.tensor([0, 0, 0])
    a = BatchHardMiner()(emb, labels, ref_emb, ref_labels)[0]
    assert a.numel() == 0  # anchor 0 has no negative, anchor 1 no positive
    a, _, n = BatchHardMiner()(emb, torch.tensor([0, 0]), ref_emb, torch.tensor([0, 0, 1]))
    assert a.tolist() == [0, 1] and n.tolist() == [2, 2]


@pytest.mark.parametrize("name", sorted(MINERS))
def test_gradients_are_not_tracked_and_inputs_are_untouched(name: str) -> None:
    emb = torch.randn(12, 4, requires_grad=True)
    labels = torch.arange(12) % 3
    before = emb.detach().clone()
    out = MINERS[name](emb, labels)
    assert all(not t.requires_grad and t.grad_fn is None for t in out)
    assert torch.equal(emb.detach(), before)


def test_automatic_chunks_respect_the_working_set_budget() -> None:
    from composer_dynsample.mining._common import CHUNK_BYTES, row_chunks

    chunks = list(row_chunks(1000, 65536, 36, None))
    assert chunks[0] == (0, CHUNK_BYTES // (65536 * 36)) and chunks[-1][1] == 1000
    assert all((stop - start) * 65536 * 36 <= CHUNK_BYTES for start, stop in chunks)
    assert list(row_chunks(5, 3, 4, 2)) == [(0, 2), (2, 4), (4, 5)]
    assert list(row_chunks(4, 10**9, 10**9, None)) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # at least one row


def test_pool_and_statistics_are_exported_beside_the_miners():
    from composer_dynsample import mining
    from composer_dynsample.mining import pool, statistics

    assert (mining.assemble_pool, mining.Pool) == (pool.assemble_pool, pool.Pool)
    assert mining.mining_statistics is statistics.mining_statistics
