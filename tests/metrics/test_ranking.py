"""Ranking metrics against a brute-force reference, torchmetrics' retrieval metrics and on 2 ranks."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
from torchmetrics.retrieval import RetrievalHitRate, RetrievalMRR, RetrievalNormalizedDCG

from composer_dynsample.metrics.ranking import RankingMetrics, csn_groups, ranking_metrics


def _reference(queries, query_labels, gallery, gallery_labels, *, k_recall, k_mrr, k_ndcg, candidates, seed):
    """Per-query loops: sort the gallery by squared distance, a relevant item after equal non-relevant ones."""
    distances = torch.cdist(queries.double(), gallery.double()) ** 2
    members, group_of = csn_groups(len(gallery), candidates, seed)
    out = {"mrr": [], "csn_mrr": [], f"mrr@{k_mrr}": [], f"recall@{k_recall}": [], f"ndcg@{k_ndcg}": []}
    missing = 0
    for i in range(len(queries)):
        relevant = [j for j in range(len(gallery)) if gallery_labels[j] == query_labels[i]]
        if not relevant:
            missing += 1
            continue
        order = sorted(range(len(gallery)), key=lambda j: (distances[i, j].item(), j in relevant))
        rank = 1 + next(position for position, j in enumerate(order) if j in relevant)
        out["mrr"].append(1 / rank)
        out[f"mrr@{k_mrr}"].append(1 / rank if rank <= k_mrr else 0.0)
        out[f"recall@{k_recall}"].append(float(rank <= k_recall))
        dcg = sum(1 / math.log2(p + 2) for p, j in enumerate(order[:k_ndcg]) if j in relevant)
        ideal = sum(1 / math.log2(p + 2) for p in range(min(len(relevant), k_ndcg)))
        out[f"ndcg@{k_ndcg}"].append(dcg / ideal)
        first = relevant[0]
        group = set(members[group_of[first]].tolist())
        own = distances[i, first]
        beaten = sum(1 for j in group if j not in relevant and distances[i, j] <= own)
        out["csn_mrr"].append(1 / (1 + beaten))
    result = {name: sum(values) / len(values) for name, values in out.items()}
    result["queries_without_positive"] = missing
    return result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_the_brute_force_reference_with_ties_and_several_positives(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    gallery = torch.randint(-2, 3, (60, 4), generator=generator).float()  # integer distances: many exact ties
    gallery_labels = torch.randint(0, 25, (60,), generator=generator)
    queries = torch.randint(-2, 3, (40, 4), generator=generator).float()
    query_labels = torch.randint(0, 30, (40,), generator=generator)  # some labels absent from the gallery
    options = {"k_recall": 5, "k_mrr": 10, "k_ndcg": 10, "candidates": 16, "seed": seed}
    expected = _reference(queries, query_labels, gallery, gallery_labels, **options)
    got = ranking_metrics(
        queries, query_labels, gallery, gallery_labels, distance="squared_euclidean", recall_ks=[5],
        mrr_ks=[10], ndcg_ks=[10], csn_candidates=16, seed=seed, chunk_size=7,
    )  # fmt: skip
    assert got["queries_without_positive"] == expected["queries_without_positive"] > 0
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


def test_matches_torchmetrics_retrieval_metrics_without_ties() -> None:
    generator = torch.Generator().manual_seed(5)
    gallery = torch.randn(80, 16, generator=generator)
    queries = gallery + 0.8 * torch.randn(80, 16, generator=generator)
    labels = torch.arange(80)
    got = ranking_metrics(queries, labels, gallery, labels, recall_ks=[1, 10], mrr_ks=[10], ndcg_ks=[10])
    scores = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(gallery, dim=1).T
    target = labels[:, None] == labels[None, :]
    indexes = torch.arange(80)[:, None].expand(-1, 80)
    flat = (scores.flatten(), target.flatten(), indexes.flatten())
    assert got["mrr"] == pytest.approx(RetrievalMRR()(*flat).item(), abs=1e-6)
    assert got["mrr@10"] == pytest.approx(RetrievalMRR(top_k=10)(*flat).item(), abs=1e-6)
    assert got["ndcg@10"] == pytest.approx(RetrievalNormalizedDCG(top_k=10)(*flat).item(), abs=1e-6)
    assert got["recall@1"] == pytest.approx(RetrievalHitRate(top_k=1)(*flat).item(), abs=1e-6)
    assert got["recall@10"] == pytest.approx(RetrievalHitRate(top_k=10)(*flat).item(), abs=1e-6)
    assert 0 < got["recall@1"] < 1  # the case is not trivial


def test_codesearchnet_groups_cover_the_gallery_and_rank_among_candidates_only() -> None:
    members, group_of = csn_groups(2500, 1000, seed=3)
    assert members.shape == (3, 1000)
    assert sorted(set(members.flatten().tolist())) == list(range(2500))
    for item in (0, 1234, 2499):
        assert item in members[group_of[item]].tolist()
    # a query whose positive is the farthest of the whole corpus still ranks among 1000 candidates only
    gallery = torch.randn(2500, 8, generator=torch.Generator().manual_seed(0))
    query = -gallery[:1]
    result = ranking_metrics(query, torch.tensor([0]), gallery, torch.arange(2500), csn_candidates=1000)
    assert result["mrr"] == pytest.approx(1 / 2500)
    assert result["csn_mrr"] == pytest.approx(1 / 1000)


def test_bad_input_is_refused_in_one_line() -> None:
    metric = RankingMetrics()
    with pytest.raises(RuntimeError, match="no gallery"):
        metric.update(torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="recall_ks \\[10\\] reach the gallery's 5 items"):
        metric.set_gallery(torch.randn(5, 3), torch.arange(5))
    with pytest.raises(ValueError, match="labels must be integers"):
        RankingMetrics(recall_ks=[1]).set_gallery(torch.randn(5, 3), torch.rand(5))
    with pytest.raises(ValueError, match="csn_candidates"):
        RankingMetrics(csn_candidates=0)
    with pytest.raises(ValueError, match="recall_ks"):
        RankingMetrics(recall_ks=[0])


@pytest.mark.world_size(2)
def test_two_ranks_sum_to_the_single_process_result() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    generator = torch.Generator().manual_seed(11)
    gallery = torch.randn(50, 8, generator=generator)
    queries = gallery + 0.7 * torch.randn(50, 8, generator=generator)
    labels = torch.arange(50)
    metric = RankingMetrics(recall_ks=[1, 10], csn_candidates=20)
    metric.set_gallery(gallery, labels)
    metric.update(queries[rank::2], labels[rank::2])
    got = {name: value.item() for name, value in metric.compute().items()}
    expected = ranking_metrics(queries, labels, gallery, labels, recall_ks=[1, 10], csn_candidates=20)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
