"""The corpus search's own inverted-file index (``search="ivf"``) and ``search="auto"``: recall against the
exact search on clustered pairs, exactness with every cell probed, determinism, and the arguments."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from composer_dynsample.samplers import _corpus_search, _ivf
from composer_dynsample.samplers._candidates import window_recall
from composer_dynsample.samplers._corpus_search import (
    CORPUS_SEARCHES,
    CorpusCandidates,
    check_corpus_search,
    corpus_candidates,
)
from composer_dynsample.samplers._ivf import InvertedFileIndex, ivf_cells

OPTIONS = {"skip_top": 3, "max_relative_similarity": 0.95}


def clustered_pairs(
    num_pairs: int, dim: int = 32, seed: int = 0
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Pairs around topics in a 16-dimensional subspace, as benchmarks/corpus_negatives.py builds them:
    pair ``k`` is rows ``2k`` (its anchor) and ``2k + 1`` (its positive), close to each other."""
    generator = torch.Generator().manual_seed(seed)
    basis = torch.randn(16, dim, generator=generator) / 4
    centres = torch.randn(max(2, num_pairs // 100), 16, generator=generator) @ basis
    topic = torch.randint(0, centres.shape[0], (num_pairs,), generator=generator)
    pair = centres[topic] + 0.25 * torch.randn(num_pairs, dim, generator=generator)
    rows = pair.repeat_interleave(2, dim=0)
    rows += 0.1 * torch.randn(rows.shape, generator=generator)
    return rows, np.arange(2 * num_pairs) // 2, np.arange(2 * num_pairs) % 2 == 1


def same(first: CorpusCandidates, second: CorpusCandidates) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.fixture(scope="module")
def pairs_8000():
    return clustered_pairs(8000)


def test_ivf_finds_most_of_the_exact_window_on_clustered_pairs(pairs_8000):
    embeddings, labels, is_passage = pairs_8000
    sample = np.arange(0, 8000, 7)
    exact = corpus_candidates(embeddings, labels, is_passage, 16, pairs=sample, **OPTIONS)
    approx = corpus_candidates(embeddings, labels, is_passage, 16, search="ivf", **OPTIONS)
    recall = window_recall(approx, exact, rows=sample)
    assert 0.9 <= recall < 1.0  # approximate: some windows lose a passage, most keep them all
    assert approx.searched.all() and approx.kept.sum() >= 0.9 * exact.kept.sum() * 8000 / sample.size


def test_ivf_probing_every_cell_gives_the_exact_lists(monkeypatch):
    embeddings, labels, is_passage = clustered_pairs(3000)
    embeddings[11] = embeddings[41]  # two equal passages: ties in row order
    texts = np.arange(labels.size) % 2500  # some duplicate texts: the guards see the same candidates
    monkeypatch.setattr(InvertedFileIndex, "_calibrate", lambda self, *args: self.near.shape[1])  # all 93
    options = {**OPTIONS, "duplicate_ids": texts}
    exact = corpus_candidates(embeddings, labels, is_passage, 12, **options)
    everywhere = corpus_candidates(embeddings, labels, is_passage, 12, search="ivf", **options)
    assert same(everywhere, exact)
    monkeypatch.setattr(InvertedFileIndex, "_calibrate", lambda self, *args: 1)
    one_cell = corpus_candidates(embeddings, labels, is_passage, 12, search="ivf", **options)
    assert window_recall(one_cell, exact) < 1.0  # one cell misses neighbours: the test can fail


def test_ivf_lists_are_a_pure_function_of_the_snapshot(pairs_8000):
    embeddings, labels, is_passage = pairs_8000
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = corpus_candidates(embeddings, labels, is_passage, 16, search="ivf", **OPTIONS)
        torch.set_num_threads(2)
        two = corpus_candidates(embeddings, labels, is_passage, 16, search="ivf", **OPTIONS)
    finally:
        torch.set_num_threads(threads)
    again = corpus_candidates(embeddings, labels, is_passage, 16, search="ivf", **OPTIONS)
    assert same(one, two) and same(one, again)
    subset = np.arange(5, 8000, 13)  # other anchors, in other blocks: each anchor's lists do not change
    part = corpus_candidates(
        embeddings, labels, is_passage, 16, search="ivf", pairs=subset, chunk_size=100, **OPTIONS
    )
    assert same(part, CorpusCandidates(*(field[subset] for field in one)))


def test_auto_is_exact_for_a_small_corpus_and_ivf_for_a_large_one(monkeypatch):
    embeddings, labels, is_passage = clustered_pairs(2000)
    auto = corpus_candidates(embeddings, labels, is_passage, 8, search="auto", **OPTIONS)
    assert same(auto, corpus_candidates(embeddings, labels, is_passage, 8, **OPTIONS))
    monkeypatch.setattr(_corpus_search, "EXACT_SEARCH_MAX_PASSAGES", 1999)
    auto = corpus_candidates(embeddings, labels, is_passage, 8, search="auto", **OPTIONS)
    assert same(auto, corpus_candidates(embeddings, labels, is_passage, 8, search="ivf", **OPTIONS))


@pytest.mark.parametrize("search", ["exact", "ivf"])
@pytest.mark.parametrize("device", [torch.device("cpu"), "cpu"])
def test_a_device_runs_the_search_there_with_the_same_lists(search, device):
    embeddings, labels, is_passage = clustered_pairs(1500)
    default = corpus_candidates(embeddings, labels, is_passage, 6, search=search, **OPTIONS)
    there = corpus_candidates(embeddings, labels, is_passage, 6, search=search, device=device, **OPTIONS)
    assert same(there, default)


def test_a_bad_search_is_one_line_naming_the_valid_ones():
    embeddings, labels, is_passage = clustered_pairs(50)
    with pytest.raises(ValueError) as raised:
        corpus_candidates(embeddings, labels, is_passage, 4, search="hnsw")
    message = str(raised.value)
    assert "\n" not in message and "'hnsw'" in message
    assert all(repr(name) in message for name in CORPUS_SEARCHES)


def test_only_the_faiss_searches_need_faiss(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "faiss" else real(name, *a)
    )
    assert [check_corpus_search(name) for name in ("auto", "exact", "ivf")] == ["auto", "exact", "ivf"]
    with pytest.raises(ImportError, match=r"search='faiss_ivf' needs faiss.*or use search='ivf'"):
        check_corpus_search("faiss_ivf")


def test_the_index_leaves_each_querys_own_row_out_and_pads_few_rows():
    rows = torch.nn.functional.normalize(
        torch.randn(300, 8, generator=torch.Generator().manual_seed(3)), dim=1
    )
    index = InvertedFileIndex(rows, probes=ivf_cells(300))  # every cell: the exact top-k
    found = index(rows[:20], torch.arange(20), 10)
    similarity = rows[:20] @ rows.T
    similarity[torch.arange(20), torch.arange(20)] = float("-inf")
    expected = similarity.topk(10, dim=1).indices.numpy()
    assert all(set(a) == set(b) for a, b in zip(found.tolist(), expected.tolist(), strict=True))
    few = InvertedFileIndex(rows[:5], probes=1)
    padded = few(rows[:2], torch.tensor([0, -1]), 8)
    assert sorted(padded[0].tolist()) == [-1] * 4 + [1, 2, 3, 4]
    assert sorted(padded[1].tolist()) == [-1] * 3 + [0, 1, 2, 3, 4]
    empty = InvertedFileIndex(rows[:0])
    assert (empty(rows[:3], torch.full((3,), -1), 4) == -1).all()


def test_the_probes_are_the_fewest_that_reach_the_recall_target():
    embeddings, _, _ = clustered_pairs(6000, seed=4)
    rows = torch.nn.functional.normalize(embeddings[1::2], dim=1)
    index = InvertedFileIndex(rows, neighbours=20)
    picked = torch.randperm(6000, generator=torch.Generator().manual_seed(0))[:256].sort().values
    queries = rows[picked]
    similarity = queries @ rows.T
    similarity[torch.arange(256), picked] = float("-inf")
    truth = similarity.topk(20, dim=1).indices

    def share(probes: int) -> float:
        found = InvertedFileIndex(rows, probes=probes)(queries, picked, 20)
        return float(np.mean([len(set(a) & set(b)) / 20 for a, b in zip(found.tolist(), truth.tolist())]))

    assert index.probes >= 1 and share(index.probes) >= _ivf.RECALL_TARGET
    if index.probes > 1:
        assert share(index.probes - 1) < _ivf.RECALL_TARGET


def test_window_recall_counts_the_exact_survivors_found():
    ranked = np.array([[4, 5, 6, 7], [1, 2, 3, -1], [9, 8, 7, 6]])
    kept = np.array([[0, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=bool)
    exact = CorpusCandidates(ranked, kept, np.zeros((3, 4), np.int64), np.array([True, True, True]))
    approx = exact._replace(ranked=np.array([[4, 5, 9, 7], [3, 2, 1, -1], [1, 1, 1, 1]]))
    # anchor 0: 5 and 7 of {5, 6, 7}; anchor 1: 2 of {2, 3} (3 was not kept); anchor 2: no exact survivor
    assert window_recall(approx, exact) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert window_recall(exact, exact) == 1.0
    whole = CorpusCandidates(*(None if f is None else np.concatenate([f, f]) for f in approx))
    assert window_recall(whole, exact, rows=np.array([3, 4, 5])) == window_recall(approx, exact)
    with pytest.raises(ValueError, match="approx and exact must cover the same anchors, got 6 and 3 rows"):
        window_recall(whole, exact)


def test_the_two_level_nearest_cell_is_mostly_the_nearest_and_keeps_the_search_exact(monkeypatch):
    embeddings, labels, is_passage = clustered_pairs(6000, seed=2)
    rows = torch.nn.functional.normalize(embeddings, dim=1)
    centres = _ivf._kmeans(rows, 300, 3)
    groups = _ivf._CentreGroups(centres)
    two_level, brute = groups.nearest(rows), _ivf._nearest_centre(rows, centres)
    assert (two_level >= 0).all() and float((two_level == brute).float().mean()) > 0.97
    monkeypatch.setattr(_ivf, "_TWO_LEVEL_CELLS", 16)  # the corpus IVF's cells in two levels too
    monkeypatch.setattr(InvertedFileIndex, "_calibrate", lambda self, *args: self.near.shape[1])
    exact = corpus_candidates(embeddings[:1200], labels[:1200], is_passage[:1200], 8, **OPTIONS)
    approx = corpus_candidates(
        embeddings[:1200], labels[:1200], is_passage[:1200], 8, search="ivf", **OPTIONS
    )
    assert same(approx, exact)  # 18 cells, every one probed: exact, whichever cell a row was put in
