"""``EmbeddingModel``: argument checks, and a loss with parameters registers them with the model."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample import EmbeddingModel


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"encoder": "mlp"}, "encoder must be a torch.nn.Module, got str"),
        ({"normalize": "yes"}, "normalize must be true or false, got 'yes'"),
        ({"features_key": ""}, "features_key must be a non-empty string"),
        ({"labels_key": 3}, "labels_key must be a non-empty string, got 3"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        EmbeddingModel(**{"encoder": torch.nn.Linear(4, 2), **kwargs})


def test_a_loss_with_parameters_is_part_of_the_model():
    class ProxyLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proxies = torch.nn.Parameter(torch.randn(3, 2))

        def forward(self, embeddings, labels, *args):
            return -(embeddings @ self.proxies.T).gather(1, labels[:, None]).mean()

    loss = ProxyLoss()
    model = EmbeddingModel(torch.nn.Linear(4, 2), loss)
    assert any(parameter is loss.proxies for parameter in model.parameters())
    batch = {"features": torch.randn(6, 4), "labels": torch.tensor([0, 0, 1, 1, 2, 2])}
    model.loss(model(batch), batch).backward()
    assert loss.proxies.grad is not None and bool(loss.proxies.grad.abs().sum() > 0)
