"""A text transformer under DDP on 2 real processes over gloo: cross-rank InfoNCE keeps the ranks in step."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

pytest.importorskip("transformers")

from tests.models.text_helpers import fit_transformer, transformer

pytestmark = pytest.mark.world_size(2)


def _parameters(model) -> list[torch.Tensor]:
    return [param.detach().clone() for param in model.parameters()]


def test_the_ranks_weights_stay_identical_with_cross_rank_infonce():
    dist.initialize_dist("cpu")
    params = _parameters(fit_transformer(cross_rank=True))
    gathered = dist.all_gather_object([param.tolist() for param in params])
    assert gathered[0] == gathered[1]
    # Training moved the weights: the comparison is not between two untouched copies.
    assert not torch.equal(params[-2], transformer(embedding_dim=8).projection.weight)


def test_chunked_cross_rank_training_matches_the_unchunked_run():
    dist.initialize_dist("cpu")
    expected = _parameters(fit_transformer(cross_rank=True, adam=False))
    params = _parameters(fit_transformer(cross_rank=True, chunk=3, adam=False))
    for param, want in zip(params, expected):
        torch.testing.assert_close(param, want)
    assert not torch.equal(expected[-2], transformer(embedding_dim=8).projection.weight)
