"""The torchmetrics classes: accumulation, reset, the two modes, state reductions and the empty-rank sync."""

from __future__ import annotations

import copy
import itertools
import math
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_dynsample.metrics import (
    MeanAveragePrecisionAtR,
    RetrievalMetrics,
    RetrievalRecallAtK,
    RPrecision,
    retrieval_metrics,
    retrieval_recall_at_k,
)

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def clustered(n, num_classes=4, dim=6, seed=0, noise=0.8):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1234))
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    return centers[labels] + noise * torch.randn(n, dim, generator=generator), labels


def assert_dicts_close(a, b):
    assert set(a) == set(b)
    for name in a:
        x, y = a[name].item(), b[name].item()
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, abs=1e-6), name


def split_points(draw_sizes, n):
    cuts = sorted(set(min(c, n) for c in draw_sizes))
    return [0, *cuts, n]


@SETTINGS
@given(
    n=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    with_gallery=st.booleans(),
    distance=st.sampled_from(["cosine", "euclidean"]),
    seed=st.integers(0, 1000),
)
def test_many_updates_equal_one_call_on_the_concatenation(n, cuts, with_gallery, distance, seed):
    emb, labels = clustered(n, seed=seed)
    gallery, gallery_labels = clustered(25, seed=seed + 1) if with_gallery else (None, None)
    metric = RetrievalMetrics(
        ks=(1, 3), distance=distance, gallery_embeddings=gallery, gallery_labels=gallery_labels, chunk_size=7
    )
    bounds = split_points(cuts, n)
    for start, stop in itertools.pairwise(bounds):
        metric.update(emb[start:stop], labels[start:stop])  # includes empty batches
    expected = retrieval_metrics(emb, labels, gallery, gallery_labels, ks=(1, 3), distance=distance)
    assert_dicts_close(metric.compute(), expected)


def test_reset_forgets_the_data_but_keeps_the_gallery():
    gallery, gallery_labels = clustered(30, seed=1)
    metric = RetrievalMetrics(gallery_embeddings=gallery, gallery_labels=gallery_labels)
    first, first_labels = clustered(20, seed=2)
    metric.update(first, first_labels)
    metric.reset()
    assert metric.has_gallery
    second, second_labels = clustered(20, seed=3)
    metric.update(second, second_labels)
    assert_dicts_close(metric.compute(), retrieval_metrics(second, second_labels, gallery, gallery_labels))

    loo = RetrievalMetrics()
    loo.update(first, first_labels)
    loo.reset()
    loo.update(second, second_labels)
    assert_dicts_close(loo.compute(), retrieval_metrics(second, second_labels))


def test_set_and_clear_gallery_switch_modes_and_reset():
    emb, labels = clustered(30, seed=4)
    gallery, gallery_labels = clustered(40, seed=5)
    metric = RetrievalMetrics(ks=(1, 2))
    metric.update(emb, labels)
    assert not metric.has_gallery
    assert_dicts_close(metric.compute(), retrieval_metrics(emb, labels, ks=(1, 2)))

    metric.set_gallery(gallery, gallery_labels)  # resets: the leave-one-out data is gone
    assert metric.has_gallery and metric.labels == [] and metric._update_count == 0
    metric.update(emb, labels)
    query_gallery = retrieval_metrics(emb, labels, gallery, gallery_labels, ks=(1, 2))
    assert_dicts_close(metric.compute(), query_gallery)
    assert not torch.allclose(query_gallery["map_at_r"], retrieval_metrics(emb, labels)["map_at_r"])

    metric.clear_gallery()
    assert not metric.has_gallery and int(metric.num_valid) == 0
    metric.update(emb, labels)
    assert_dicts_close(metric.compute(), retrieval_metrics(emb, labels, ks=(1, 2)))


def test_scalar_metrics_match_the_dict():
    emb, labels = clustered(50, seed=6)
    gallery, gallery_labels = clustered(30, seed=7)
    for gallery_kwargs in ({}, {"gallery_embeddings": gallery, "gallery_labels": gallery_labels}):
        expected = retrieval_metrics(emb, labels, **gallery_kwargs, ks=(1, 4), distance="euclidean")
        metrics = {
            "recall_at_1": RetrievalRecallAtK(distance="euclidean", **gallery_kwargs),
            "recall_at_4": RetrievalRecallAtK(4, distance="euclidean", **gallery_kwargs),
            "map_at_r": MeanAveragePrecisionAtR(distance="euclidean", **gallery_kwargs),
            "r_precision": RPrecision(distance="euclidean", **gallery_kwargs),
        }
        for name, metric in metrics.items():
            metric.update(emb[:20], labels[:20])
            metric.update(emb[20:], labels[20:])
            value = metric.compute()
            assert value.ndim == 0 and value.dtype == torch.float32
            assert value.item() == pytest.approx(expected[name].item(), abs=1e-6), name


