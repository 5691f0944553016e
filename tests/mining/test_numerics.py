"""Numbers the miners must get right whatever the dtype: half precision and very large norms."""

from __future__ import annotations

import math

import pytest
import torch

from composer_dynsample.distances import distance_matrix, paired_distance, pairwise_distance
from composer_dynsample.mining import BatchHardMiner, HardTopKMiner, MultiSimilarityMiner, SemiHardMiner
from tests.mining import Case, as_rows, check_batch_hard, check_hard_topk, check_semi_hard

HALF = [torch.float16, torch.bfloat16]


def circle(points: int = 16) -> torch.Tensor:
    angles = torch.arange(points, dtype=torch.float64) * (2 * math.pi / points)
    return torch.stack([angles.cos(), angles.sin()], dim=1).float()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_euclidean_does_not_cancel(dtype):
    degree = math.radians(1.0)
    x = torch.tensor([[1.0, 0.0], [math.cos(degree), math.sin(degree)]], dtype=dtype)
    expected = float(torch.dist(x[0].double(), x[1].double()))  # of the rounded inputs
    for value in (pairwise_distance(x, x, "euclidean")[0, 1], distance_matrix(x, x, "euclidean")[0, 1]):
        assert abs(float(value) - expected) < 1e-4, float(value)
    assert abs(float(paired_distance(x[:1], x[1:], "euclidean")[0]) - expected) < 1e-4


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "miner",
    [
        lambda *a: SemiHardMiner(margin=0.1, distance="euclidean")(*a),
        lambda *a: SemiHardMiner(margin=0.1, distance="euclidean", fallback="none")(*a),
        lambda *a: MultiSimilarityMiner(epsilon=0.1, distance="euclidean")(*a),
        lambda *a: BatchHardMiner(distance="euclidean")(*a),
    ],
    ids=["semi_hard", "semi_hard_none", "multi_similarity", "batch_hard"],
)
def test_points_on_a_circle_give_the_fp32_tuples_in_half_precision(dtype, miner):
    points = circle(16).to(dtype)  # the rounded points, so only the distance computation differs
    labels = torch.arange(16) % 2
    half = miner(points, labels)
    full = miner(points.float(), labels)
    assert [t.tolist() for t in half] == [t.tolist() for t in full]


@pytest.mark.parametrize(
    "miner",
    [
        lambda *a: BatchHardMiner(distance="euclidean")(*a),
        lambda *a: HardTopKMiner(k=2, distance="euclidean")(*a),
        lambda *a: SemiHardMiner(margin=0.2e20, distance="euclidean", fallback="none")(*a),
        lambda *a: BatchHardMiner(distance="cosine")(*a),
        lambda *a: MultiSimilarityMiner(epsilon=0.1, distance="cosine")(*a),
    ],
    ids=["batch_hard", "hard_topk", "semi_hard", "batch_hard_cosine", "multi_similarity_cosine"],
)
def test_finite_embeddings_near_1e20_give_the_float64_tuples(miner):
    generator = torch.Generator().manual_seed(0)
    embeddings = (torch.randn(24, 8, generator=generator, dtype=torch.float64) * 1e20).float()
    labels = torch.randint(0, 4, (24,), generator=generator)
    ours = miner(embeddings, labels)
    reference = miner(embeddings.double(), labels)
    assert sum(t.numel() for t in ours) > 0
    assert [sorted(as_rows(ours))] == [sorted(as_rows(reference))]


def test_inputs_too_large_even_for_float64_are_named():
    embeddings = torch.full((4, 2), 1e200, dtype=torch.float64)
    with pytest.raises(ValueError, match="overflow every distance computation"):
        BatchHardMiner()(embeddings, torch.tensor([0, 0, 1, 1]))


@pytest.mark.parametrize("fallback", ["none", "hardest", "hardest_negative"])
def test_embeddings_near_1e20_pass_the_float64_brute_force_checks(fallback):
    """The miners' tuples on float32 embeddings near 1e20 satisfy the float64 definitions (direct differences)."""
    generator = torch.Generator().manual_seed(1)
    case = Case(
        (torch.randn(24, 8, generator=generator) * 1e20), torch.randint(0, 4, (24,), generator=generator)
    )
    check_batch_hard(case, "euclidean", BatchHardMiner(distance="euclidean")(*case.args()))
    check_hard_topk(case, "euclidean", 3, HardTopKMiner(k=3, distance="euclidean")(*case.args()))
    out = SemiHardMiner(margin=0.5e20, distance="euclidean", fallback=fallback)(*case.args())
    check_semi_hard(case, "euclidean", 0.5e20, fallback, out)
    assert out[0].numel() > 0
