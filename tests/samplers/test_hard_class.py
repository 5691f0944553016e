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
            labels,
            p,
            k,
            hard_fraction=hard_fraction,
            seed=seed,
            small_classes="replace",
            require_positive_pairs=False,  # K = 1 too
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
    points = centroids.double().numpy()
    classes = labels.numpy()[batches].reshape(len(batches), p, k)[:, :, 0]  # (batches, P)
    members = points[classes]
    distances = np.sqrt(((members[:, :, None] - members[:, None, :]) ** 2).sum(axis=3))
    distances[:, np.arange(p), np.arange(p)] = np.inf
    return float(distances.min(axis=2).mean())


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


def brute_force_nearest(centroids, limit):
    """Every class's ``limit`` nearest others by float64 squared distance, ties in class order."""
    points = centroids.double()
    rows = []
    for i in range(len(points)):
        squared = ((points - points[i]) ** 2).sum(dim=1).tolist()
        rows.append(sorted((j for j in range(len(points)) if j != i), key=lambda j: (squared[j], j))[:limit])
    return np.array(rows)


def clustered_centroids(num_classes, dim, seed):
    """Class centroids in groups of about ten around random centres, as trained class embeddings lie."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes // 10, dim, generator=gen) * 3
    return centres[torch.randint(0, len(centres), (num_classes,), generator=gen)] + torch.randn(
        num_classes, dim, generator=gen
    )


def test_exact_search_equals_a_float64_brute_force_ties_in_class_order():
    centroids = torch.randn(400, 6, generator=torch.Generator().manual_seed(2))
    centroids[200:260] = centroids[100:160]  # exact ties: equal distances, resolved by class
    ours = nearest_classes(centroids, limit=12, search="exact", chunk_size=97)
    assert np.array_equal(ours, brute_force_nearest(centroids, 12))


def test_exact_search_is_exact_for_centroids_far_from_the_origin():
    # Un-normalised embeddings share a mean: a float32 |x|^2 - 2x.y + |y|^2 on them cancels to noise.
    centroids = 0.1 * torch.randn(300, 16, generator=torch.Generator().manual_seed(5)) + 100.0
    assert np.array_equal(
        nearest_classes(centroids, limit=8, search="exact"), brute_force_nearest(centroids, 8)
    )


def test_ivf_search_finds_most_exact_neighbours_and_is_a_pure_function():
    centroids = clustered_centroids(3000, 16, seed=0)
    valid = torch.ones(3000, dtype=torch.bool)
    valid[::50] = False
    exact = nearest_classes(centroids, valid, limit=16, search="exact")
    approximate = nearest_classes(centroids, valid, limit=16, search="ivf")
    recall = np.mean([len(set(a) & set(b)) / 16 for a, b in zip(exact, approximate)])
    assert recall >= 0.8, recall
    assert approximate.shape == (3000, 16)
    assert not (approximate == np.arange(3000)[:, None]).any()  # never oneself
    assert not np.isin(approximate, np.flatnonzero(~valid.numpy())).any()  # never a class without centroid
    assert all(len(set(row)) == 16 for row in approximate.tolist())
    points = centroids.double()
    distances = ((points[torch.from_numpy(approximate)] - points[:, None]) ** 2).sum(dim=2)
    assert bool((distances[:, 1:] >= distances[:, :-1] - 1e-4).all())  # nearest first (float32 order)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert np.array_equal(nearest_classes(centroids, valid, limit=16, search="ivf"), approximate)
    finally:
        torch.set_num_threads(threads)


def test_ivf_batches_keep_every_guarantee_and_hold_nearer_classes():
    num_classes, p, k = 600, 8, 2
    labels = labels_of([4] * num_classes)
    centroids = clustered_centroids(num_classes, 8, seed=1)
    hard = HardClassPKBatchSampler(labels, p, k, hard_fraction=0.5, search="ivf", seed=0)
    hard.update_class_embeddings(centroids)
    hard.set_epoch(1)
    batches = check_pk(hard, labels, 1)
    assert set(labels[batches.reshape(-1)].tolist()) == set(range(num_classes))  # every class appears
    plain = PKBatchSampler(labels, p, k, seed=0)
    hard_distance = nearest_member_distance(batches, labels, centroids, p, k)
    assert hard_distance < 0.75 * nearest_member_distance(plain.global_batches(1), labels, centroids, p, k)
    assert not np.array_equal(hard.global_batches(1), hard.global_batches(2))


def test_a_class_with_a_chunk_in_every_batch_is_in_every_batch():
    # Class 0 has more chunks than there are batches: it is due in every batch, seeds or not.
    labels = labels_of([60] + [3] * 30)
    sampler = HardClassPKBatchSampler(labels, 4, 3, hard_fraction=0.75, seed=1)
    sampler.update_class_embeddings(torch.randn(31, 2, generator=torch.Generator().manual_seed(0)))
    sampler.set_epoch(0)
    batches = check_pk(sampler, labels, 0)
    assert all(0 in labels[batch].tolist() for batch in batches)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"search": "annoy"}, "search must be one of"), ({"search": "ivf"}, "search='ivf' needs a limit")],
)
def test_bad_searches_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nearest_classes(torch.randn(5, 2), **kwargs)
