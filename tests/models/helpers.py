"""Shared helpers for the model tests: a small encoder and a Trainer for the ``forward_chunk_size`` runs."""

from __future__ import annotations

import torch
from composer import Trainer
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

ROWS, DIM = 48, 6


def make_data(rows: int = ROWS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` float64 rows of ``DIM`` features around 6 class centres: ``(features, labels)``."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % 6
    features = torch.randn(6, DIM, generator=generator)[labels] + torch.randn(rows, DIM, generator=generator)
    return features.double(), labels


def make_encoder(*layers: nn.Module) -> nn.Module:
    """A seeded float64 MLP from ``DIM`` features to 5, with ``layers`` after its first linear layer."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 16), *layers, nn.ReLU(), nn.Linear(16, 5)).double()


LOSSES = {"multi_similarity": MultiSimilarityLoss(), "batch_hard": InfoNCELoss(temperature=0.1)}


def make_trainer(
    chunk: int | None,
    strategy: str,
    *,
    rows: int,
    lr: float,
    mining: dict[str, object],
    **trainer_options: object,
) -> tuple[Trainer, EmbeddingModel]:
    """A Trainer over ``rows`` samples in 4 x 8 P x K batches; the loss follows the miner
    (multi-similarity pairs, InfoNCE on batch-hard, else triplets)."""
    features, labels = make_data(rows=rows)
    model = EmbeddingModel(
        make_encoder(), LOSSES.get(strategy, TripletMarginLoss(margin=0.3)), forward_chunk_size=chunk
    )
    loader = build_dataloader(TensorDataset(features, labels), PKBatchSampler(labels, 4, 8, seed=1))
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=torch.optim.SGD(model.parameters(), lr=lr),
        algorithms=[HardNegativeMining(strategy, **mining)],
        progress_bar=False,
        **trainer_options,
    )
    return trainer, model


def fit_with_chunks(
    chunk: int | None, strategy: str, memory_size: int, **mining: object
) -> list[torch.Tensor]:
    """Two epochs of 4 x 8 P x K batches through the Trainer; the trained parameters.

    The 2-rank tests pass ``cross_rank=True, gather="autograd"`` as ``mining``.
    """
    trainer, model = make_trainer(
        chunk, strategy, rows=128, lr=0.2, mining={"memory_size": memory_size, **mining}, max_duration="2ep"
    )
    trainer.fit()
    return [p.detach().clone() for p in model.parameters()]
