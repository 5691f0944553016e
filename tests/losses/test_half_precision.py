"""The losses under autocast and on fp16 inputs: computed in float32, as their docs promise.

Composer runs ``model.loss`` under autocast with ``amp_fp16`` / ``amp_bf16``; CPU autocast with bf16
stands in for it here (the same rule: matrix products in the half dtype).
"""

from __future__ import annotations

import pytest
import torch

from composer_dynsample import ContrastiveLoss, InfoNCELoss, MultiSimilarityLoss, TripletMarginLoss

LOSSES = {
    "triplet-euclidean": TripletMarginLoss(margin=0.05, distance="euclidean"),
    "triplet-cosine": TripletMarginLoss(margin=0.002),
    "contrastive-euclidean": ContrastiveLoss(pos_margin=0.0, neg_margin=0.1, distance="euclidean"),
    "multi_similarity": MultiSimilarityLoss(),
    "infonce": InfoNCELoss(temperature=0.01),
}


def _tight_classes() -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes 0.06 apart, each about 0.011 wide: bf16 products round such distances away."""
    generator = torch.Generator().manual_seed(0)
    first = torch.nn.functional.normalize(torch.randn(64, generator=generator), dim=0)
    second = torch.nn.functional.normalize(first + 0.0075 * torch.randn(64, generator=generator), dim=0)
    rows = torch.stack([first] * 3 + [second] * 3) + 0.00125 * torch.randn(6, 64, generator=generator)
    return torch.nn.functional.normalize(rows, dim=1), torch.tensor([0, 0, 0, 1, 1, 1])


def _value_and_grad(loss, embeddings, labels, autocast: bool):
    embeddings = embeddings.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        value = loss(embeddings, labels)
    value.backward()
    return value.detach(), embeddings.grad


@pytest.mark.parametrize("name", list(LOSSES))
def test_autocast_leaves_the_loss_and_its_gradient_in_float32(name):
    # Before, autocast cast the distance matrix's products back to bf16: the triplet loss on these
    # classes came out 14x too large and its gradient 9.5x off.
    embeddings, labels = _tight_classes()
    value, grad = _value_and_grad(LOSSES[name], embeddings, labels, autocast=False)
    cast_value, cast_grad = _value_and_grad(LOSSES[name], embeddings, labels, autocast=True)
    assert cast_value.dtype == torch.float32
    torch.testing.assert_close(cast_value, value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cast_grad, grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_fp16_embeddings_whose_sum_overflows_fp16_give_the_float32_loss(name):
    # Non-negative, unnormalised embeddings (a ReLU head) summing past fp16's 65504: the attached zero
    # used to be inf * 0 = NaN, so the returned loss was NaN while the true loss was finite.
    generator = torch.Generator().manual_seed(1)
    embeddings = (torch.rand(128, 128, generator=generator) * 12).half()
    labels = torch.arange(128) % 8
    assert float(embeddings.float().sum()) > 65504
    value = LOSSES[name](embeddings, labels)
    expected = LOSSES[name](embeddings.float(), labels)
    assert torch.isfinite(value)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
