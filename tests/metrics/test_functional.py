"""The functional retrieval metrics against a plain brute-force reference and against PML."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from composer_dynsample.metrics import (
    count_queries_without_positive,
    mean_average_precision_at_r,
    r_precision,
    retrieval_metrics,
    retrieval_recall_at_k,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def brute_force(query, query_labels, gallery, gallery_labels, ks, distance):
    """Recall@K, MAP@R and R-precision with Python loops; ``gallery=None`` means leave-one-out.

    Distances are computed in float64 from plain lists; ties are ranked by gallery index.
    Returns the metrics and the smallest gap between two distinct distances of one query (near-tie check).
    """
    query = query.double().tolist()
    query_labels = query_labels.tolist()
    leave_one_out = gallery is None
    gallery = query if leave_one_out else gallery.double().tolist()
    gallery_labels = query_labels if leave_one_out else gallery_labels.tolist()

    def dist(a, b):
        if distance == "euclidean":
            return sum((x - y) ** 2 for x, y in zip(a, b))
        norm_a = math.sqrt(sum(x * x for x in a))
        norm_b = math.sqrt(sum(y * y for y in b))
        if norm_a == 0 or norm_b == 0:
            return 0.0
        return -sum(x * y for x, y in zip(a, b)) / (norm_a * norm_b)

    recalls = {k: [] for k in ks}
    aps, rps = [], []
    min_gap = math.inf
    for i, (q, label) in enumerate(zip(query, query_labels)):
        candidates = [j for j in range(len(gallery)) if not (leave_one_out and j == i)]
        distances = {j: dist(q, gallery[j]) for j in candidates}
        values = sorted(set(distances.values()))
        for a, b in itertools.pairwise(values):
            min_gap = min(min_gap, b - a)
        ranked = sorted(candidates, key=lambda j: (distances[j], j))
        relevant = [gallery_labels[j] == label for j in ranked]
        r = sum(relevant)
        if r == 0:
            continue
        for k in ks:
            recalls[k].append(float(any(relevant[:k])))
        rps.append(sum(relevant[:r]) / r)
        ap = 0.0
        hits = 0
        for position in range(r):
            if relevant[position]:
                hits += 1
                ap += hits / (position + 1)
        aps.append(ap / r)

    def mean(values):
        return sum(values) / len(values) if values else math.nan

    result = {f"recall_at_{k}": mean(recalls[k]) for k in ks}
    result["map_at_r"] = mean(aps)
    result["r_precision"] = mean(rps)
    return result, min_gap


def assert_matches(result, expected):
    assert set(result) == set(expected)
    for name, value in expected.items():
        got = result[name].item()
        if math.isnan(value):
            assert math.isnan(got), name
        else:
            assert got == pytest.approx(value, abs=1e-6), name


@st.composite
def integer_problems(draw):
    """Small integer embeddings (so squared euclidean distances are exact and ties are common)."""
    dim = draw(st.integers(1, 3))
    n_query = draw(st.integers(1, 12))
    n_classes = draw(st.integers(1, 4))
    values = st.integers(-3, 3)
    query = torch.tensor(
        draw(st.lists(st.lists(values, min_size=dim, max_size=dim), min_size=n_query, max_size=n_query))
    )
    query_labels = torch.tensor(
        draw(st.lists(st.integers(0, n_classes - 1), min_size=n_query, max_size=n_query))
    )
    if draw(st.booleans()):
        gallery, gallery_labels = None, None
    else:
        n_gallery = draw(st.integers(1, 12))
        gallery = torch.tensor(
            draw(
                st.lists(st.lists(values, min_size=dim, max_size=dim), min_size=n_gallery, max_size=n_gallery)
            )
        )
        gallery_labels = torch.tensor(
            draw(st.lists(st.integers(0, n_classes), min_size=n_gallery, max_size=n_gallery))
        )
    ks = tuple(sorted(draw(st.sets(st.integers(1, 14), min_size=1, max_size=3))))
    return query, query_labels, gallery, gallery_labels, ks, draw(st.integers(1, 5))


@SETTINGS
@given(problem=integer_problems(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_euclidean_matches_brute_force_with_ties(problem, dtype):
    query, query_labels, gallery, gallery_labels, ks, chunk_size = problem
    expected, _ = brute_force(query, query_labels, gallery, gallery_labels, ks, "euclidean")
    result = retrieval_metrics(
        query.to(dtype),
        query_labels,
        None if gallery is None else gallery.to(dtype),
        gallery_labels,
        ks=ks,
        distance="euclidean",
        chunk_size=chunk_size,
    )
    assert_matches(result, expected)


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    n_query=st.integers(1, 15),
    n_gallery=st.integers(0, 15),
    n_classes=st.integers(1, 5),
    dim=st.integers(1, 4),
    ks=st.sets(st.integers(1, 16), min_size=1, max_size=3),
    chunk_size=st.integers(1, 6),
    distance=st.sampled_from(["cosine", "euclidean"]),
)
def test_random_embeddings_match_brute_force(
    seed, n_query, n_gallery, n_classes, dim, ks, chunk_size, distance
):
    """Continuous embeddings (no ties); ``n_gallery == 0`` means leave-one-out."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(n_query, dim, generator=generator)
    query_labels = torch.randint(0, n_classes, (n_query,), generator=generator)
    gallery = torch.randn(n_gallery, dim, generator=generator) if n_gallery else None
    gallery_labels = torch.randint(0, n_classes, (n_gallery,), generator=generator) if n_gallery else None
    ks = tuple(sorted(ks))
    expected, min_gap = brute_force(query, query_labels, gallery, gallery_labels, ks, distance)
    assume(min_gap > 1e-5)  # float32 rounding cannot reorder the ranking
    result = retrieval_metrics(
        query, query_labels, gallery, gallery_labels, ks=ks, distance=distance, chunk_size=chunk_size
    )
    assert_matches(result, expected)


