"""Cross-rank mining and cross-batch memory on 2 real processes over gloo."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist
from torch.utils.data import TensorDataset

from composer_dynsample import EmbeddingModel, HardNegativeMining, PKBatchSampler, build_dataloader
from composer_dynsample.distributed import all_gather_embeddings
from composer_dynsample.losses import ContrastiveLoss, InfoNCELoss, MultiSimilarityLoss, TripletMarginLoss
from composer_dynsample.mining import build_miner
from tests.common import sgd_trainer
from tests.distributed._helpers import gradient_setup, random_batch

pytestmark = pytest.mark.world_size(2)

CASES = [
    ("batch_hard", TripletMarginLoss(margin=0.2)),
    ("semi_hard", TripletMarginLoss(margin=0.3)),
    ("hard_topk", TripletMarginLoss(margin=0.2)),
    ("multi_similarity", ContrastiveLoss(neg_margin=0.6)),
    ("multi_similarity", MultiSimilarityLoss()),
]


@pytest.mark.parametrize(
    ("strategy", "loss"), CASES, ids=[f"{name}-{type(loss).__name__}" for name, loss in CASES]
)
def test_autograd_gather_gradients_equal_one_process_on_the_concatenated_batch(strategy, loss):
    setup = gradient_setup(memory_rows=0)
    rank, world, encoder, embed = setup.rank, setup.world, setup.encoder, setup.embed
    features, labels = random_batch()

    # One process, the whole batch.
    full = embed(features)
    loss(full, labels, build_miner(strategy)(full.detach(), labels)).backward()
    expected = encoder.weight.grad.clone()
    encoder.zero_grad()

    # Two ranks, half the batch each, the pool gathered with gradients, then DDP's average.
    half = features.shape[0] // world
    local = embed(features[rank * half : (rank + 1) * half])
    local_labels = labels[rank * half : (rank + 1) * half]
    pool, pool_labels, offset = all_gather_embeddings(local, local_labels, with_grad=True)
    assert offset == rank * half
    tuples = build_miner(strategy)(
        local.detach(), local_labels, pool.detach(), pool_labels, self_offset=offset
    )
    loss(local, local_labels, tuples, pool, pool_labels, global_mean=True).backward()
    grad = encoder.weight.grad.clone()
    torch.distributed.all_reduce(grad)
    grad /= world
    assert torch.allclose(grad, expected, atol=1e-6), (grad - expected).abs().max()
    assert expected.abs().sum() > 0  # the comparison is not between two zeros


def test_constant_gather_keeps_only_local_gradients():
    dist.initialize_dist("cpu")
    rank = dist.get_global_rank()
    local = torch.randn(3, 4, requires_grad=True)
    pool, _, offset = all_gather_embeddings(local, torch.arange(3), with_grad=False)
    pool.sum().backward()
    assert torch.equal(local.grad, torch.ones(3, 4))
    assert offset == 3 * rank and pool.shape == (6, 4)


def test_uneven_batches_are_gathered_without_padding_rows():
    dist.initialize_dist("cpu")
    rank = dist.get_global_rank()
    rows = 2 if rank == 0 else 5
    local = torch.full((rows, 3), float(rank), requires_grad=True)
    pool, pool_labels, offset = all_gather_embeddings(local, torch.full((rows,), rank), with_grad=True)
    assert pool.shape == (7, 3) and pool_labels.tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert offset == (0 if rank == 0 else 2)
    (pool * torch.arange(7.0)[:, None]).sum().backward()
    # Each rank receives the sum over both ranks of the gradient of its own rows: 2 x the row index.
    assert torch.equal(local.grad[:, 0], 2 * torch.arange(offset, offset + rows, dtype=torch.float32))


def two_epoch_trainer(
    encoder, features, labels, algorithm, callback, loss=None, **kwargs
) -> tuple[Trainer, EmbeddingModel]:
    """Two epochs of 4 x 4 P x K batches with one algorithm and one callback."""
    model = EmbeddingModel(encoder, loss)
    loader = build_dataloader(TensorDataset(features, labels), PKBatchSampler(labels, 4, 4, seed=1))
    trainer = sgd_trainer(
        model, loader, lr=0.1, algorithms=[algorithm], callbacks=[callback], max_duration="2ep", **kwargs
    )
    return trainer, model


class MemoryProbe(Callback):
    def __init__(self, algorithm: HardNegativeMining) -> None:
        self.algorithm = algorithm
        self.snapshots: list[tuple[torch.Tensor, torch.Tensor]] = []

    def batch_end(self, state: State, logger: Logger) -> None:
        memory = self.algorithm.memory
        self.snapshots.append((memory.embeddings.clone(), memory.labels.clone()))


@pytest.mark.parametrize("cross_rank", [False, True])
def test_memory_is_identical_on_every_rank_through_the_trainer(cross_rank):
    features, labels = random_batch(rows=128, dim=6)
    labels = torch.arange(128) % 8
    algorithm = HardNegativeMining(
        "batch_hard", memory_size=40, cross_rank=cross_rank, gather="autograd" if cross_rank else None
    )
    probe = MemoryProbe(algorithm)
    trainer, _ = two_epoch_trainer(torch.nn.Linear(6, 4), features, labels, algorithm, probe)
    trainer.fit()
    assert len(probe.snapshots) == 8
    other = dist.all_gather_object(probe.snapshots)
    for (emb0, lab0), (emb1, lab1) in zip(other[0], other[1]):
        assert torch.equal(emb0, emb1) and torch.equal(lab0, lab1)
    # The memory holds both ranks' rows: the global batch, not only the local one.
    assert probe.snapshots[0][0].shape[0] == 32


class NaNOnRankOne(torch.nn.Module):
    """A linear encoder whose output on rank 1 turns NaN at its ``bad_call``-th training forward."""

    def __init__(self, bad_call: int = 3) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)
        self.bad_call, self.calls = bad_call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        if self.training:
            self.calls += 1
            if dist.get_global_rank() == 1 and self.calls == self.bad_call:
                out = out * float("nan")
        return out


class BatchCounter(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def batch_end(self, state: State, logger: Logger) -> None:
        self.batches += 1


@pytest.mark.parametrize(
    ("options", "loss"),
    [
        ({"cross_rank": True, "gather": "autograd"}, None),
        ({"memory_size": 256}, None),
        # The skipped step has no pool; symmetric InfoNCE used to be told to average over one anyway.
        ({"cross_rank": True, "gather": "autograd"}, InfoNCELoss(symmetric=True)),
    ],
    ids=["cross_rank", "memory", "cross_rank-symmetric_infonce"],
)
def test_nonfinite_on_one_rank_skips_the_step_on_every_rank_without_hanging(options, loss):
    # Before the ranks agreed on finiteness, rank 1 skipped the gather that rank 0 waited in: a hang,
    # which the short dist_timeout turns into a failure.
    labels = torch.arange(128) % 8
    features = torch.randn(128, 6, generator=torch.Generator().manual_seed(0))
    algorithm = HardNegativeMining("batch_hard", on_nonfinite="skip", **options)
    encoder, counter = NaNOnRankOne(), BatchCounter()
    trainer, model = two_epoch_trainer(encoder, features, labels, algorithm, counter, loss, dist_timeout=20.0)
    trainer.fit()
    assert encoder.calls >= 3
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert dist.all_gather_object(counter.batches) == [8, 8]
