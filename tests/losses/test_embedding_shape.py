"""Every loss refuses embeddings that are not ``(batch, dim)`` in one line naming the shape and its cause."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer_dynsample import (
    ContrastiveLoss,
    EmbeddingModel,
    InfoNCELoss,
    MatryoshkaLoss,
    MultiSimilarityLoss,
    PKBatchSampler,
    TripletMarginLoss,
)
from composer_dynsample.losses import PerSourceLoss

SAMPLER_HINT = (
    "a batch sampler passed as DataLoader(sampler=...) makes each batch one item; pass it as batch_sampler=, "
    "or build the loader with composer_dynsample.build_dataloader(dataset, batch_sampler)."
)


def _message(owner: str, shape: tuple[int, ...]) -> str:
    return f"{owner}: embeddings must be (batch, dim), got {shape}: {SAMPLER_HINT}"


LOSSES = {
    "TripletMarginLoss": lambda: TripletMarginLoss(margin=0.2),
    "ContrastiveLoss": ContrastiveLoss,
    "MultiSimilarityLoss": MultiSimilarityLoss,
    "InfoNCELoss": InfoNCELoss,
    "MatryoshkaLoss": lambda: MatryoshkaLoss(InfoNCELoss(), [8, 4]),
    "PerSourceLoss": lambda: PerSourceLoss({"a": TripletMarginLoss()}),
}


def test_a_batch_sampler_given_as_sampler_is_refused_at_the_loss_of_a_real_batch():
    labels = torch.arange(32) % 8
    dataset = TensorDataset(torch.randn(32, 6, generator=torch.Generator().manual_seed(0)), labels)
    loader = DataLoader(dataset, sampler=PKBatchSampler(labels, 4, 4, num_replicas=1, rank=0))
    batch = next(iter(loader))
    model = EmbeddingModel(torch.nn.Linear(6, 8))
    outputs = model(batch)
    assert tuple(outputs.shape) == (1, 16, 8)  # one "item" of 16 rows: the symptom the check names
    with pytest.raises(ValueError) as raised:
        model.loss(outputs, batch)
    assert str(raised.value) == _message("TripletMarginLoss", (1, 16, 8))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_refuses_three_d_embeddings_in_one_line(name):
    loss = LOSSES[name]()
    embeddings, labels = torch.randn(1, 16, 8), (torch.arange(16) % 4)[None]
    keywords = {"source": "a"} if name == "PerSourceLoss" else {}
    expected = _message(name, (1, 16, 8))
    with pytest.raises(ValueError, match=re.escape(expected)) as raised:
        loss(embeddings, labels, **keywords)
    assert str(raised.value) == expected
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize(
    ("shape", "cause"),
    [
        ((4, 16, 8), "pool a (batch, tokens, dim) output over its tokens"),
        ((8,), "the encoder must return one row per item, a 2-D tensor"),
    ],
)
def test_other_shapes_name_the_encoder(name, shape, cause):
    keywords = {"source": "a"} if name == "PerSourceLoss" else {}
    with pytest.raises(
        ValueError, match=re.escape(f"{name}: embeddings must be (batch, dim), got {shape}: ")
    ) as raised:
        LOSSES[name]()(torch.randn(*shape), torch.zeros(shape[0], dtype=torch.long), **keywords)
    assert cause in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_two_d_embeddings_still_train(name):
    keywords = {"source": "a"} if name == "PerSourceLoss" else {}
    embeddings = torch.nn.functional.normalize(torch.randn(8, 8, requires_grad=True), dim=1)
    loss = LOSSES[name]()(embeddings, torch.arange(8) % 4, **keywords)
    assert loss.ndim == 0 and torch.isfinite(loss)