def test_single_metric_functions_agree_with_the_dict():
    generator = torch.Generator().manual_seed(0)
    query, labels = torch.randn(30, 4, generator=generator), torch.randint(0, 3, (30,), generator=generator)
    gallery, gallery_labels = (
        torch.randn(20, 4, generator=generator),
        torch.randint(0, 3, (20,), generator=generator),
    )
    for args in [(query, labels), (query, labels, gallery, gallery_labels)]:
        everything = retrieval_metrics(*args, ks=(1, 3))
        assert torch.equal(retrieval_recall_at_k(*args, k=3), everything["recall_at_3"])
        assert torch.equal(retrieval_recall_at_k(*args), everything["recall_at_1"])
        assert torch.equal(mean_average_precision_at_r(*args), everything["map_at_r"])
        assert torch.equal(r_precision(*args), everything["r_precision"])


def test_ties_are_ranked_by_gallery_index():
    # Query at 0; gallery items 0..3 all at distance 1. Only item 2 shares the label.
    query = torch.tensor([[0.0]])
    gallery = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    gallery_labels = torch.tensor([5, 5, 7, 5])
    result = retrieval_metrics(
        query, torch.tensor([7]), gallery, gallery_labels, ks=(1, 2, 3), distance="euclidean"
    )
    assert result["recall_at_1"].item() == 0.0
    assert result["recall_at_2"].item() == 0.0
    assert result["recall_at_3"].item() == 1.0
    assert result["map_at_r"].item() == 0.0  # R = 1, and the only positive ranks third
    # A duplicate of the query itself in leave-one-out is a tie with nothing: self is excluded by index.
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert retrieval_metrics(emb, torch.tensor([0, 0, 1]), ks=1)["recall_at_1"].item() == 1.0


def test_outputs_are_float32_scalars_and_nan_without_positives():
    result = retrieval_metrics(torch.randn(3, 2), torch.tensor([0, 1, 2]))
    assert set(result) == {"recall_at_1", "recall_at_5", "map_at_r", "r_precision"}
    for value in result.values():
        assert value.dtype == torch.float32 and value.ndim == 0 and torch.isnan(value)
    one_item = retrieval_metrics(torch.randn(1, 2), torch.tensor([0]), ks=1)
    assert torch.isnan(one_item["recall_at_1"])


def test_queries_without_positives_are_skipped():
    query = torch.tensor([[0.0], [10.0]])
    gallery, gallery_labels = torch.tensor([[0.1], [5.0]]), torch.tensor([0, 1])
    result = retrieval_metrics(
        query, torch.tensor([0, 9]), gallery, gallery_labels, ks=1, distance="euclidean"
    )
    assert result["recall_at_1"].item() == 1.0 and result["map_at_r"].item() == 1.0


