"""fp16 / bf16 inputs: same result as fp32 on well-separated inputs, never inf/NaN or errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    SemiHardMiner,
)
from tests.mining import DISTANCE_NAMES, check_index_tuple, ref_distance

# Two classes of three unit vectors in 3-D, found by random search so that, for every distance, all
# distances in a row differ by >= 0.05, and so do d(a,p) + 0.1 vs d(a,n) (epsilon 0.1) and, by >= 0.04,
# d(a,n) - d(a,p) vs the margins below: far more than bf16 rounding (~0.01).
SEPARATED = torch.tensor(
    [
        [0.0805, -0.5436, 0.8355],
        [-0.7068, -0.0299, -0.7068],
        [0.2098, 0.1898, 0.9591],
        [-0.169, -0.9743, -0.1491],
        [-0.01, -0.882, 0.4711],
        [0.2106, -0.9124, -0.3509],
    ]
)
SEPARATED_LABELS = torch.tensor([0, 0, 0, 1, 1, 1])
# Margins that make some triplets semi-hard on SEPARATED.
MARGINS = {"cosine": 0.6, "euclidean": 0.622, "squared_euclidean": 1.19}

MINERS = {
    "batch_hard": lambda *a, **k: BatchHardMiner(**k)(*a),
    "hard_topk": lambda *a, **k: HardTopKMiner(k=2, **k)(*a),
    "semi_hard_hardest": lambda *a, **k: SemiHardMiner(margin=MARGINS[k["distance"]], **k)(*a),
    "semi_hard_none": lambda *a, **k: SemiHardMiner(margin=MARGINS[k["distance"]], fallback="none", **k)(*a),
    "semi_hard_hardest_negative": lambda *a, **k: SemiHardMiner(
        margin=MARGINS[k["distance"]], fallback="hardest_negative", **k
    )(*a),
    "multi_similarity": lambda *a, **k: MultiSimilarityMiner(epsilon=0.1, **k)(*a),
}


def test_fixture_is_well_separated() -> None:
    """Guards the premise of the tests below."""
    labels = SEPARATED_LABELS.tolist()
    for distance in DISTANCE_NAMES:
        d = ref_distance(SEPARATED, SEPARATED, distance)
        for a in range(6):
            others = [j for j in range(6) if j != a]
            vals = sorted(float(d[a, j]) for j in others)
            assert min(y - x for x, y in itertools.pairwise(vals)) >= 0.05
            for p in (j for j in others if labels[j] == labels[a]):
                for n in (j for j in others if labels[j] != labels[a]):
                    assert abs(float(d[a, p]) + 0.1 - float(d[a, n])) >= 0.05
                    assert abs(float(d[a, n] - d[a, p]) - MARGINS[distance]) >= 0.04


@pytest.mark.parametrize("name", sorted(MINERS))
@pytest.mark.parametrize("distance", DISTANCE_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_fp32(name: str, distance: str, dtype: torch.dtype) -> None:
    miner = MINERS[name]
    want = miner(SEPARATED, SEPARATED_LABELS, distance=distance)
    assert want[0].numel() > 0
    got = miner(SEPARATED.to(dtype), SEPARATED_LABELS, distance=distance)
    check_index_tuple(got, len(want))
    assert [t.tolist() for t in got] == [t.tolist() for t in want]
    # Also against a distinct pool in half precision (self-pairs allowed there).
    pool = SEPARATED.flip(0)
    pool_labels = SEPARATED_LABELS.flip(0)
    want = miner(SEPARATED, SEPARATED_LABELS, pool, pool_labels, distance=distance)
    got = miner(SEPARATED.to(dtype), SEPARATED_LABELS, pool.to(dtype), pool_labels, distance=distance)
    assert [t.tolist() for t in got] == [t.tolist() for t in want]


@pytest.mark.parametrize("name", sorted(MINERS))
@pytest.mark.parametrize("distance", DISTANCE_NAMES)
def test_fp16_large_norms_do_not_overflow(name: str, distance: str) -> None:
    """Norms of 300 overflow fp16 squared norms (> 65504): the miner falls back to float32 internally."""
    big = SEPARATED * 300.0
    want = MINERS[name](big, SEPARATED_LABELS, distance=distance)
    got = MINERS[name](big.half(), SEPARATED_LABELS, distance=distance)
    assert [t.tolist() for t in got] == [t.tolist() for t in want]


@pytest.mark.parametrize("name", sorted(MINERS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_random_batches_give_valid_indices(name: str, dtype: torch.dtype) -> None:
    """Random batches (ties likely in half precision): valid in-range indices, no error."""
    gen = torch.Generator().manual_seed(5)
    emb = torch.randn(40, 8, generator=gen).to(dtype)
    labels = torch.randint(0, 5, (40,), generator=gen)
    for distance in DISTANCE_NAMES:
        out = MINERS[name](emb, labels, distance=distance)
        check_index_tuple(out, 4 if name == "multi_similarity" else 3)
        anchors, others = (
            (out[0], out[1:]) if len(out) == 3 else (torch.cat([out[0], out[2]]), (out[1], out[3]))
        )
        assert anchors.numel() > 0 and int(anchors.max()) < 40
        assert all(int(t.max()) < 40 and int(t.min()) >= 0 for t in others)
        if len(out) == 3:
            a, p, n = out
            assert bool((labels[p] == labels[a]).all() & (p != a).all() & (labels[n] != labels[a]).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_distance_weighted_half_precision_uses_float32_weights(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(32, 8, generator=gen), dim=1).to(dtype)
    labels = torch.arange(32) % 4
    got = DistanceWeightedMiner(generator=torch.Generator().manual_seed(1))(emb, labels)
    want = DistanceWeightedMiner(generator=torch.Generator().manual_seed(1))(emb.float(), labels)
    check_index_tuple(got, 3)
    assert got[0].numel() == 32 * 7
    assert [t.tolist() for t in got] == [t.tolist() for t in want]
