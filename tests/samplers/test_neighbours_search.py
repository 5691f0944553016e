"""``nearest_other_class`` searches: exact against a float64 brute force, faiss against exact, the sampler on faiss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample.samplers.neighbours import NeighbourBatchSampler, nearest_other_class
from tests.samplers.helpers import all_ranks

faiss = pytest.importorskip("faiss")


def brute_force(embeddings, labels, k, valid=None):
    """Each valid row's ``k`` most similar valid other-class rows by float64 cosine similarity, ties by
    index; a row of -1 for a row without an embedding."""
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    valid = torch.ones(len(labels), dtype=torch.bool) if valid is None else valid
    rows = []
    for i in range(len(labels)):
        similarity = (unit @ unit[i]).tolist()
        others = [j for j in range(len(labels)) if labels[j] != labels[i] and valid[j] and valid[i]]
        rows.append((sorted(others, key=lambda j: (-similarity[j], j))[:k] + [-1] * k)[:k])
    return np.array(rows)


def clustered(n, classes, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    centres = torch.randn(classes, dim, generator=gen)
    return centres[labels] + 0.5 * torch.randn(n, dim, generator=gen), labels


@pytest.mark.parametrize("search", ["exact", "faiss"])
def test_searches_equal_a_float64_brute_force_with_ties_in_index_order(search):
    gen = torch.Generator().manual_seed(3)
    embeddings, labels = torch.randn(120, 6, generator=gen), torch.randint(0, 8, (120,), generator=gen)
    embeddings[60:90] = embeddings[10:40] * 2.0  # the same directions: exact ties in cosine similarity
    valid = torch.rand(120, generator=gen) > 0.1
    ours, _ = nearest_other_class(embeddings, labels, 5, valid=valid, chunk_size=37, search=search)
    assert np.array_equal(ours, brute_force(embeddings, labels, 5, valid))


@pytest.mark.parametrize(
    "options", [{}, {"skip_top": 2}, {"max_relative_similarity": 0.9}, {"skip_top": 1, "chunk_size": 50}]
)
def test_faiss_returns_the_exact_lists_and_guard_counts(options):
    embeddings, labels = clustered(400, 40, 8, seed=0)
    exact = nearest_other_class(embeddings, labels, 4, **options)
    flat = nearest_other_class(embeddings, labels, 4, search="faiss", **options)
    assert np.array_equal(flat[0], exact[0]) and flat[1] == exact[1]


def test_faiss_ivf_finds_most_exact_neighbours_on_any_number_of_threads():
    embeddings, labels = clustered(3000, 300, 32, seed=1)
    valid = torch.ones(3000, dtype=torch.bool)
    valid[::40] = False
    exact, _ = nearest_other_class(embeddings, labels, 5, valid=valid)
    approximate, _ = nearest_other_class(embeddings, labels, 5, valid=valid, search="faiss_ivf")
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(exact, approximate)])
    assert recall >= 0.8, recall
    found = approximate[approximate >= 0]
    assert bool(valid[found].all())
    rows = np.repeat(np.arange(3000)[:, None], 5, axis=1)[approximate >= 0]
    assert bool((labels[found] != labels[rows]).all())
    threads = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)
        again, _ = nearest_other_class(embeddings, labels, 5, valid=valid, search="faiss_ivf")
    finally:
        faiss.omp_set_num_threads(threads)
    assert np.array_equal(again, approximate)  # a pure function of the table, whatever the threads


def test_the_sampler_on_faiss_gives_the_exact_samplers_batches_on_every_rank():
    embeddings, labels = clustered(240, 12, 8, seed=2)

    def build(search):
        def factory(rank):
            sampler = NeighbourBatchSampler(labels, 4, 2, num_replicas=3, rank=rank, seed=5, search=search)
            sampler.update_neighbours(embeddings)
            sampler.set_epoch(1)
            return sampler

        return all_ranks(factory, 3)

    exact, flat = build("exact"), build("faiss")
    assert len({len(s) for s in flat}) == 1
    rows = [np.asarray(list(s)).reshape(-1, 4) for s in flat]
    seeds = np.concatenate([r[:, 0] for r in rows])
    assert np.unique(seeds).size == seeds.size  # disjoint shards of seeds
    for r in rows:
        assert bool((labels[r[:, 1]] == labels[r[:, 0]]).all())
        assert bool((labels[r[:, 2:]] != labels[r[:, :1]]).all())
    assert [list(s) for s in flat] == [list(s) for s in exact]
    assert flat[0].snapshot_fingerprint() == exact[0].snapshot_fingerprint()
