"""``HardClassPKBatchSampler``: P x K guarantees, determinism, and batches of near classes once centroids arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample import PKBatchSampler
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler, nearest_classes


def labels_of(counts):
    return torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])


def check_pk(sampler, labels, epoch):
    """Every batch P distinct classes x K contiguous samples; class counts as under P x K; no repeats."""
    p, k = sampler.classes_per_batch, sampler.samples_per_class
    batches = sampler.global_batches(epoch)
    assert batches.shape == (sampler.num_global_batches, p * k)
    for batch in batches:
        classes = labels[batch].view(p, k)
        assert bool((classes == classes[:, :1]).all()) and len(set(classes[:, 0].tolist())) == p
    chunks = np.bincount(labels[batches.reshape(-1)].numpy(), minlength=len(sampler.classes)) // k
    assert int(chunks.sum()) == batches.shape[0] * p
    assert bool(((chunks == sampler._chunks) | (chunks == sampler._chunks - 1)).all())  # at most one trimmed
    if not sampler._is_small.any():
        assert len(set(batches.reshape(-1).tolist())) == batches.size
    return batches


def test_before_any_centroids_it_is_pk():
    labels = labels_of([9, 7, 12, 8, 10, 6])
    hard = HardClassPKBatchSampler(labels, 3, 2, seed=5)
    plain = PKBatchSampler(labels, 3, 2, seed=5)
    for epoch in range(3):
        hard.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert list(hard) == list(plain)


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(1, 14), min_size=4, max_size=12),
    p=st.integers(2, 4),
    k=st.integers(1, 3),
    hard_fraction=st.sampled_from([0.0, 0.25, 0.5, 0.75]),
    seed=st.integers(0, 3),
)
def test_p_by_k_guarantees_hold_with_any_centroids(counts, p, k, hard_fraction, seed):
    labels = labels_of(counts)
    try:
        sampler = HardClassPKBatchSampler(
            labels, p, k, hard_fraction=hard_fraction, seed=seed, small_classes="replace"
        )
    except ValueError:
        return  # P x K cannot be filled from these counts: PKBatchSampler's own error
    centroids = torch.randn(len(counts), 3, generator=torch.Generator().manual_seed(seed))
    sampler.update_class_embeddings(centroids)
    sampler.set_epoch(2)
    first = check_pk(sampler, labels, 2)
    assert np.array_equal(first, sampler.global_batches(2))  # a pure function of (seed, epoch, centroids)


def test_centroids_apply_from_the_next_set_epoch_and_change_the_batches():
    labels = labels_of([8] * 10)
    sampler = HardClassPKBatchSampler(labels, 4, 2, seed=0)
    sampler.set_epoch(1)
    before = sampler.global_batches(1)
    sampler.update_class_embeddings(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))
    assert np.array_equal(sampler.global_batches(1), before)  # not yet
    sampler.set_epoch(1)
    assert not np.array_equal(sampler.global_batches(1), before)
    assert not np.array_equal(sampler.global_batches(1), sampler.global_batches(2))


def nearest_member_distance(batches, labels, centroids, p, k):
    """Mean over every class of a batch of its centroid's distance to the nearest other class in the batch."""
    distances = torch.cdist(centroids, centroids).fill_diagonal_(float("inf"))
    values = []
    for batch in batches:
        classes = labels[batch].view(p, k)[:, 0]
        values.append(distances[classes][:, classes].min(dim=1).values.mean())
    return float(torch.stack(values).mean())


@pytest.mark.parametrize("hard_fraction", [0.5, 0.75])
def test_batches_hold_nearer_classes_than_pk(hard_fraction):
    num_classes, p, k = 40, 8, 2
    labels = labels_of([6] * num_classes)
    centroids = torch.randn(num_classes, 2, generator=torch.Generator().manual_seed(1))
    hard = HardClassPKBatchSampler(labels, p, k, hard_fraction=hard_fraction, seed=0)
    hard.update_class_embeddings(centroids)
    hard.set_epoch(1)
    plain = PKBatchSampler(labels, p, k, seed=0)
    hard_distance = nearest_member_distance(check_pk(hard, labels, 1), labels, centroids, p, k)
    plain_distance = nearest_member_distance(plain.global_batches(1), labels, centroids, p, k)
    assert hard_distance < 0.75 * plain_distance


def test_seeds_get_their_nearest_class_when_it_is_free():
    # Classes on a line in pairs (2j, 2j+1) at the same point: P=2, one seed and one hard slot.
    labels = labels_of([2] * 12)
    centroids = torch.tensor([[float(c // 2) * 10] for c in range(12)])
    sampler = HardClassPKBatchSampler(labels, 2, 2, hard_fraction=0.5, seed=3)
    sampler.update_class_embeddings(centroids)
    sampler.set_epoch(0)
    pairs = [sorted(set((labels[b] // 2).tolist())) for b in check_pk(sampler, labels, 0)]
    assert all(len(pair) == 1 for pair in pairs)


def test_classes_without_a_centroid_are_nobodys_neighbour():
    centroids = torch.tensor([[0.0], [1.0], [0.1], [5.0]])
    order = nearest_classes(centroids, valid=torch.tensor([True, True, False, True]))
    assert order[0].tolist() == [1, 3, 2] and order[2].tolist() == [0, 1, 3]
    labels = labels_of([4] * 4)
    sampler = HardClassPKBatchSampler(labels, 2, 2)
    sampler.update_class_embeddings(centroids, counts=torch.tensor([3, 3, 0, 3]))
    sampler.set_epoch(0)
    assert np.isnan(sampler.state_dict()["centroids"][2]).all()
    check_pk(sampler, labels, 0)


def test_state_dict_restores_the_epochs_batches():
    labels = labels_of([8] * 10)
    sampler = HardClassPKBatchSampler(labels, 4, 2, seed=2)
    sampler.update_class_embeddings(torch.randn(10, 3, generator=torch.Generator().manual_seed(4)))
    sampler.set_epoch(3)
    saved = sampler.state_dict()
    restored = HardClassPKBatchSampler(labels, 4, 2, seed=2)
    restored.load_state_dict(saved)
    assert restored.epoch == 3 and restored.snapshot_fingerprint() == sampler.snapshot_fingerprint() != ""
    assert list(restored) == list(sampler)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hard_fraction": 1.0}, r"hard_fraction must be a number in \[0, 1\)"),
        ({"hard_fraction": "half"}, "hard_fraction must be a number"),
        ({"distance": "manhattan"}, "distance must be one of"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HardClassPKBatchSampler(labels_of([4] * 4), 2, 2, **kwargs)


def test_centroids_of_the_wrong_shape_are_named():
    sampler = HardClassPKBatchSampler(labels_of([4] * 4), 2, 2)
    with pytest.raises(
        ValueError, match=r"centroids must be a \(4, dim\) tensor, one row per class, got \(3, 2\)"
    ):
        sampler.update_class_embeddings(torch.zeros(3, 2))


def test_nearest_classes_in_blocks_with_a_limit_are_the_full_orders_prefix():
    centroids = torch.randn(300, 5, generator=torch.Generator().manual_seed(0))
    valid = torch.rand(300, generator=torch.Generator().manual_seed(1)) > 0.1
    full = nearest_classes(centroids, valid)
    assert np.array_equal(nearest_classes(centroids, valid, limit=20, chunk_size=64), full[:, :20])
    assert not (full == np.arange(300)[:, None]).any()  # never oneself
