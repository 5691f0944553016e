"""forward_chunk_size with cross-rank mining and the memory on 2 real processes over gloo."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.utils import dist
from torch import nn
from torch.utils.data import TensorDataset

from composer_dynsample import (
    EmbeddingModel,
    HardNegativeMining,
    InfoNCELoss,
    MultiSimilarityLoss,
    PKBatchSampler,
    TripletMarginLoss,
    build_dataloader,
)

pytestmark = pytest.mark.world_size(2)


def _fit(chunk: int | None, strategy: str, memory_size: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(128) % 8
    features = (
        torch.randn(8, 6, generator=generator)[labels] + torch.randn(128, 6, generator=generator)
    ).double()
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    losses = {"multi_similarity": MultiSimilarityLoss(), "batch_hard": InfoNCELoss(temperature=0.1)}
    loss = losses.get(strategy, TripletMarginLoss(margin=0.3))
    model = EmbeddingModel(encoder, loss, forward_chunk_size=chunk)
    loader = build_dataloader(TensorDataset(features, labels), PKBatchSampler(labels, 4, 6, seed=1))
    algorithm = HardNegativeMining(strategy, cross_rank=True, gather="autograd", memory_size=memory_size)
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.2),
        algorithms=[algorithm],
        max_duration="2ep",
        progress_bar=False,
    )
    trainer.fit()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("strategy", "memory_size"), [("semi_hard", 0), ("multi_similarity", 48), ("batch_hard", 48)]
)
def test_chunked_cross_rank_training_matches_the_unchunked_run(strategy, memory_size):
    dist.initialize_dist("cpu")
    expected = _fit(None, strategy, memory_size)
    params = _fit(5, strategy, memory_size)
    for param, want in zip(params, expected):
        torch.testing.assert_close(param, want)
    # DDP kept the ranks in step, and training moved the weights.
    gathered = dist.all_gather_object([p.tolist() for p in params])
    assert gathered[0] == gathered[1]
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    assert not torch.allclose(initial[0].weight, params[0])
