"""pairwise_distance against the definitions, and its input checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample.distances import DISTANCES, RankMatrix, check_distance, pairwise_distance
from tests.mining import ref_distance


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    dim=st.integers(1, 8),
    scale=st.sampled_from([1e-2, 1.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
    distance=st.sampled_from(DISTANCES),
)
def test_pairwise_distance_matches_definition(n, m, dim, scale, seed, distance) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = scale * torch.randn(n, dim, generator=gen), scale * torch.randn(m, dim, generator=gen)
    got = pairwise_distance(x, y, distance)
    want = ref_distance(x, y, distance)
    assert got.shape == (n, m) and got.dtype == torch.float32
    assert bool((got >= 0).all())
    # The Gram-matrix formula loses about sqrt(eps) * ||x|| on small Euclidean distances.
    atol = {"cosine": 1e-5, "squared_euclidean": 1e-5 * scale**2 * dim, "euclidean": 1e-3 * scale}[distance]
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=atol)


def test_self_distances_are_zero_and_symmetric() -> None:
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, -2.0]])
    for distance in DISTANCES:
        d = pairwise_distance(x, x, distance)
        assert torch.equal(d.diagonal(), torch.zeros(3)), distance
        assert torch.allclose(d, d.T)
    assert torch.allclose(pairwise_distance(x, x, "euclidean")[0, 1], torch.tensor(20.0).sqrt())
    assert torch.allclose(pairwise_distance(x, x, "cosine")[0, 2], torch.tensor(1.8))


def test_rank_matrix_cosine_is_negated_similarity_bit_for_bit() -> None:
    """The shifted cosine matrix is exactly -(x_n @ y_n.T), what similarity-based code computes."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 16, generator=gen), torch.randn(40, 16, generator=gen)
    ranks = RankMatrix(x, y, "cosine")
    xn, yn = torch.nn.functional.normalize(x, dim=1), torch.nn.functional.normalize(y, dim=1)
    assert ranks.offset == 1.0
    assert torch.equal(ranks.rows(0, 50), -(xn @ yn.T))


def test_fp16_overflow_falls_back_to_float32() -> None:
    """Squared norms of finite fp16 embeddings can overflow 65504; the result must stay finite."""
    x = torch.tensor([[300.0, 0.0], [0.0, 300.0], [290.0, 10.0]], dtype=torch.float16)
    d = pairwise_distance(x, x, "squared_euclidean")
    assert d.dtype == torch.float32 and bool(torch.isfinite(d).all())
    assert torch.allclose(d, ref_distance(x.float(), x.float(), "squared_euclidean").float(), rtol=1e-4)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (
            (torch.randn(3), torch.randn(2, 3)),
            r"x must be a 2-D floating-point tensor .*got a tensor of shape \(3,\)",
        ),
        (
            (torch.randn(3, 2), torch.ones(2, 2, dtype=torch.int64)),
            r"y must be a 2-D floating-point tensor .*torch.int64",
        ),
        ((torch.randn(3, 2), torch.randn(2, 3)), r"same feature dimension, got 2 and 3"),
        ((torch.randn(3, 2), torch.randn(2, 2), "l1"), r"distance must be one of .*got 'l1'"),
    ],
)
def test_pairwise_distance_rejects_bad_input(args, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        pairwise_distance(*args)


def test_check_distance() -> None:
    assert check_distance("cosine") == "cosine"
    with pytest.raises(ValueError, match=r"distance must be one of .*got None"):
        check_distance(None)