def test_queries_without_positives_are_counted_and_said():
    # They were dropped without a word: 3 queries scored as if they were 2, or NaN with no reason.
    query = torch.tensor([[0.0], [10.0], [5.2]])
    gallery, gallery_labels = torch.tensor([[0.1], [5.0]]), torch.tensor([0, 1])
    some = (
        r"^1 of 3 queries have no item of their label in the gallery; the metrics average over the "
        r"other 2 \(as pytorch-metric-learning's AccuracyCalculator does\)\.$"
    )
    with pytest.warns(UserWarning, match=some):
        result = retrieval_metrics(
            query, torch.tensor([0, 9, 1]), gallery, gallery_labels, ks=1, distance="euclidean"
        )
    assert result["recall_at_1"].item() == 1.0
    assert count_queries_without_positive(torch.tensor([0, 9, 1]), gallery_labels) == 1
    none = (
        r"^none of the 2 queries has an item of its label in the gallery, so every metric is NaN; "
        r"are the queries' classes in the gallery\?$"
    )
    with pytest.warns(UserWarning, match=none):
        result = retrieval_recall_at_k(query[:2], torch.tensor([7, 9]), gallery, gallery_labels)
    assert torch.isnan(result)
    assert count_queries_without_positive(torch.tensor([7, 9]), gallery_labels) == 2
    labels = torch.tensor([0, 0, 1, 2])  # leave-one-out: 1 and 2 have no other item
    with pytest.warns(
        UserWarning, match=r"^2 of 4 queries have no other item of their label in the gallery;"
    ):
        mean_average_precision_at_r(torch.randn(4, 3), labels)
    assert count_queries_without_positive(labels) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every query has a positive: nothing to say
        retrieval_metrics(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))
    assert count_queries_without_positive(torch.tensor([0, 0, 1, 1])) == 0


def test_k_beyond_the_gallery_means_the_whole_gallery():
    emb, labels = torch.randn(6, 3), torch.tensor([0, 0, 1, 1, 2, 2])
    assert retrieval_recall_at_k(emb, labels, k=100).item() == 1.0


def test_perfect_clusters_score_one():
    centers = torch.eye(4) * 10
    emb = centers.repeat_interleave(5, 0) + 0.01 * torch.randn(20, 4)
    labels = torch.arange(4).repeat_interleave(5)
    for distance in ("cosine", "euclidean"):
        for value in retrieval_metrics(emb, labels, distance=distance).values():
            assert value.item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ks": 0}, ValueError, "ks must hold integers >= 1"),
        ({"ks": (1, 1)}, ValueError, "must not repeat"),
        ({"ks": ()}, ValueError, "at least one"),
        ({"ks": (True,)}, ValueError, "ks must hold integers"),
        ({"distance": "manhattan"}, ValueError, "distance must be one of"),
        ({"chunk_size": 0}, ValueError, "chunk_size must be an integer >= 1"),
    ],
)
def test_bad_options_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        retrieval_metrics(torch.randn(4, 2), torch.tensor([0, 0, 1, 1]), **kwargs)


def test_bad_inputs_raise():
    emb, labels = torch.randn(4, 2), torch.tensor([0, 0, 1, 1])
    with pytest.raises(
        TypeError,
        match=r"query_embeddings must be a 2-D floating-point tensor .*got an object of type ndarray",
    ):
        retrieval_metrics(np.zeros((4, 2)), labels)
    with pytest.raises(
        TypeError, match=r"query_embeddings must be a 2-D floating-point tensor .*dtype torch\.int64"
    ):
        retrieval_metrics(torch.zeros(4, 2, dtype=torch.int64), labels)
    with pytest.raises(ValueError, match=r"query_embeddings must be a 2-D .* got a tensor of shape \(4,\)"):
        retrieval_metrics(torch.zeros(4), labels)
    with pytest.raises(ValueError, match="query_embeddings contain NaN or inf"):
        retrieval_metrics(torch.tensor([[0.0, float("nan")]] * 4), labels)
    with pytest.raises(TypeError, match=r"query_labels must be a 1-D integer tensor, .*dtype torch\.float32"):
        retrieval_metrics(emb, labels.float())
    with pytest.raises(ValueError, match="query_labels has 3 entries but query_embeddings has 4 rows"):
        retrieval_metrics(emb, labels[:3])
    with pytest.raises(ValueError, match="must be given together"):
        retrieval_metrics(emb, labels, emb)
    with pytest.raises(ValueError, match="gallery_embeddings has dimension 3 but query_embeddings 2"):
        retrieval_metrics(emb, labels, torch.randn(4, 3), labels)
    with pytest.raises(ValueError, match="gallery_labels has 4 entries but gallery_embeddings has 5 rows"):
        retrieval_metrics(emb, labels, torch.randn(5, 2), labels)
    with pytest.raises(ValueError, match="k must be"):
        retrieval_recall_at_k(emb, labels, k=0)


