"""``NeighbourBatchSampler`` and ``nearest_other_class``: against brute force, guards, layout, snapshot."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from composer_dynsample.samplers.neighbours import NeighbourBatchSampler, nearest_other_class


def brute_force(embeddings, labels, k, skip_top=0):
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    out = []
    for i in range(len(labels)):
        others = [j for j in range(len(labels)) if labels[j] != labels[i]]
        ranked = sorted(others, key=lambda j: -float(unit[i] @ unit[j]))
        out.append((ranked[skip_top : skip_top + k] + [-1] * k)[:k])
    return np.array(out)


@pytest.mark.parametrize(("skip_top", "chunk_size"), [(0, 4096), (2, 7)])
def test_nearest_other_class_equals_brute_force(skip_top, chunk_size):
    gen = torch.Generator().manual_seed(0)
    embeddings, labels = torch.randn(50, 5, generator=gen), torch.randint(0, 6, (50,), generator=gen)
    ours, skipped = nearest_other_class(embeddings, labels, 4, skip_top=skip_top, chunk_size=chunk_size)
    assert np.array_equal(ours, brute_force(embeddings, labels, 4, skip_top))
    assert skipped["rank_window"] == 50 * skip_top and skipped["margin"] == 0


def test_the_margin_guard_drops_candidates_closer_than_the_positive_allows():
    # Anchor 0's class centroid is along x; sample 2 (other class) is almost as close as the class itself.
    embeddings = torch.tensor([[1.0, 0.0], [1.0, 0.05], [0.99, 0.1], [0.0, 1.0], [0.1, 1.0]])
    labels = torch.tensor([0, 0, 1, 1, 1])
    plain, _ = nearest_other_class(embeddings, labels, 2)
    guarded, skipped = nearest_other_class(embeddings, labels, 2, max_relative_similarity=0.95)
    assert plain[0].tolist()[0] == 2
    assert 2 not in guarded[0].tolist() and skipped["margin"] >= 1


def test_rows_without_an_embedding_are_nobodys_neighbour():
    embeddings = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.2]])
    ours, _ = nearest_other_class(
        embeddings, torch.tensor([0, 1, 0, 1]), 2, valid=torch.tensor([True, False, True, True])
    )
    assert 1 not in ours.ravel().tolist()
    assert ours[0].tolist() == [3, -1]
    assert ours[1].tolist() == [-1, -1]  # and has none: its seeds draw random negatives


def test_a_non_finite_row_is_treated_as_one_without_an_embedding():
    gen = torch.Generator().manual_seed(3)
    embeddings, labels = torch.randn(40, 4, generator=gen), torch.arange(40) % 4
    broken = embeddings.clone()
    broken[39] = float("nan")
    valid = torch.ones(40, dtype=torch.bool)
    valid[39] = False
    expected = nearest_other_class(embeddings, labels, 3, max_relative_similarity=0.5, valid=valid)
    # Before, the NaN row made its class centroid NaN and switched the margin guard off for the class.
    assert_same_lists(nearest_other_class(broken, labels, 3, max_relative_similarity=0.5), expected)


def test_labels_may_be_any_integers():
    gen = torch.Generator().manual_seed(4)
    embeddings, dense = torch.randn(30, 4, generator=gen), torch.arange(30) % 5
    sparse = torch.tensor([-7, 3, 10**9, 12, 40])[dense]  # negative and huge ids, in another order
    expected = nearest_other_class(embeddings, dense, 3, max_relative_similarity=0.9)
    assert_same_lists(nearest_other_class(embeddings, sparse, 3, max_relative_similarity=0.9), expected)
    sampler = NeighbourBatchSampler(sparse.numpy(), 2, 2, max_relative_similarity=0.9)
    sampler.update_neighbours(embeddings)  # raised an index error (or asked for terabytes) before
    sampler.set_epoch(1)
    assert np.array_equal(
        sampler._neighbours, nearest_other_class(embeddings, dense, 2, max_relative_similarity=0.9)[0]
    )


def assert_same_lists(ours, expected):
    assert np.array_equal(ours[0], expected[0]) and ours[1] == expected[1]


def groups(sampler, epoch):
    size = 2 + sampler.negatives_per_seed
    return sampler.global_batches(epoch).reshape(-1, size)


def test_every_group_is_a_seed_a_positive_and_other_class_negatives():
    labels = torch.arange(60) % 6
    sampler = NeighbourBatchSampler(labels, 3, 2, seed=1)
    for epoch in (0, 1):
        rows = groups(sampler, epoch)
        assert len(set(rows[:, 0].tolist())) == len(rows)  # every sample a seed at most once an epoch
        assert bool((labels[rows[:, 1]] == labels[rows[:, 0]]).all()) and bool(
            (rows[:, 1] != rows[:, 0]).all()
        )
        assert bool((labels[rows[:, 2:]] != labels[rows[:, :1]]).all())
    assert np.array_equal(sampler.global_batches(3), sampler.global_batches(3))
    assert not np.array_equal(sampler.global_batches(3), sampler.global_batches(4))


def test_the_snapshot_decides_the_negatives_from_the_next_epoch():
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(60) % 6
    embeddings = torch.randn(60, 4, generator=gen)
    sampler = NeighbourBatchSampler(labels, 3, 2, seed=1)
    sampler.set_epoch(1)
    before = sampler.global_batches(1)
    sampler.update_neighbours(embeddings)
    assert np.array_equal(sampler.global_batches(1), before)  # not before set_epoch
    sampler.set_epoch(1)
    rows = groups(sampler, 1)
    expected, _ = nearest_other_class(embeddings, labels, 2)
    assert np.array_equal(rows[:, 2:], expected[rows[:, 0]])
    restored = NeighbourBatchSampler(labels, 3, 2, seed=1)
    restored.load_state_dict(sampler.state_dict())
    assert restored.snapshot_fingerprint() == sampler.snapshot_fingerprint() != ""
    assert list(restored) == list(sampler)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.zeros(10, dtype=torch.int64), 2, 1), {}, "at least 2 classes"),
        ((torch.arange(10) % 2, 0, 1), {}, r"seeds_per_batch must be an integer in \[1, 3\], got 0"),
        (
            (torch.arange(10) % 2, 10**30, 1),
            {},
            r"seeds_per_batch must be an integer in \[1, 3\], got 10{30}",
        ),
        (
            (torch.arange(10) % 2, 2, 10**30),
            {},
            r"negatives_per_seed must be an integer in \[1, 3\], got 10{30}",
        ),
        ((torch.tensor([0, 1]), 1, 1), {}, "labels must hold at least 3 samples"),
        (
            (torch.arange(10) % 2, 1, 1),
            {"max_relative_similarity": 0},
            "max_relative_similarity must be a number > 0",
        ),
    ],
)
def test_bad_arguments_name_themselves(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        NeighbourBatchSampler(*args, **kwargs)


def test_a_missing_faiss_is_named_with_the_extra_that_installs_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "faiss" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"search='faiss' needs faiss.*composer-dynsample\[faiss\]"):
        NeighbourBatchSampler(torch.arange(10) % 2, 1, 1, search="faiss")
    with pytest.raises(ImportError, match="search='faiss_ivf' needs faiss"):
        nearest_other_class(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]), 1, search="faiss_ivf")


def test_an_unknown_search_is_named():
    with pytest.raises(ValueError, match="search must be one of"):
        NeighbourBatchSampler(torch.arange(10) % 2, 1, 1, search="hnsw")
