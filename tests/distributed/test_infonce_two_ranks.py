"""Cross-rank InfoNCE on 2 real processes over gloo: DDP's gradient is one process's on the whole batch."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

from composer_dynsample import InfoNCELoss
from composer_dynsample.distributed import all_gather_embeddings
from composer_dynsample.mining import BatchHardMiner, build_miner
from tests.distributed._helpers import (
    INFONCE_CASES,
    gradient_setup,
    parametrize_strategy_and_loss,
    random_batch,
)

pytestmark = pytest.mark.world_size(2)

CASES = [
    *INFONCE_CASES,
    ("batch_hard", InfoNCELoss(0.5, symmetric=True, distance="squared_euclidean")),
]


def _gradients(strategy, loss, splits, memory_rows):
    """The encoder's gradient from one process on the whole batch and from 2 ranks after DDP's average."""
    setup = gradient_setup(memory_rows)
    rank, world, encoder, embed = setup.rank, setup.world, setup.encoder, setup.embed
    features, labels = random_batch()

    def with_memory(pool, pool_labels):
        return torch.cat([pool, setup.memory]), torch.cat([pool_labels, setup.memory_labels])

    # One process, the whole batch (and the memory) as the pool.
    full = embed(features)
    pool, pool_labels = with_memory(full, labels) if memory_rows else (None, None)
    tuples = build_miner(strategy)(full.detach(), labels, None if pool is None else pool.detach(), pool_labels,
                                   self_offset=None if pool is None else 0)  # fmt: skip
    loss(full, labels, tuples, pool, pool_labels).backward()
    expected = encoder.weight.grad.clone()
    encoder.zero_grad()

    # Two ranks, their share of the batch each, the pool gathered with gradients, then DDP's average.
    start, stop = sum(splits[:rank]), sum(splits[: rank + 1])
    local, local_labels = embed(features[start:stop]), labels[start:stop]
    pool, pool_labels, offset = all_gather_embeddings(local, local_labels, with_grad=True)
    assert offset == start
    pool, pool_labels = with_memory(pool, pool_labels)
    tuples = build_miner(strategy)(
        local.detach(), local_labels, pool.detach(), pool_labels, self_offset=offset
    )
    loss(local, local_labels, tuples, pool, pool_labels, global_mean=True).backward()
    grad = encoder.weight.grad.clone()
    torch.distributed.all_reduce(grad)
    return grad / world, expected


@parametrize_strategy_and_loss(CASES)
@pytest.mark.parametrize("memory_rows", [0, 12])
def test_cross_rank_gradients_equal_one_process_on_the_concatenated_batch(strategy, loss, memory_rows):
    grad, expected = _gradients(strategy, loss, (16, 16), memory_rows)
    assert torch.allclose(grad, expected, atol=1e-6), (grad - expected).abs().max()
    assert expected.abs().sum() > 0  # the comparison is not between two zeros


@pytest.mark.parametrize("symmetric", [False, True])
def test_uneven_batches_give_the_same_gradient(symmetric):
    grad, expected = _gradients("semi_hard", InfoNCELoss(0.1, symmetric=symmetric), (10, 22), 0)
    assert torch.allclose(grad, expected, atol=1e-6), (grad - expected).abs().max()


def test_a_rank_without_positive_pairs_still_joins_the_gather():
    # Rank 1's labels match nothing in the pool: it has no positive pair, but its symmetric loss still
    # takes part in the gather (and in the backward's all-reduce) that rank 0 needs: no hang.
    dist.initialize_dist("cpu")
    rank = dist.get_global_rank()
    local = torch.nn.functional.normalize(
        torch.randn(4, 3, generator=torch.Generator().manual_seed(rank)), dim=1
    )
    local.requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1]) if rank == 0 else torch.tensor([7, 8, 9, 10])
    pool, pool_labels, offset = all_gather_embeddings(local, labels, with_grad=True)
    tuples = BatchHardMiner()(local.detach(), labels, pool.detach(), pool_labels, self_offset=offset)
    assert (tuples[0].numel() > 0) == (rank == 0)
    value = InfoNCELoss(symmetric=True)(local, labels, tuples, pool, pool_labels, global_mean=True)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(local.grad).all()
    # Rank 1's rows are rank 0's negatives, in both directions: they receive a gradient all the same.
    assert local.grad.abs().sum() > 0