def test_compute_without_data_is_nan():
    for metric in (
        RetrievalMetrics(),
        RetrievalMetrics(gallery_embeddings=torch.randn(3, 2), gallery_labels=torch.arange(3)),
    ):
        with pytest.warns(UserWarning, match="before the ``update``"):
            result = metric.compute()
        assert all(torch.isnan(value) for value in result.values())


def test_queries_without_positives_are_counted_over_updates():
    gallery, gallery_labels = torch.tensor([[0.0], [5.0]]), torch.tensor([0, 1])
    metric = RetrievalMetrics(1, "euclidean", gallery_embeddings=gallery, gallery_labels=gallery_labels)
    metric.update(torch.tensor([[0.1], [9.0]]), torch.tensor([0, 9]))
    other_rank = RetrievalMetrics(1, "euclidean", gallery_embeddings=gallery, gallery_labels=gallery_labels)
    other_rank.update(torch.tensor([[4.0], [1.0], [2.0]]), torch.tensor([1, 8, 8]))
    metric.merge_state(other_rank)  # the counts add up across ranks, as a sync does
    with pytest.warns(
        UserWarning, match=r"^3 of 5 queries have no item of their label in the gallery; .* other 2 "
    ):
        assert metric.compute()["recall_at_1"].item() == 1.0
    loo = RetrievalRecallAtK(k=1)
    loo.update(torch.randn(3, 2), torch.tensor([0, 0, 4]))
    with pytest.warns(
        UserWarning, match=r"^1 of 3 queries have no other item of their label in the gallery;"
    ):
        loo.compute()


def test_states_reduce_with_cat_and_sum():
    """``merge_state`` applies each state's ``dist_reduce_fx``: what a sync across ranks does."""
    emb, labels = clustered(40, seed=8)
    gallery, gallery_labels = clustered(30, seed=9)
    for gallery_kwargs in ({}, {"gallery_embeddings": gallery, "gallery_labels": gallery_labels}):
        rank0, rank1 = RetrievalMetrics(**gallery_kwargs), RetrievalMetrics(**gallery_kwargs)
        rank0.update(emb[:15], labels[:15])
        rank1.update(emb[15:], labels[15:])
        rank0.merge_state(rank1)
        assert_dicts_close(rank0.compute(), retrieval_metrics(emb, labels, **gallery_kwargs))
    loo = RetrievalMetrics()
    assert loo._reductions["embeddings"].__name__ == "dim_zero_cat"
    assert loo._reductions["labels"].__name__ == "dim_zero_cat"
    assert all(
        loo._reductions[name].__name__ == "dim_zero_sum"
        for name in ("recall_hits", "ap_sum", "r_precision_sum", "num_valid", "num_queries")
    )


def simulated_two_rank_sync(rank0, rank1):
    """Run ``_sync_dist`` on both metrics with a fake all-gather, checking what a real one needs.

    A real all-gather needs the same dtype and number of dimensions on every rank; the fake records
    rank 1's tensors, then hands them to rank 0 in the same order.
    """
    recorded = []

    def record(tensor, group=None):
        recorded.append(tensor.clone())
        return [tensor]

    def play(tensor, group=None):
        other = recorded.pop(0)
        assert other.dtype == tensor.dtype and other.ndim == tensor.ndim, (
            tensor.dtype,
            other.dtype,
            tensor.shape,
            other.shape,
        )
        return [tensor, other]

    rank1._sync_dist(dist_sync_fn=record)
    rank0._sync_dist(dist_sync_fn=play)
    assert not recorded


@pytest.mark.parametrize("empty_rank", [0, 1])
def test_sync_with_a_rank_without_data(empty_rank):
    emb, labels = clustered(30, seed=10)
    ranks = [RetrievalMetrics(ks=(1, 2)), RetrievalMetrics(ks=(1, 2))]
    ranks[1 - empty_rank].update(emb, labels)
    simulated_two_rank_sync(*ranks)
    assert ranks[0].labels.dtype == torch.int64
    assert_dicts_close(ranks[0]._compute_dict(), retrieval_metrics(emb, labels, ks=(1, 2)))


def test_sync_of_two_ranks_with_data():
    emb, labels = clustered(30, seed=11)
    ranks = [RetrievalMetrics(), RetrievalMetrics()]
    ranks[0].update(emb[:10], labels[:10])
    ranks[0].update(emb[10:12], labels[10:12])
    ranks[1].update(emb[12:], labels[12:])
    simulated_two_rank_sync(*ranks)
    assert_dicts_close(ranks[0]._compute_dict(), retrieval_metrics(emb, labels))


