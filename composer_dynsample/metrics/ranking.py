"""Ranking metrics of queries against a corpus: MRR, MRR@k, Recall@k, nDCG@k and CodeSearchNet's MRR.

For retrieval over pairs (a query, its passage) the gallery is the test split's passages and the
queries its anchors; a gallery item is relevant to a query when their labels are equal (a pair's two
texts share its label). The rank of a query is the rank of its best relevant item, with ties counted
against the query: ``1 +`` the number of non-relevant items at a distance no larger than the best
relevant one. A query without a relevant item in the gallery is counted in ``queries_without_positive``
and left out of every mean.

* ``mrr``: mean ``1 / rank`` over the whole corpus; ``mrr@k``: the same with ``0`` past rank ``k``;
* ``recall@k``: the share of queries whose rank is at most ``k``;
* ``ndcg@k``: with one relevant item, ``1 / log2(1 + rank)`` up to rank ``k``, else ``0`` (the ideal DCG
  is 1); with several, the standard binary nDCG over the top ``k``;
* ``csn_mrr``: CodeSearchNet's protocol (Husain et al. 2019): the gallery is cut into fixed groups of
  ``csn_candidates`` items by a seeded permutation (the last group wraps around to the start), and each
  query is ranked among the group of its first relevant item only: its own passage and 999 others.

The functional form is :func:`ranking_metrics`; :class:`RankingMetrics` is the torchmetrics ``Metric``
(sum states, synced across ranks) with a fixed gallery, as the query/gallery mode of
:mod:`composer_dynsample.metrics.retrieval`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict, Unpack

import torch
from torchmetrics import Metric

from composer_dynsample.distances import check_distance, pairwise_distance
from composer_dynsample.validation import check_keywords

__all__ = ["RankingKeywords", "RankingMetrics", "csn_groups", "rank_sums", "ranking_metrics"]


def _check_ks(name: str, ks: int | Sequence[int]) -> tuple[int, ...]:
    values = (ks,) if isinstance(ks, int) else tuple(ks)
    if not values or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in values):
        raise ValueError(f"{name} must be positive integers, got {ks!r}.")
    return tuple(sorted(set(values)))


def _check_pair(name: str, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
    if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2:
        raise ValueError(
            f"{name} embeddings must be a (N, D) tensor, got {getattr(embeddings, 'shape', embeddings)!r}."
        )
    if not isinstance(labels, torch.Tensor) or labels.shape != embeddings.shape[:1]:
        raise ValueError(
            f"{name} labels must be a ({embeddings.shape[0]},) tensor, got {getattr(labels, 'shape', labels)!r}."
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"{name} labels must be integers, got {labels.dtype}.")


def csn_groups(gallery_size: int, candidates: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CodeSearchNet's candidate groups: ``(members (G, candidates), group of each gallery item (N,))``.

    A seeded permutation of the gallery is cut into ``ceil(N / candidates)`` groups of ``candidates``
    items; the last group is filled from the start of the permutation. With fewer items than
    ``candidates`` there is one group of the whole gallery.
    """
    size = min(candidates, gallery_size)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(gallery_size, generator=generator)
    groups = math.ceil(gallery_size / size)
    positions = torch.arange(groups * size) % gallery_size
    members = order[positions].view(groups, size)
    group_of = torch.empty(gallery_size, dtype=torch.long)
    group_of[order] = torch.arange(gallery_size) // size
    return members, group_of