# --- pytorch-metric-learning's AccuracyCalculator (with its torch k-NN: faiss is not installed) ---


def pml_reference(query, query_labels, gallery, gallery_labels, distance):
    accuracy_calculator = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
    from pytorch_metric_learning.utils.inference import CustomKNN

    pml_distance = CosineSimilarity() if distance == "cosine" else LpDistance(normalize_embeddings=False)
    calculator = accuracy_calculator.AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        device=torch.device("cpu"),
        knn_func=CustomKNN(pml_distance),
    )
    if gallery is None:
        return calculator.get_accuracy(query, query_labels)  # reference = query, ref_includes_query=True
    return calculator.get_accuracy(query, query_labels, gallery, gallery_labels, ref_includes_query=False)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_matches_pml_accuracy_calculator(distance, leave_one_out):
    generator = torch.Generator().manual_seed(1)
    # Overlapping noisy clusters, so that no metric is trivially 0 or 1; label 9 has no gallery positives.
    centers = torch.randn(6, 8, generator=generator)
    query_labels = torch.randint(0, 6, (120,), generator=generator)
    query = centers[query_labels] + 0.9 * torch.randn(120, 8, generator=generator)
    query_labels[:3] = 9
    gallery = gallery_labels = None
    if not leave_one_out:
        gallery_labels = torch.randint(0, 6, (150,), generator=generator)
        gallery = centers[gallery_labels] + 0.9 * torch.randn(150, 8, generator=generator)
    expected = pml_reference(query, query_labels, gallery, gallery_labels, distance)
    result = retrieval_metrics(
        query, query_labels, gallery, gallery_labels, ks=1, distance=distance, chunk_size=32
    )
    assert 0.1 < result["map_at_r"].item() < 0.9
    assert result["recall_at_1"].item() == pytest.approx(expected["precision_at_1"], abs=1e-6)
    assert result["map_at_r"].item() == pytest.approx(expected["mean_average_precision_at_r"], abs=1e-6)
    assert result["r_precision"].item() == pytest.approx(expected["r_precision"], abs=1e-6)


def test_empty_gallery_raises_like_set_gallery():
    """An empty gallery is an error, as in ``RetrievalMetric.set_gallery``, not NaN for every metric."""
    query = torch.randn(4, 3)
    labels = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="gallery must hold at least one item, got 0"):
        retrieval_metrics(query, labels, torch.empty(0, 3), torch.empty(0, dtype=torch.int64))


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_embeddings_near_1e20_rank_as_in_float64(distance):
    """float32 embeddings whose squared norms overflow float32 are ranked in float64, not on inf/NaN keys."""
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(40, 8, generator=gen, dtype=torch.float64) * 1e20
    labels = torch.randint(0, 4, (40,), generator=gen)
    gallery = torch.randn(30, 8, generator=gen, dtype=torch.float64) * 3e19
    gallery_labels = torch.randint(0, 4, (30,), generator=gen)
    for args in (
        (emb, labels),
        (emb, labels, gallery, gallery_labels),
        (gallery, gallery_labels, emb, labels),
    ):
        ours = retrieval_metrics(
            *(t.float() if t.is_floating_point() else t for t in args), distance=distance
        )
        reference = retrieval_metrics(
            *(t.float().double() if t.is_floating_point() else t for t in args), distance=distance
        )
        assert {k: v.item() for k, v in ours.items()} == pytest.approx(
            {k: v.item() for k, v in reference.items()}
        )


def test_numpy_integers_are_accepted_for_ks_k_and_chunk_size():
    emb, labels = (
        torch.randn(6, 2, generator=torch.Generator().manual_seed(0)),
        torch.tensor([0, 0, 1, 1, 2, 2]),
    )
    ours = retrieval_metrics(emb, labels, ks=(np.int64(1), np.int32(2)), chunk_size=np.int64(4))
    assert ours == retrieval_metrics(emb, labels, ks=(1, 2), chunk_size=4)
    assert (
        retrieval_recall_at_k(emb, labels, k=np.int64(2))
        == retrieval_metrics(emb, labels, ks=(2,))["recall_at_2"]
    )