def test_embeddings_are_stored_in_the_metric_dtype():
    metric = RetrievalMetrics()
    metric.update(torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 0, 1, 1]))
    assert metric.embeddings[0].dtype == torch.float32 and metric.embeddings[0].shape == (12,)


def test_forward_returns_the_batch_value_and_accumulates():
    emb, labels = clustered(30, seed=12)
    metric = RetrievalMetrics()
    batch_value = metric(emb[:15], labels[:15])
    assert_dicts_close(batch_value, retrieval_metrics(emb[:15], labels[:15]))
    metric(emb[15:], labels[15:])
    assert_dicts_close(metric.compute(), retrieval_metrics(emb, labels))


def test_deepcopy_pickle_and_to_keep_the_gallery():
    gallery, gallery_labels = clustered(20, seed=13)
    emb, labels = clustered(10, seed=14)
    metric = RetrievalRecallAtK(2, gallery_embeddings=gallery, gallery_labels=gallery_labels)
    for clone in (copy.deepcopy(metric), pickle.loads(pickle.dumps(metric)), metric.to("cpu")):
        assert clone.has_gallery
        clone.update(emb, labels)
        expected = retrieval_metrics(emb, labels, gallery, gallery_labels, ks=2)["recall_at_2"]
        assert clone.compute().item() == pytest.approx(expected.item())
    assert "_gallery" not in "".join(metric.state_dict())


@pytest.mark.parametrize("cast", ["set_dtype", "bfloat16"])
def test_a_dtype_cast_leaves_the_gallery_as_it_was_prepared(cast):
    # bf16 holds integers exactly only up to 256: cast labels 256 and 257 would both become 256, and
    # cast gallery rows would tie. Before, both casts changed the gallery and the result.
    query, query_labels = torch.tensor([[1.0, 0.0]]), torch.tensor([256])
    for gallery, gallery_labels in (
        (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([257, 256])),
        (torch.tensor([[1.0, 0.01003], [1.0, 0.01001]]), torch.tensor([1, 256])),
    ):
        metric = RetrievalRecallAtK(k=1, gallery_embeddings=gallery, gallery_labels=gallery_labels)
        metric = metric.set_dtype(torch.bfloat16) if cast == "set_dtype" else metric.bfloat16()
        metric.update(query, query_labels)
        expected = retrieval_recall_at_k(query, query_labels, gallery, gallery_labels, k=1)
        assert metric.compute().item() == expected.item()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="ks must hold integers >= 1"):
        RetrievalMetrics(ks=(0,))
    with pytest.raises(ValueError, match="at least one"):
        RetrievalMetrics(ks=())
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        RetrievalRecallAtK(0)
    with pytest.raises(ValueError, match="distance must be one of"):
        RPrecision(distance="dot")
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        MeanAveragePrecisionAtR(chunk_size=0)
    with pytest.raises(ValueError, match="given together"):
        RetrievalMetrics(gallery_embeddings=torch.randn(3, 2))
    metric = RetrievalMetrics()
    with pytest.raises(ValueError, match="the gallery must hold at least one item"):
        metric.set_gallery(torch.empty(0, 2), torch.empty(0, dtype=torch.int64))
    with pytest.raises(TypeError, match="gallery labels must be a 1-D integer tensor"):
        metric.set_gallery(torch.randn(3, 2), torch.zeros(3))
    metric.update(torch.randn(3, 2), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="embeddings have dim 4 but earlier batches had dim 2"):
        metric.update(torch.randn(3, 4), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="labels has 2 entries but embeddings has 3 rows"):
        metric.update(torch.randn(3, 2), torch.tensor([0, 1]))
    metric.set_gallery(torch.randn(5, 2), torch.arange(5))
    with pytest.raises(ValueError, match="embeddings have dim 3 but the gallery has dim 2"):
        metric.update(torch.randn(3, 3), torch.tensor([0, 1, 1]))


def test_queries_near_1e20_against_a_float32_gallery_rank_as_in_float64():
    """The gallery (1e18) fits float32, the queries (1e20) do not: the gallery is widened for them."""
    gen = torch.Generator().manual_seed(0)
    gallery = torch.randn(30, 8, generator=gen, dtype=torch.float64) * 1e18
    gallery_labels = torch.randint(0, 4, (30,), generator=gen)
    queries = torch.randn(40, 8, generator=gen, dtype=torch.float64) * 1e20
    labels = torch.randint(0, 4, (40,), generator=gen)
    results = []
    for dtype in (torch.float32, torch.float64):
        metric = RetrievalMetrics(distance="euclidean")
        metric.set_gallery(gallery.float().to(dtype), gallery_labels)  # the same numbers in both
        metric.update(queries.float().to(dtype), labels)
        results.append({k: v.item() for k, v in metric.compute().items()})
    assert results[0] == pytest.approx(results[1])
