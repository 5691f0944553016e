"""A tiny Lightning model that records the batches it trains, shared by the Lightning tests and ddp_run.py."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer_dynsample import PKBatchSampler

# 6 classes of 8 samples, P=2 x K=2: 12 global batches of 4 per epoch, 6 per rank on 2 ranks.
LABELS = torch.arange(48) % 6
CLASSES_PER_BATCH, SAMPLES_PER_CLASS, SEED = 2, 2, 5


def make_sampler(**kwargs: Any) -> PKBatchSampler:
    """The sampler every test builds; ``num_replicas``/``rank`` default to the process group's."""
    kwargs.setdefault("seed", SEED)
    return PKBatchSampler(LABELS, CLASSES_PER_BATCH, SAMPLES_PER_CLASS, **kwargs)


def planned_batches(epoch: int, rank: int, world_size: int) -> list[list[int]]:
    """The batches the sampler plans for ``(seed, epoch, rank)``: what a rank must train in that epoch."""
    return make_sampler(num_replicas=world_size, rank=rank).rank_batches(epoch).tolist()


class RecordingModel(pl.LightningModule):
    """Classifies dataset indices through a fixed random table and records every batch it trains.

    The train dataloader is built in ``train_dataloader()``, after Lightning has started the process
    group, so the sampler's rank and world size are right on every rank.
    """

    def __init__(
        self, num_workers: int = 0, sampler: PKBatchSampler | None = None, **sampler_kwargs: Any
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("table", torch.randn(LABELS.numel(), 4, generator=generator))
        self.head = torch.nn.Linear(4, int(LABELS.max()) + 1)
        self.num_workers = num_workers
        self.sampler = sampler  # built beforehand, else in train_dataloader() from sampler_kwargs
        self.sampler_kwargs = sampler_kwargs
        self.seen: dict[int, list[list[Any]]] = {}

    def train_dataloader(self) -> DataLoader:
        dataset = TensorDataset(torch.arange(LABELS.numel()), LABELS)
        sampler = self.sampler if self.sampler is not None else make_sampler(**self.sampler_kwargs)
        return DataLoader(dataset, batch_sampler=sampler, num_workers=self.num_workers)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, label = batch
        self.seen.setdefault(self.current_epoch, []).append([batch_idx, index.tolist()])
        return torch.nn.functional.cross_entropy(self.head(self.table[index]), label)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches trained in ``epoch``, in order."""
        return [indices for _, indices in self.seen.get(epoch, [])]


def make_trainer(max_epochs: int, **kwargs: Any) -> pl.Trainer:
    """A quiet CPU trainer; ``kwargs`` override the defaults (``use_distributed_sampler=False`` among them)."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": max_epochs,
        "use_distributed_sampler": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "num_sanity_val_steps": 0,
    }
    options.update(kwargs)
    return pl.Trainer(**options)