def _query_ranks(
    distances: torch.Tensor, relevant: torch.Tensor, members: torch.Tensor, group_of: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full-corpus ranks, CodeSearchNet ranks and whether each query has a relevant item."""
    has_positive = relevant.any(dim=1)
    inf = torch.tensor(float("inf"), dtype=distances.dtype, device=distances.device)
    best = torch.where(relevant, distances, inf).min(dim=1).values
    beaten = (~relevant) & (distances <= best[:, None])
    ranks = 1 + beaten.sum(dim=1)
    first = relevant.to(torch.int8).argmax(dim=1)
    group = members.to(distances.device)[group_of.to(distances.device)[first]]
    in_group = torch.zeros_like(relevant).scatter_(1, group, True)
    own = distances.gather(1, first[:, None])
    csn_ranks = 1 + ((beaten | (distances <= own)) & in_group & ~relevant).sum(dim=1)
    return ranks, csn_ranks, has_positive


def _ndcg(relevant_sorted: torch.Tensor, k: int, positives: torch.Tensor) -> torch.Tensor:
    discounts = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64, device=relevant_sorted.device))
    dcg = (relevant_sorted[:, :k].double() * discounts[: relevant_sorted.shape[1]]).sum(dim=1)
    ideal = torch.cumsum(discounts, 0)[(positives.clamp(1, k) - 1)]
    return dcg / ideal


def rank_sums(
    distances: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_labels: torch.Tensor,
    *,
    recall_ks: tuple[int, ...],
    mrr_ks: tuple[int, ...],
    ndcg_ks: tuple[int, ...],
    groups: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The per-metric sums (float64) of a ``(Q, N)`` matrix of distances (lower is nearer).

    Any scorer's output ranks the same way: pass ``-scores`` (BM25, a cross-encoder). ``groups`` is
    :func:`csn_groups` of the gallery. Divide by ``count`` for the means; ``queries_without_positive``
    counts the queries left out.
    """
    top = min(max(ndcg_ks, default=1), distances.shape[1])
    relevant = query_labels[:, None].to(gallery_labels.device) == gallery_labels[None, :]
    ranks, csn_ranks, has_positive = _query_ranks(distances, relevant, *groups)
    ranks, csn_ranks = ranks[has_positive].double(), csn_ranks[has_positive].double()
    sums = {
        "count": has_positive.double().sum(),
        "queries_without_positive": (~has_positive).double().sum(),
        "mrr": (1.0 / ranks).sum(),
        "csn_mrr": (1.0 / csn_ranks).sum(),
    }
    for k in mrr_ks:
        sums[f"mrr@{k}"] = torch.where(ranks <= k, 1.0 / ranks, 0.0).sum()
    for k in recall_ks:
        sums[f"recall@{k}"] = (ranks <= k).double().sum()
    if ndcg_ks:
        relevant_sorted = _relevance_in_rank_order(distances[has_positive], relevant[has_positive], top)
        positives = relevant[has_positive].sum(dim=1)
        for k in ndcg_ks:
            sums[f"ndcg@{k}"] = _ndcg(relevant_sorted, k, positives).sum()
    return sums


def _relevance_in_rank_order(distances: torch.Tensor, relevant: torch.Tensor, top: int) -> torch.Tensor:
    """Relevance of the ``top`` nearest items, a relevant item placed after non-relevant ones at equal distance."""
    by_relevance = torch.argsort(relevant.to(torch.int8), dim=1, stable=True)
    by_distance = torch.argsort(distances.gather(1, by_relevance), dim=1, stable=True)
    order = by_relevance.gather(1, by_distance)[:, :top]
    return relevant.gather(1, order)


class RankingKeywords(TypedDict, total=False):
    """The keywords of :class:`RankingMetrics`, as :func:`ranking_metrics` hands them on (its ``**options:
    Unpack[RankingKeywords]``, PEP 692): their meaning and defaults are the metric's."""

    distance: str
    recall_ks: int | Sequence[int]
    mrr_ks: int | Sequence[int]
    ndcg_ks: int | Sequence[int]
    csn_candidates: int
    seed: int
    chunk_size: int


def ranking_metrics(
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    gallery: torch.Tensor,
    gallery_labels: torch.Tensor,
    **options: Unpack[RankingKeywords],
) -> dict[str, float]:
    """MRR, MRR@k, Recall@k, nDCG@k and CodeSearchNet's MRR of ``queries`` against ``gallery``.

    See the module docstring for the definitions. Returns floats, with ``queries_without_positive`` the
    number of queries left out for lack of a relevant gallery item (all metrics are NaN when every query
    lacks one). ``options`` are :class:`RankingMetrics`'s keywords (``distance``, ``recall_ks``, ``mrr_ks``,
    ``ndcg_ks``, ``csn_candidates``, ``seed``, ``chunk_size``), with its defaults.

    Example:
        >>> gallery = torch.eye(4)
        >>> queries = torch.tensor([[1.0, 0.1, 0.0, 0.0], [0.0, 0.0, 0.2, 1.0]])
        >>> result = ranking_metrics(queries, torch.tensor([0, 2]), gallery, torch.arange(4), recall_ks=[1])
        >>> result["mrr"], result["recall@1"], result["queries_without_positive"]
        (0.75, 0.5, 0)
    """
    _check_pair("query", queries, query_labels)
    _check_pair("gallery", gallery, gallery_labels)
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"queries have {queries.shape[1]} dimensions, the gallery {gallery.shape[1]}.")
    check_keywords("ranking_metrics", options, RankingKeywords)
    metric = RankingMetrics(**options)
    metric.set_gallery(gallery, gallery_labels)
    metric.update(queries, query_labels)
    return {
        name: (value.item() if name != "queries_without_positive" else int(value))
        for name, value in metric.compute().items()
    }


