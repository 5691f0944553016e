"""Set-up shared by the 2-rank tests: a folder both ranks share, the gradient comparisons' encoder, memory
and cases, and a trainer over a tensor store's rows as a batch sampler picks them."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from composer import Callback, Trainer
from composer.utils import dist, get_device

from composer_dynsample import EmbeddingModel, InfoNCELoss, SetSamplerEpoch, build_dataloader
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

#: A miner with each of InfoNCE's options: the in-batch or the mined negatives, one direction or both.
INFONCE_CASES = [
    ("batch_hard", InfoNCELoss(0.1)),
    ("semi_hard", InfoNCELoss(0.1, negatives="mined")),
    ("hard_topk", InfoNCELoss(0.05, symmetric=True)),
    ("multi_similarity", InfoNCELoss(0.2, negatives="mined", symmetric=True)),
]


def shared_tmp_dir(prefix: str = "dynsample-") -> Path:
    """A directory made on rank 0 and announced to every rank (both ranks share this machine's disk)."""
    if not dist.is_initialized():  # the first Trainer of the session has not run yet
        dist.initialize_dist(get_device(None))
    path = [tempfile.mkdtemp(prefix=prefix) if dist.get_global_rank() == 0 else ""]
    dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def parametrize_strategy_and_loss(cases):
    """``strategy`` and ``loss`` from ``(miner, InfoNCELoss)`` cases, each named by its loss's options."""
    return pytest.mark.parametrize(
        ("strategy", "loss"),
        cases,
        ids=[
            f"{name}-{loss.negatives}-{'symmetric' if loss.symmetric else 'forward'}" for name, loss in cases
        ],
    )


def random_batch(seed: int = 0, rows: int = 32, dim: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` random features and labels in ``[0, 5)``, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, dim, generator=generator)
    labels = torch.randint(0, 5, (rows,), generator=generator)
    return features, labels


@dataclass
class GradientSetup:
    """What one process and the 2 ranks share: the encoder, and a memory that is the same on every rank.

    ``generator`` has drawn the memory and its labels; what it draws next is the same on every rank too.
    """

    rank: int
    world: int
    encoder: torch.nn.Linear
    memory: torch.Tensor
    memory_labels: torch.Tensor
    generator: torch.Generator

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.encoder(x), dim=1)


def gradient_setup(memory_rows: int) -> GradientSetup:
    """Join the gloo group; a ``Linear(5, 4)`` encoder and ``memory_rows`` memory rows, equal across ranks."""
    dist.initialize_dist("cpu")
    rank, world = dist.get_global_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same bias on every rank
    encoder = torch.nn.Linear(5, 4)
    torch.nn.init.normal_(encoder.weight, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(2)  # a cross-batch memory: the same constants on every rank
    memory = torch.nn.functional.normalize(torch.randn(memory_rows, 4, generator=generator), dim=1)
    memory_labels = torch.randint(0, 5, (memory_rows,), generator=generator)
    return GradientSetup(rank, world, encoder, memory, memory_labels, generator)


def store_trainer(
    data: TensorStore, batch_sampler, algorithms, recorder: Callback, **trainer_options
) -> Trainer:
    """A ``Linear(6, 4)`` embedding model on ``data``'s rows in ``batch_sampler``'s batches (3 epochs).

    The sampler's epoch is set each epoch (:class:`SetSamplerEpoch`), then ``recorder`` sees each batch.
    """
    torch.manual_seed(0)
    model = EmbeddingModel(torch.nn.Linear(6, 4))
    return Trainer(
        model=model,
        train_dataloader=build_dataloader(
            IndexDataset(data.labels), batch_sampler, collate_fn=GatherCollate(data)
        ),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=algorithms,
        callbacks=[SetSamplerEpoch(), recorder],
        **{"max_duration": "3ep", "progress_bar": False, "seed": 0, **trainer_options},
    )
