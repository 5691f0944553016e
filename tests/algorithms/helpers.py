"""Shared helpers for the algorithm tests: a Trainer with HardNegativeMining, text pairs with duplicates."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.core import Callback, DataSpec, State
from composer.loggers import Logger
from torch.utils.data import Dataset, TensorDataset

from composer_dynsample import EmbeddingModel, MinedBatch, PKBatchSampler, build_dataloader

NUM, DIM, CLASSES = 128, 6, 8


def make_data(seed: int = 0):
    """128 rows of 6 features around 8 class centres: ``(features, labels)``."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(NUM) % CLASSES
    centers = torch.randn(CLASSES, DIM, generator=generator)
    features = centers[labels] + 0.8 * torch.randn(NUM, DIM, generator=generator)
    return features, labels


class CountingEncoder(torch.nn.Module):
    """A linear encoder that counts its forward calls."""

    def __init__(self, out: int = 4) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(DIM, out)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.layer(x)


def assert_first_batch_refused(model, train_dataloader, algorithm, match: str) -> None:
    """A one-batch fit of ``model`` on ``train_dataloader`` with ``algorithm`` raises a ``ValueError``
    matching ``match``."""
    trainer = Trainer(
        model=model,
        train_dataloader=train_dataloader,
        algorithms=[algorithm],
        max_duration="1ba",
        progress_bar=False,
    )
    with pytest.raises(ValueError, match=match):
        trainer.fit()


def make_trainer(
    algorithm, *, loss=None, encoder=None, callbacks=(), max_duration="2ep", sampler=None, **kwargs
):
    """``(trainer, encoder, sampler)``: ``algorithm`` training on :func:`make_data` in 4 x 4 P x K batches."""
    features, labels = make_data()
    sampler = sampler or PKBatchSampler(labels, classes_per_batch=4, samples_per_class=4, seed=0)
    encoder = encoder or CountingEncoder()
    model = EmbeddingModel(encoder, loss=loss, **kwargs.pop("model_kwargs", {}))
    return (
        Trainer(
            model=model,
            train_dataloader=build_dataloader(TensorDataset(features, labels), sampler),
            optimizers=torch.optim.SGD(model.parameters(), lr=kwargs.pop("lr", 0.05)),
            algorithms=[algorithm] if algorithm is not None else [],
            callbacks=list(callbacks),
            max_duration=max_duration,
            progress_bar=False,
            **kwargs,
        ),
        encoder,
        sampler,
    )


def reference_duplicates(labels, ids, ref_labels=None, ref_ids=None) -> list[list[bool]]:
    """The definition with Python sets: row ``n`` of another label is a duplicate negative of anchor ``a``
    when some row of the batch or pool holds ``n``'s id under ``a``'s label, or ``a``'s id under ``n``'s."""
    labels, ids = labels.tolist(), ids.tolist()
    ref_labels = labels if ref_labels is None else ref_labels.tolist()
    ref_ids = ids if ref_ids is None else ref_ids.tolist()
    held = {(i, label) for i, label in zip(ids + ref_ids, labels + ref_labels) if i >= 0}

    def duplicate(a: int, n: int) -> bool:
        if labels[a] == ref_labels[n]:
            return False
        return (ref_ids[n] >= 0 and (ref_ids[n], labels[a]) in held) or (
            ids[a] >= 0 and (ids[a], ref_labels[n]) in held
        )

    return [[duplicate(a, n) for n in range(len(ref_labels))] for a in range(len(labels))]


# Text batches for the Trainer: {"features": {...}, "labels", "indices", "text_hash"}.
VOCAB, PAIRS = 40, 48


class PairsTexts(Dataset):
    """Index-only pairs: row ``2k`` is pair ``k``'s query, ``2k+1`` its answer. Answers come from a small
    set, so two queries often share one, and pairs 40-47 repeat pairs 0-7 exactly."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        answers = torch.randint(1000, 1012, (PAIRS,), generator=generator)
        queries = torch.arange(PAIRS)
        answers[40:], queries[40:] = answers[:8], queries[:8]
        self.text_ids = torch.stack([queries, answers], dim=1).reshape(-1)
        self.labels = torch.arange(2 * PAIRS) // 2

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> int:
        return index


class TextCollate:
    """The text batch of :class:`PairsTexts`: tokens drawn from each text id, and the text hash."""

    def __init__(self, data: PairsTexts) -> None:
        self.data = data

    def __call__(self, indices: list[int]) -> dict:
        index = torch.tensor(indices)
        text_ids = self.data.text_ids[index]
        lengths = 3 + text_ids % 4
        tokens = torch.stack([torch.randint(1, VOCAB, (7,), generator=torch.Generator().manual_seed(int(t)))
                              for t in text_ids])  # fmt: skip
        mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
        features = {"input_ids": tokens * mask, "attention_mask": mask, "is_query": index % 2 == 0}
        text_hash = text_ids * 7919 + 3  # stands in for the hash of the normalised text
        return {
            "features": features,
            "labels": self.data.labels[index],
            "indices": index,
            "text_hash": text_hash,
        }


class BagEncoder(torch.nn.Module):
    """The mean token embedding under the mask, projected to 4 dimensions."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, 8)
        self.project = torch.nn.Linear(8, 4)

    def forward(self, features: dict) -> torch.Tensor:
        mask = features["attention_mask"].unsqueeze(-1).float()
        pooled = (self.embedding(features["input_ids"]) * mask).sum(1) / mask.sum(1)
        return self.project(pooled)


class Recorder(Callback):
    """Keeps each step's mined batch, train batch and loss."""

    def __init__(self) -> None:
        self.mined: list[MinedBatch] = []
        self.batches: list[dict] = []
        self.losses: list[torch.Tensor] = []

    def after_forward(self, state: State, logger: Logger) -> None:
        self.mined.append(state.outputs)
        self.batches.append(state.batch)

    def after_loss(self, state: State, logger: Logger) -> None:
        self.losses.append(state.loss.detach().clone())


def text_trainer(algorithm, loss, *, max_duration="2ep", **kwargs):
    """A Trainer of ``algorithm`` and ``loss`` on :class:`PairsTexts` in 8 x 2 P x K batches."""
    data = PairsTexts()
    sampler = PKBatchSampler(data.labels, classes_per_batch=8, samples_per_class=2, seed=0)
    loader = build_dataloader(data, sampler, collate_fn=TextCollate(data))
    torch.manual_seed(0)
    model = EmbeddingModel(BagEncoder(), loss=loss)
    spec = DataSpec(loader, get_num_samples_in_batch=lambda batch: int(batch["labels"].shape[0]))
    return Trainer(
        model=model,
        train_dataloader=spec,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        algorithms=[algorithm],
        max_duration=max_duration,
        progress_bar=False,
        **kwargs,
    )
