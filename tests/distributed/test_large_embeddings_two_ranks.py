"""A global mean over 2 real ranks when only one rank's distances need float64 (huge embeddings)."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

from composer_dynsample import ContrastiveLoss, TripletMarginLoss

pytestmark = pytest.mark.world_size(2)


@pytest.mark.parametrize(
    "loss", [ContrastiveLoss(0.0, 0.5, distance="euclidean"), TripletMarginLoss(0.2, distance="euclidean")]
)
def test_ranks_in_different_dtypes_agree_on_the_global_mean(loss):
    # Rank 1's distances are float64, rank 0's float32: the count all-reduce must not mix the two.
    dist.initialize_dist("cpu")
    rank = dist.get_global_rank()
    generator = torch.Generator().manual_seed(rank)
    scale = 1e20 if rank == 1 else 1.0
    embeddings = (torch.randn(8, 3, generator=generator, dtype=torch.float64) * scale).float()
    labels = torch.arange(8) % 2
    value = loss(embeddings, labels, global_mean=True)
    # Both ranks have as many tuples, so the global mean's share of each rank is its own mean.
    local = loss(embeddings.double(), labels)
    assert torch.isfinite(value)
    assert value.dtype == (torch.float64 if rank == 1 else torch.float32)
    torch.testing.assert_close(value.double(), local, rtol=1e-5, atol=0.0)
