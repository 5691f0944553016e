"""forward_chunk_size with cross-rank mining and the memory on 2 real processes over gloo."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

from tests.models.helpers import fit_with_chunks

pytestmark = pytest.mark.world_size(2)


@pytest.mark.parametrize(
    ("strategy", "memory_size"), [("semi_hard", 0), ("multi_similarity", 48), ("batch_hard", 48)]
)
def test_chunked_cross_rank_training_matches_the_unchunked_run(strategy, memory_size):
    dist.initialize_dist("cpu")
    expected = fit_with_chunks(None, strategy, memory_size, cross_rank=True, gather="autograd")
    params = fit_with_chunks(5, strategy, memory_size, cross_rank=True, gather="autograd")
    for param, want in zip(params, expected):
        torch.testing.assert_close(param, want)
    # DDP kept the ranks in step.
    gathered = dist.all_gather_object([p.tolist() for p in params])
    assert gathered[0] == gathered[1]
