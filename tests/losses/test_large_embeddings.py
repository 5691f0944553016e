"""Losses on float32 embeddings too large for float32 distances: the float64 loss, finite gradients.

The miners compute distances in float64 where float32 would overflow (entries near 1e18 and above), so
they still return tuples there; the losses must then not turn those tuples into NaN or inf.
"""

from __future__ import annotations

import pytest
import torch

from composer_dynsample import ContrastiveLoss, InfoNCELoss, MultiSimilarityLoss, TripletMarginLoss
from composer_dynsample.mining import BatchHardMiner, MultiSimilarityMiner

DISTANCES = ("cosine", "euclidean", "squared_euclidean")


def triplets(embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return BatchHardMiner()(embeddings, labels)


def pairs(embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return MultiSimilarityMiner(epsilon=0.5)(embeddings, labels)


# name: (loss, the miner of its mined tuples)
LOSSES = {
    **{f"triplet-{d}": (lambda d=d: TripletMarginLoss(margin=0.2, distance=d), triplets) for d in DISTANCES},
    **{f"contrastive-{d}": (lambda d=d: ContrastiveLoss(0.0, 0.5, distance=d), pairs) for d in DISTANCES},
    **{f"infonce-{d}": (lambda d=d: InfoNCELoss(temperature=0.1, distance=d), triplets) for d in DISTANCES},
    **{
        f"infonce-symmetric-{d}": (lambda d=d: InfoNCELoss(symmetric=True, distance=d), pairs)
        for d in DISTANCES
    },
    "multi_similarity": (MultiSimilarityLoss, pairs),
}


def _value_and_grad(loss: torch.nn.Module, embeddings: torch.Tensor, labels: torch.Tensor, tuples):
    embeddings = embeddings.clone().requires_grad_(True)
    value = loss(embeddings, labels, tuples)
    value.backward()
    return value.detach(), embeddings.grad


@pytest.mark.parametrize("scale", [1e19, 1e30])
@pytest.mark.parametrize("mined", [False, True])
@pytest.mark.parametrize("name", list(LOSSES))
def test_huge_float32_embeddings_give_the_float64_loss_with_finite_gradients(name, mined, scale):
    # Before, the euclidean and squared-euclidean losses were NaN (inf - inf in the squared norms), the
    # cosine ones silently wrong (the norms overflowed to inf and every row normalised to zero).
    generator = torch.Generator().manual_seed(0)
    embeddings = (torch.randn(12, 4, generator=generator, dtype=torch.float64) * scale).float()
    labels = torch.arange(12) % 3
    make_loss, miner = LOSSES[name]
    loss = make_loss()
    tuples = miner(embeddings, labels) if mined else None
    assert tuples is None or tuples[0].numel() > 0
    value, grad = _value_and_grad(loss, embeddings, labels, tuples)
    reference, reference_grad = _value_and_grad(loss, embeddings.double(), labels, tuples)
    assert torch.isfinite(value) and bool(torch.isfinite(grad).all())
    assert grad.dtype == torch.float32
    torch.testing.assert_close(value.double(), reference, rtol=1e-6, atol=0.0)
    tolerance = 1e-5 * float(reference_grad.abs().max())
    torch.testing.assert_close(grad.double(), reference_grad, rtol=1e-4, atol=tolerance)


def test_float32_embeddings_of_ordinary_size_stay_float32():
    embeddings = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
    assert TripletMarginLoss(distance="euclidean")(embeddings, torch.arange(6) % 2).dtype == torch.float32


def test_embeddings_too_large_even_for_float64_are_named():
    embeddings = torch.full((4, 2), 1e200, dtype=torch.float64)
    with pytest.raises(ValueError, match="overflow every distance computation"):
        TripletMarginLoss(distance="euclidean")(embeddings, torch.tensor([0, 0, 1, 1]))


def test_entries_near_the_float32_limit_give_no_nan_through_the_attached_zero():
    # The zero that keeps every input in the graph used to sum all entries in float32: inf * 0 = NaN.
    embeddings = torch.full((8, 4), 3e37)
    embeddings[::2] *= -1
    empty = (torch.empty(0, dtype=torch.int64),) * 3
    value = TripletMarginLoss()(embeddings.requires_grad_(True), torch.arange(8) % 2, empty)
    value.backward()
    assert float(value) == 0.0 and bool(torch.isfinite(embeddings.grad).all())