class RankingMetrics(Metric):
    """Queries against a fixed corpus: MRR, MRR@k, Recall@k, nDCG@k and CodeSearchNet's MRR as one dict.

    The gallery (the corpus's embeddings and labels, the *whole* corpus on every rank) is set with
    :meth:`set_gallery`, typically by a callback at ``EVAL_START``; queries stream through
    :meth:`update`, each update adding per-query results to sum states that sync across ranks with a sum.

    Args:
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        recall_ks (int | Sequence[int]): The ``k`` of Recall@k. Default: ``(1, 10)``.
        mrr_ks (int | Sequence[int]): The ``k`` of MRR@k. Default: ``(10,)``.
        ndcg_ks (int | Sequence[int]): The ``k`` of nDCG@k. Default: ``(10,)``.
        csn_candidates (int): Candidates per query in CodeSearchNet's MRR. Default: ``1000``.
        seed (int): Seed of CodeSearchNet's candidate groups. Default: ``0``.
        chunk_size (int): Queries ranked at a time. Default: ``1024``.

    Example:
        >>> metric = RankingMetrics(recall_ks=[1])
        >>> metric.set_gallery(torch.eye(3), torch.arange(3))
        >>> metric.update(torch.tensor([[0.9, 0.1, 0.0]]), torch.tensor([0]))
        >>> float(metric.compute()["mrr"])
        1.0
    """

    full_state_update = False

    def __init__(
        self,
        *,
        distance: str = "cosine",
        recall_ks: int | Sequence[int] = (1, 10),
        mrr_ks: int | Sequence[int] = (10,),
        ndcg_ks: int | Sequence[int] = (10,),
        csn_candidates: int = 1000,
        seed: int = 0,
        chunk_size: int = 1024,
    ) -> None:
        super().__init__()
        self.distance = check_distance(distance)
        self.recall_ks = _check_ks("recall_ks", recall_ks)
        self.mrr_ks = _check_ks("mrr_ks", mrr_ks)
        self.ndcg_ks = _check_ks("ndcg_ks", ndcg_ks)
        for name, value in (("csn_candidates", csn_candidates), ("chunk_size", chunk_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        self.csn_candidates, self.seed, self.chunk_size = csn_candidates, int(seed), chunk_size
        for name in self._names():
            self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self._gallery: tuple[torch.Tensor, torch.Tensor] | None = None
        self._groups: tuple[torch.Tensor, torch.Tensor] | None = None

    def _names(self) -> list[str]:
        return [
            "count",
            "queries_without_positive",
            "mrr",
            "csn_mrr",
            *(f"mrr@{k}" for k in self.mrr_ks),
            *(f"recall@{k}" for k in self.recall_ks),
            *(f"ndcg@{k}" for k in self.ndcg_ks),
        ]

    def set_gallery(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Fix the corpus the queries are ranked against (the whole corpus, on every rank); resets."""
        _check_pair("gallery", embeddings, labels)
        if embeddings.shape[0] == 0:
            raise ValueError("the gallery is empty: there is nothing to rank the queries against.")
        too_large = [k for k in self.recall_ks if k >= embeddings.shape[0] > 1]
        if too_large:
            raise ValueError(
                f"recall_ks {too_large} reach the gallery's {embeddings.shape[0]} items: every query would "
                f"count as found; use k below {embeddings.shape[0]}."
            )
        self._gallery = (embeddings.detach(), labels.detach())
        self._groups = csn_groups(embeddings.shape[0], self.csn_candidates, self.seed)
        self.reset()

    def update(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:  # type: ignore[override]
        """Rank a batch of queries against the gallery and add their results."""
        if self._gallery is None or self._groups is None:
            raise RuntimeError("RankingMetrics has no gallery: call set_gallery(embeddings, labels) first.")
        _check_pair("query", embeddings, labels)
        gallery, gallery_labels = self._gallery
        queries, query_labels = embeddings.detach().to(gallery.device), labels.to(gallery.device)
        sums: dict[str, torch.Tensor] = {}
        for start in range(0, queries.shape[0], self.chunk_size):
            rows = slice(start, start + self.chunk_size)
            distances = pairwise_distance(queries[rows], gallery, self.distance)
            chunk = rank_sums(
                distances,
                query_labels[rows],
                gallery_labels,
                recall_ks=self.recall_ks,
                mrr_ks=self.mrr_ks,
                ndcg_ks=self.ndcg_ks,
                groups=self._groups,
            )
            for name, value in chunk.items():
                sums[name] = sums.get(name, 0) + value
        for name, value in sums.items():
            setattr(self, name, getattr(self, name) + value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        """Every metric as a float64 scalar tensor, and ``queries_without_positive`` (a count)."""
        count = self.count
        result = {name: getattr(self, name) / count for name in self._names()[2:]}
        result["queries_without_positive"] = self.queries_without_positive
        return result
