"""The losses against pytorch-metric-learning's, on the same tuples."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers

from composer_dynsample import ContrastiveLoss, MultiSimilarityLoss, TripletMarginLoss
from composer_dynsample.losses import all_pairs, all_triplets
from composer_dynsample.mining import BatchHardMiner, MultiSimilarityMiner


def _batch(seed: int, size: int = 12, dim: int = 5, classes: int = 3):
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.nn.functional.normalize(torch.randn(size, dim, generator=generator), dim=1)
    labels = torch.randint(0, classes, (size,), generator=generator)
    return embeddings.double(), labels


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.05, 1.0), st.booleans())
def test_triplet_margin_loss_equals_pml_with_a_mean_reducer(seed, margin, mined):
    embeddings, labels = _batch(seed)
    tuples = BatchHardMiner()(embeddings, labels) if mined else None
    ours = TripletMarginLoss(margin=margin)(embeddings, labels, tuples)
    theirs = pml_losses.TripletMarginLoss(
        margin=margin, distance=pml_distances.CosineSimilarity(), reducer=pml_reducers.MeanReducer()
    )(embeddings, labels, tuples)
    assert torch.allclose(ours, theirs, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 0.5), st.floats(0.5, 2.0))
def test_contrastive_loss_equals_pml_with_a_mean_reducer(seed, pos_margin, neg_margin):
    embeddings, labels = _batch(seed)
    tuples = MultiSimilarityMiner(epsilon=0.3)(embeddings, labels)
    ours = ContrastiveLoss(pos_margin, neg_margin, distance="euclidean")(embeddings, labels, tuples)
    theirs = pml_losses.ContrastiveLoss(
        pos_margin=pos_margin,
        neg_margin=neg_margin,
        distance=pml_distances.LpDistance(normalize_embeddings=False),
        reducer=pml_reducers.MeanReducer(),
    )(embeddings, labels, tuples)
    assert torch.allclose(ours, theirs, atol=1e-8)


def test_multi_similarity_counts_a_repeated_pair_once_as_pml_does():
    # PML builds 0/1 pair masks; a pair listed twice used to count twice here (0.2046 against 0.1675).
    embeddings, labels = _batch(3, size=6, classes=2)
    a1, p = torch.tensor([0, 0, 2]), torch.tensor([1, 1, 3])
    a2, n = torch.tensor([0, 0, 1]), torch.tensor([4, 4, 5])
    tuples = (a1, p, a2, n)
    ours = MultiSimilarityLoss()(embeddings, labels, tuples)
    theirs = pml_losses.MultiSimilarityLoss()(embeddings, labels, tuples)
    assert torch.allclose(ours, theirs, atol=1e-8)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(2.0, 50.0, 0.5), (1.0, 10.0, 0.3)]))
def test_multi_similarity_loss_equals_pml(seed, params):
    alpha, beta, base = params
    embeddings, labels = _batch(seed)
    tuples = MultiSimilarityMiner(epsilon=0.1)(embeddings, labels)
    ours = MultiSimilarityLoss(alpha, beta, base)(embeddings, labels, tuples)
    theirs = pml_losses.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)(embeddings, labels, tuples)
    assert torch.allclose(ours, theirs, atol=1e-8)


def test_without_tuples_every_valid_tuple_is_used():
    labels = torch.tensor([0, 0, 1, 2])
    anchors, positives, negatives = all_triplets(labels)
    expected = {(0, 1, 2), (0, 1, 3), (1, 0, 2), (1, 0, 3)}
    assert set(zip(anchors.tolist(), positives.tolist(), negatives.tolist())) == expected
    a1, p, a2, _ = all_pairs(labels)
    assert set(zip(a1.tolist(), p.tolist())) == {(0, 1), (1, 0)}
    assert len(a2) == 10  # ordered pairs of different labels


def test_empty_tuples_give_zero_with_a_graph_to_embeddings_and_pool():
    embeddings = torch.randn(4, 3, requires_grad=True)
    pool = torch.randn(5, 3, requires_grad=True)
    empty = (torch.empty(0, dtype=torch.int64),) * 3
    loss = TripletMarginLoss()(embeddings, torch.arange(4), empty, pool, torch.arange(5))
    loss.backward()
    assert loss.item() == 0.0
    assert embeddings.grad is not None and pool.grad is not None


def test_wrong_tuple_kind_is_a_clear_error():
    embeddings, labels = _batch(0)
    with pytest.raises(ValueError, match=r"TripletMarginLoss needs triplets .* got 4"):
        TripletMarginLoss()(embeddings, labels, MultiSimilarityMiner()(embeddings, labels))
    with pytest.raises(ValueError, match="distance must be one of"):
        TripletMarginLoss(distance="chebyshev")


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: TripletMarginLoss(margin="0.2"), r"margin must be a number >= 0.0, got '0.2'"),
        (lambda: TripletMarginLoss(margin=float("nan")), r"margin must be a finite number >= 0.0, got nan"),
        (lambda: TripletMarginLoss(margin=-1), r"^margin must be a number >= 0.0, got -1\.$"),
        (lambda: ContrastiveLoss(neg_margin=None), r"neg_margin must be a number >= 0.0, got None"),
        (lambda: ContrastiveLoss(neg_margin=-0.5), r"^neg_margin must be a number >= 0.0, got -0.5\.$"),
        (lambda: ContrastiveLoss(pos_margin=-0.1), r"^pos_margin must be a number >= 0.0, got -0.1\.$"),
        (lambda: MultiSimilarityLoss(alpha=0.0), r"alpha must be a number > 0.0, got 0.0"),
        (lambda: MultiSimilarityLoss(beta=-1), r"beta must be a number > 0.0, got -1"),
    ],
)
def test_loss_arguments_are_checked_by_name(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()
