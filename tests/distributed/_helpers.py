"""Set-up shared by the 2-rank tests: a folder both ranks share, the gradient comparisons' encoder, memory
and cases, a trainer over a tensor store's rows as a batch sampler picks them, and mined-negative pairs."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from composer import Callback, Trainer
from composer.utils import dist, get_device

from composer_dynsample import EmbeddingModel, InfoNCELoss, SetSamplerEpoch, build_dataloader
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler

#: A miner with each of InfoNCE's options: the in-batch or the mined negatives, one direction or both.
INFONCE_CASES = [
    ("batch_hard", InfoNCELoss(0.1)),
    ("semi_hard", InfoNCELoss(0.1, negatives="mined")),
    ("hard_topk", InfoNCELoss(0.05, symmetric=True)),
    ("multi_similarity", InfoNCELoss(0.2, negatives="mined", symmetric=True)),
]


#: The directories :func:`shared_tmp_dir` made during the running test.
SHARED_DIRS: list[Path] = []


def shared_tmp_dir(prefix: str = "dynsample-") -> Path:
    """A directory made on rank 0 and announced to every rank (both ranks share this machine's disk),
    removed after the test (:func:`remove_shared_dirs`, which ``tests/distributed/conftest.py`` calls)."""
    if not dist.is_initialized():  # the first Trainer of the session has not run yet
        dist.initialize_dist(get_device(None))
    path = [tempfile.mkdtemp(prefix=prefix) if dist.get_global_rank() == 0 else ""]
    dist.broadcast_object_list(path, src=0)
    SHARED_DIRS.append(Path(path[0]))
    return Path(path[0])


def remove_shared_dirs() -> None:
    """Remove the directories :func:`shared_tmp_dir` made: on rank 0, once every rank is done with them."""
    if not SHARED_DIRS:
        return
    dist.barrier()
    if dist.get_global_rank() == 0:
        for path in SHARED_DIRS:
            shutil.rmtree(path, ignore_errors=True)
    SHARED_DIRS.clear()


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


# Pair batches with mined corpus negatives.
PAIRS, P = 96, 4


def pairs_store() -> TensorStore:
    """96 pairs: an anchor near its positive, both near one of 12 topics (so other pairs are near too)."""
    gen = torch.Generator().manual_seed(0)
    topics = torch.randn(12, 6, generator=gen) * 2
    pairs = topics[torch.arange(PAIRS) % 12] + torch.randn(PAIRS, 6, generator=gen)
    features = pairs.repeat_interleave(2, dim=0) + 0.3 * torch.randn(2 * PAIRS, 6, generator=gen)
    return TensorStore(features, torch.arange(2 * PAIRS) // 2)


def sampler(seed: int = 2, **options) -> MinedNegativesPKBatchSampler:
    """Mined-negative batches of :func:`pairs_store`'s pairs: ``P`` pairs x (2 + 2 negatives) a batch."""
    is_passage = torch.arange(2 * PAIRS) % 2 == 1
    return MinedNegativesPKBatchSampler(
        pairs_store().labels, P, 2, is_passage=is_passage, skip_top=1, window=4, seed=seed, **options
    )


def trainer_for(
    batches: MinedNegativesPKBatchSampler, algorithms, seen: dict | None = None, **trainer_options
) -> Trainer:
    """A :func:`store_trainer` on :func:`pairs_store` that records into ``seen`` each epoch's pair rows and
    each ``(global batch, rows)``."""

    class Record(Callback):
        def after_dataloader(self, state, logger) -> None:
            if seen is not None:
                rows = state.batch["index"].tolist()
                seen.setdefault(int(state.timestamp.epoch), []).extend(rows[: 2 * P])
                seen.setdefault("batches", []).append((int(state.timestamp.batch), rows))

    return store_trainer(pairs_store(), batches, algorithms, Record(), **trainer_options)
