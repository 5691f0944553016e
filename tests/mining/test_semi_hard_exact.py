"""semi_hard against a brute-force reference on the very distances it sees, so ties must match exactly.

The references of ``test_miners.py`` (in ``tests/mining/__init__.py``) work in float64 and allow a
tolerance; here the reference reads the float32 matrix :func:`pairwise_distance` returns (the miner's own
distances, computed the same way), so every decision (strictly farther than the positive, inside the
margin, the smallest pool index among equal distances) can be compared for equality. Inputs with many
exact ties (integer coordinates, repeated rows), reference pools, anchors with more positives than the
comparison loop takes (the grid path), half precision and empty results are covered.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample.distances import pairwise_distance
from composer_dynsample.mining import SemiHardMiner, _semi_hard_kernel
from composer_dynsample.mining.semi_hard import SEMI_HARD_FALLBACKS
from tests.mining import DISTANCE_NAMES, as_rows, check_index_tuple

SETTINGS = settings(max_examples=40, deadline=None)


def reference(
    emb: torch.Tensor,
    labels: torch.Tensor,
    ref_emb: torch.Tensor | None,
    ref_labels: torch.Tensor | None,
    margin: float,
    distance: str,
    fallback: str,
) -> list[tuple[int, int, int]]:
    """The triplets semi_hard must return, by loops over anchors and positives on its own distances."""
    pool, pool_labels = (emb, labels) if ref_emb is None else (ref_emb, ref_labels)
    if emb.shape[0] == 0 or pool.shape[0] == 0:
        return []
    if ref_emb is None:
        dist = pairwise_distance(emb, emb, distance)
    else:
        dtype = torch.promote_types(emb.dtype, ref_emb.dtype)
        dist = pairwise_distance(emb.to(dtype), ref_emb.to(dtype), distance)
    triplets = []
    for a in range(emb.shape[0]):
        same = pool_labels == labels[a]
        negatives = (~same).nonzero().flatten().tolist()
        positives = [j for j in same.nonzero().flatten().tolist() if not (ref_emb is None and j == a)]
        row, values = dist[a], dist[a].tolist()  # Python floats hold float32/float64 values exactly
        for p in positives:
            # The nearest negative strictly farther than the positive, the smallest index on ties.
            above = [n for n in negatives if values[n] > values[p]]
            successor = min(above, key=lambda n: (values[n], n)) if above else None
            # The margin is added in the distances' dtype, as the miner adds it.
            semi = successor is not None and bool(row[successor] < row[p] + margin)
            if fallback == "none":
                negative = successor if semi else None
            elif fallback == "hardest" or semi:
                negative = successor
            else:
                negative = min(negatives, key=lambda n: (values[n], n)) if negatives else None
            if negative is not None:
                triplets.append((a, p, negative))
    return triplets


def tied_batch(gen: torch.Generator, batch: int, dim: int, classes: int, levels: int) -> torch.Tensor:
    """Embeddings on a coarse integer grid, with repeated rows: many exactly equal distances."""
    emb = torch.randint(-levels, levels + 1, (batch, dim), generator=gen).float()
    repeats = torch.randint(0, batch, (batch // 4,), generator=gen)
    emb[torch.randint(0, batch, (batch // 4,), generator=gen)] = emb[repeats]
    # The cosine distance of a zero row is defined (its normalised vector is zero) but say nothing of ties.
    return emb + (emb.abs().sum(dim=1, keepdim=True) == 0).float()


@st.composite
def tied_cases(draw, max_batch: int = 40, max_pool: int = 60):
    """Random batches (and pools) with exact ties, few or many positives per anchor, in any dtype."""
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    batch, dim = draw(st.integers(1, max_batch)), draw(st.integers(1, 4))
    classes = draw(st.integers(1, 4))
    levels = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    emb = tied_batch(gen, batch, dim, classes, levels).to(dtype)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    if not draw(st.booleans()):
        return emb, labels, None, None
    pool = draw(st.integers(1, max_pool))
    ref_emb = tied_batch(gen, pool, dim, classes, levels).to(dtype)
    return emb, labels, ref_emb, torch.randint(0, classes + 1, (pool,), generator=gen)


def check(case, margin: float, distance: str, fallback: str) -> None:
    out = SemiHardMiner(margin=margin, distance=distance, fallback=fallback)(*case)
    check_index_tuple(out, 3)
    assert as_rows(out) == reference(*case, margin, distance, fallback)


@SETTINGS
@given(
    case=tied_cases(),
    margin=st.sampled_from([0.0, 0.05, 0.5, 2.0]),
    distance=st.sampled_from(DISTANCE_NAMES),
    fallback=st.sampled_from(SEMI_HARD_FALLBACKS),
    loop_max_width=st.sampled_from([0, 3, 12]),
)
def test_semi_hard_equals_the_reference_on_its_own_distances_with_ties(
    case, margin: float, distance: str, fallback: str, loop_max_width: int
) -> None:
    """Both ways of counting the thresholds below an entry (comparison loop, grid) give the same triplets."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_semi_hard_kernel, "_LOOP_MAX_WIDTH", loop_max_width)
        check(case, margin, distance, fallback)


@pytest.mark.parametrize("distance", DISTANCE_NAMES)
@pytest.mark.parametrize("fallback", SEMI_HARD_FALLBACKS)
def test_many_positives_per_anchor_take_the_grid_and_match(distance: str, fallback: str) -> None:
    """A memory-bank-like pool: 60 to 90 positives per anchor, continuous distances and tied ones."""
    gen = torch.Generator().manual_seed(5)
    emb = torch.nn.functional.normalize(torch.randn(24, 8, generator=gen), dim=1)
    labels = torch.arange(24) % 3
    bank = torch.nn.functional.normalize(torch.randn(240, 8, generator=gen), dim=1)
    bank[::7] = bank[1::7][: bank[::7].shape[0]]  # repeated rows: tied distances and tied thresholds
    pool, pool_labels = (
        torch.cat([emb, bank]),
        torch.cat([labels, torch.randint(0, 3, (240,), generator=gen)]),
    )
    case = (emb, labels, pool, pool_labels)
    assert int((pool_labels[None, :] == labels[:, None]).sum(dim=1).min()) > _semi_hard_kernel._LOOP_MAX_WIDTH
    check(case, 0.1, distance, fallback)


def test_all_thresholds_equal_and_empty_results() -> None:
    """Rows whose positives all lie at one distance (zero span of the grid), no negative, no positive."""
    emb = torch.tensor([[1.0, 0.0]] * 20 + [[0.0, 1.0]] * 20)
    labels = torch.cat([torch.zeros(20, dtype=torch.int64), torch.ones(20, dtype=torch.int64)])
    for fallback in SEMI_HARD_FALLBACKS:
        check((emb, labels, None, None), 0.5, "cosine", fallback)
    assert all(t.numel() == 0 for t in SemiHardMiner()(emb, torch.zeros(40, dtype=torch.int64)))
    assert all(t.numel() == 0 for t in SemiHardMiner()(emb, torch.arange(40)))
