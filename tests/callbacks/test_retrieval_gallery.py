"""embed_store: the gallery embeddings of a whole TensorStore, in batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample import EmbeddingModel
from composer_dynsample.data import TensorStore
from composer_dynsample.models.embed import embed_store


def test_embed_store_checks_batch_size_and_takes_numpy_integers():
    store = TensorStore(torch.randn(10, 4), torch.arange(10) % 2)
    model = EmbeddingModel(torch.nn.Linear(4, 3))
    assert torch.allclose(
        embed_store(model, store, batch_size=np.int64(4)), embed_store(model, store, batch_size=10)
    )
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=f"batch_size must be an integer >= 1, got {bad!r}"):
            embed_store(model, store, batch_size=bad)


def test_embed_store_gives_every_submodule_its_own_mode_back():
    # A frozen BatchNorm kept in eval inside a training model: train(True) on the whole model used to
    # switch it back to training, so it started updating its running statistics.
    encoder = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model = EmbeddingModel(encoder)
    model.train()
    encoder[1].eval()
    embed_store(model, TensorStore(torch.randn(6, 4), torch.arange(6) % 2))
    assert model.training and encoder[0].training and not encoder[1].training
