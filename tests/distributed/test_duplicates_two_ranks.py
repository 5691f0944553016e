"""Duplicate ids across 2 real processes over gloo: they travel with the pool and the memory, and the
masked InfoNCE gradient is still one process's on the concatenated batch."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

from composer_dynsample import HardNegativeMining, InfoNCELoss
from composer_dynsample.mining import assemble_pool, build_miner, drop_duplicate_negatives
from tests.algorithms.helpers import Recorder, reference_duplicates, text_trainer
from tests.distributed._helpers import INFONCE_CASES, gradient_setup, parametrize_strategy_and_loss

pytestmark = pytest.mark.world_size(2)

CASES = INFONCE_CASES


def _data(seed=0, rows=32, dim=5):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, dim, generator=generator)
    labels = torch.randint(0, 5, (rows,), generator=generator)
    ids = torch.randint(0, 12, (rows,), generator=generator)  # few texts: many repeats under other labels
    return features, labels, ids


def _mine_and_loss(loss, strategy, local, labels, ids, pool, offset, *, global_mean):
    """Mine against the pool (or the batch), drop the duplicate negatives and take the masked loss."""
    ref = None if pool is None else pool.embeddings
    ref_labels = None if pool is None else pool.labels
    ref_ids = None if pool is None else pool.duplicate_ids
    tuples = build_miner(strategy)(local.detach(), labels, None if ref is None else ref.detach(), ref_labels,
                                   self_offset=None if ref is None else offset)  # fmt: skip
    tuples, dropped = drop_duplicate_negatives(tuples, labels, ids, ref_labels, ref_ids)
    value = loss(local, labels, tuples, ref, ref_labels, global_mean=global_mean, duplicate_ids=ids,
                 ref_duplicate_ids=ref_ids)  # fmt: skip
    return value, int(dropped)


def _gradients(strategy, loss, splits, memory_rows):
    """The encoder's gradient from one process on the whole batch and from 2 ranks after DDP's average."""
    setup = gradient_setup(memory_rows)
    rank, world, encoder, embed = setup.rank, setup.world, setup.encoder, setup.embed
    features, labels, ids = _data()
    memory_ids = torch.randint(0, 12, (memory_rows,), generator=setup.generator)
    memory_kwargs = {
        "memory_embeddings": setup.memory,
        "memory_labels": setup.memory_labels,
        "memory_duplicate_ids": memory_ids,
    }

    # One process, the whole batch (and the memory) as the pool.
    full = embed(features)
    pool = assemble_pool(full, labels, duplicate_ids=ids, **memory_kwargs) if memory_rows else None
    value, dropped = _mine_and_loss(loss, strategy, full, labels, ids, pool, 0, global_mean=False)
    value.backward()
    expected = encoder.weight.grad.clone()
    encoder.zero_grad()
    assert dropped > 0  # the mask has duplicates to act on

    # Two ranks, their share of the batch each, the pool gathered with gradients and ids, then DDP's average.
    start, stop = sum(splits[:rank]), sum(splits[: rank + 1])
    local = embed(features[start:stop])
    pool = assemble_pool(local, labels[start:stop], cross_rank=True, with_grad=True,
                         duplicate_ids=ids[start:stop], **memory_kwargs)  # fmt: skip
    assert pool.offset == start
    assert pool.duplicate_ids.tolist() == ids.tolist() + memory_ids.tolist()  # rank order, then the memory
    value, _ = _mine_and_loss(
        loss, strategy, local, labels[start:stop], ids[start:stop], pool, pool.offset, global_mean=True
    )
    value.backward()
    grad = encoder.weight.grad.clone()
    torch.distributed.all_reduce(grad)
    return grad / world, expected


@parametrize_strategy_and_loss(CASES)
@pytest.mark.parametrize("memory_rows", [0, 12])
@pytest.mark.parametrize("splits", [(16, 16), (10, 22)], ids=["even", "uneven"])
def test_masked_cross_rank_gradients_equal_one_process_on_the_concatenated_batch(
    strategy, loss, memory_rows, splits
):
    grad, expected = _gradients(strategy, loss, splits, memory_rows)
    assert torch.allclose(grad, expected, atol=1e-6), (grad - expected).abs().max()
    assert expected.abs().sum() > 0


def test_the_trainer_gathers_the_ids_into_the_pool_and_the_memory_on_every_rank():
    recorder = Recorder()
    algorithm = HardNegativeMining(
        "batch_hard", duplicate_key="text_hash", cross_rank=True, gather="autograd", memory_size=24
    )
    text_trainer(algorithm, InfoNCELoss(0.1), callbacks=[recorder], max_duration="5ba").fit()
    local = [batch["text_hash"] for batch in recorder.batches]
    both = dist.all_gather_object(local)
    memories = dist.all_gather_object(algorithm.memory.duplicate_ids)
    assert torch.equal(memories[0], memories[1])  # the memory is identical on every rank, ids included
    global_batches = [torch.cat([first, second]) for first, second in zip(*both)]
    assert memories[0].tolist() == torch.cat(global_batches)[-24:].tolist()
    for step, mined in enumerate(recorder.mined):
        stored = torch.cat(global_batches[:step])[-24:] if step else torch.empty(0, dtype=torch.int64)
        assert mined.ref_duplicate_ids.tolist() == global_batches[step].tolist() + stored.tolist()
        duplicates = reference_duplicates(
            mined.labels, mined.duplicate_ids, mined.ref_labels, mined.ref_duplicate_ids
        )
        anchors, _, negatives = mined.indices_tuple
        assert not any(duplicates[a][n] for a, n in zip(anchors.tolist(), negatives.tolist()))
        assert mined.global_mean
