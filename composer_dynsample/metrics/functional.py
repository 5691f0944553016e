"""Functional retrieval metrics for metric learning: Recall@K, MAP@R and R-precision.

Definitions (Musgrave et al. 2020, "A Metric Learning Reality Check"), for one query with label ``y``:

* the gallery is ranked by distance to the query, nearest first; in **leave-one-out** mode (no
  separate gallery) the gallery is the query set itself without the query;
* ``R`` is the number of gallery items labelled ``y`` (the query itself excluded in leave-one-out);
* **Recall@K** is 1 if any of the ``K`` nearest gallery items is labelled ``y``, else 0 (the standard
  metric-learning Recall@K; Recall@1 is 1-NN accuracy and equals PML's ``precision_at_1``);
* **R-precision** is the fraction of the ``R`` nearest gallery items labelled ``y``;
* **MAP@R** is ``(1 / R) * sum_{i=1..R} P(i) * rel(i)``, where ``rel(i)`` says whether the ``i``-th
  nearest item is labelled ``y`` and ``P(i)`` is the precision of the ``i`` nearest items.

Each is averaged over the queries with ``R > 0``; a query whose label has no other item in the
gallery is skipped by all three (as in PML's ``AccuracyCalculator``), and the result is NaN if no
query has ``R > 0``. Skipping is never silent: the metrics warn with the count of such queries, and
:func:`count_queries_without_positive` returns it (for a report, say).

Distances: ``"cosine"`` (the default; rows are L2-normalised, a zero row has similarity 0 to
everything) or ``"euclidean"``. The ranking key is computed with one matrix product per chunk of
``chunk_size`` queries, so memory is ``O(chunk_size x gallery size)``, and the nearest items are found
with :func:`torch.topk`.

Ties: gallery items at exactly equal distance are ranked by gallery index, lower first, including at
the cut-off of the ``K`` (or ``R``) nearest, so results never depend on ``topk``'s arbitrary order
among ties. Distances are computed in the inputs' floating dtype, at least float32 and float64 where
float32 would overflow (norms near 1e18 and above; see :func:`~composer_dynsample.distances.working_dtype`),
so items at equal distance in exact arithmetic may differ in the last bit and be ranked either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import torch

from composer_dynsample.distances import DISTANCES
from composer_dynsample.metrics._gallery_ranking import (
    _compute_dtype,
    _prepare_gallery,
    _RankingPass,
    _retrieval_compute,
    _retrieval_update,
    _RetrievalSums,
)
from composer_dynsample.validation import (
    check_choice,
    check_embeddings,
    check_int,
    check_labels,
    check_pool,
    is_int,
)

__all__ = [
    "count_queries_without_positive",
    "mean_average_precision_at_r",
    "r_precision",
    "retrieval_metrics",
    "retrieval_recall_at_k",
]

Distance = Literal["cosine", "euclidean"]
# The metrics rank with the cosine and euclidean members of the one distance name set.
_DISTANCES: tuple[str, ...] = tuple(d for d in DISTANCES if d in ("cosine", "euclidean"))

_NAMES = ("query_embeddings", "query_labels", "gallery_embeddings", "gallery_labels")
# The arguments of those names, together.
_Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _check_batch(
    emb_name: str, embeddings: object, labels_name: str, labels: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked embeddings (detached) and their int64 labels, with the shared validation's messages."""
    emb = check_embeddings(emb_name, embeddings)
    return _detached(emb, check_labels(labels_name, labels, emb.shape[0], emb_name))


def _detached(embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return embeddings.detach(), labels.detach().to(torch.int64)


def _check_ks(ks: int | Sequence[int]) -> tuple[int, ...]:
    values = tuple(ks) if isinstance(ks, Iterable) else (ks,)
    if not all(is_int(k) and k >= 1 for k in values):
        raise ValueError(f"ks must hold integers >= 1, got {ks!r}.")
    if len(set(values)) != len(values):
        raise ValueError(f"ks must not repeat a value, got {ks!r}.")
    return tuple(int(k) for k in values)


def _check_k(k: int) -> int:
    return check_int("k", k, minimum=1)  # type: ignore[return-value]


def _check_distance(distance: object) -> str:
    return check_choice("distance", distance, _DISTANCES)


def _check_chunk_size(chunk_size: int) -> int:
    return check_int("chunk_size", chunk_size, minimum=1)  # type: ignore[return-value]


def _checked_sums(batch: _Batch, ranking: _RankingPass) -> _RetrievalSums:
    """The summed per-query results of ``batch`` (query embeddings and labels, gallery embeddings and labels,
    ``None`` for leave-one-out), checked, in one ranking pass."""
    checked = check_pool(batch[:2], batch[2:], _NAMES)
    query, labels = _detached(*batch[:2])
    distance = ranking.distance
    _check_distance(distance)
    _check_chunk_size(ranking.chunk_size)
    if checked is None:
        gallery = _prepare_gallery(query, labels, distance, _compute_dtype(query))
        leave_one_out = True
    else:
        g_emb, g_labels = _detached(*checked)
        if g_emb.shape[0] == 0:
            raise ValueError("the gallery must hold at least one item, got 0.")
        gallery = _prepare_gallery(g_emb, g_labels, distance, _compute_dtype(query, g_emb))
        leave_one_out = False
    return _retrieval_update(query, labels, gallery, ranking, leave_one_out=leave_one_out)


def retrieval_metrics(
    query_embeddings: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_embeddings: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    *,
    ks: int | Sequence[int] = (1, 5),
    distance: Distance = "cosine",
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Recall@K for each ``k`` in ``ks``, MAP@R and R-precision, from one ranking pass.

    Args:
        query_embeddings (torch.Tensor): ``(Q, D)`` floating-point, finite.
        query_labels (torch.Tensor): ``(Q,)`` integer.
        gallery_embeddings (torch.Tensor, optional): ``(G, D)``; ``None`` for leave-one-out over the
            queries. Default: ``None``.
        gallery_labels (torch.Tensor, optional): ``(G,)``; given together with ``gallery_embeddings``.
        ks (int | Sequence[int]): The ``K`` of Recall@K, each >= 1; a ``K`` beyond the gallery size
            means the whole gallery. Default: ``(1, 5)``.
        distance (str): ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.
        chunk_size (int): Queries ranked at once. Default: ``1024``.

    Returns:
        dict[str, torch.Tensor]: float32 scalars ``recall_at_{k}`` for each ``k``, ``map_at_r`` and
        ``r_precision``; NaN if no query has a same-label gallery item.

    Raises:
        TypeError: If an input is not a tensor, or has the wrong dtype.
        ValueError: If shapes, ``ks``, ``distance`` or ``chunk_size`` are invalid, the gallery is
            empty, or embeddings are not finite.

    Example:
        >>> emb = torch.tensor([[0.0], [1.0], [2.5], [4.0], [5.5]])
        >>> labels = torch.tensor([0, 1, 0, 1, 1])
        >>> result = retrieval_metrics(emb, labels, ks=(1, 2), distance="euclidean")
        >>> {name: round(value.item(), 4) for name, value in result.items()}
        {'recall_at_1': 0.2, 'recall_at_2': 0.6, 'map_at_r': 0.15, 'r_precision': 0.2}
    """
    ks = _check_ks(ks)
    if not ks:
        raise ValueError("ks must hold at least one K.")
    ranking = _RankingPass(ks, True, distance, chunk_size)
    sums = _checked_sums((query_embeddings, query_labels, gallery_embeddings, gallery_labels), ranking)
    return _retrieval_compute(sums, ranking, leave_one_out=gallery_embeddings is None)


def retrieval_recall_at_k(
    query_embeddings: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_embeddings: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    *,
    k: int = 1,
    distance: Distance = "cosine",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Recall@K: the fraction of queries with a same-label item among their ``k`` nearest gallery items.

    Only the ``k`` nearest items are ranked, so this is cheaper than :func:`retrieval_metrics`.
    Arguments are as in :func:`retrieval_metrics`, with one ``k`` (>= 1).

    Returns:
        torch.Tensor: A float32 scalar.

    Example:
        >>> query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> gallery = torch.tensor([[0.9, 0.1], [0.1, 0.9], [1.0, 1.0]])
        >>> retrieval_recall_at_k(query, torch.tensor([0, 0]), gallery, torch.tensor([0, 1, 0]), k=1)
        tensor(0.5000)
    """
    ranking = _RankingPass((_check_k(k),), False, distance, chunk_size)
    sums = _checked_sums((query_embeddings, query_labels, gallery_embeddings, gallery_labels), ranking)
    return _retrieval_compute(sums, ranking, leave_one_out=gallery_embeddings is None)[f"recall_at_{k}"]


def mean_average_precision_at_r(
    query_embeddings: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_embeddings: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    *,
    distance: Distance = "cosine",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """MAP@R (Musgrave et al. 2020). Arguments are as in :func:`retrieval_metrics`.

    Returns:
        torch.Tensor: A float32 scalar.

    Example:
        >>> emb = torch.tensor([[0.0], [1.0], [3.0], [4.0]])
        >>> mean_average_precision_at_r(emb, torch.tensor([0, 0, 1, 1]), distance="euclidean")
        tensor(1.)
    """
    batch = (query_embeddings, query_labels, gallery_embeddings, gallery_labels)
    return _metric_at_r("map_at_r", batch, distance, chunk_size)


def r_precision(
    query_embeddings: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_embeddings: torch.Tensor | None = None,
    gallery_labels: torch.Tensor | None = None,
    *,
    distance: Distance = "cosine",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """R-precision (Musgrave et al. 2020). Arguments are as in :func:`retrieval_metrics`.

    Returns:
        torch.Tensor: A float32 scalar.

    Example:
        >>> emb = torch.tensor([[0.0], [1.0], [3.0], [1.5]])
        >>> r_precision(emb, torch.tensor([0, 0, 1, 1]), distance="euclidean")
        tensor(0.5000)
    """
    batch = (query_embeddings, query_labels, gallery_embeddings, gallery_labels)
    return _metric_at_r("r_precision", batch, distance, chunk_size)


def _metric_at_r(name: str, batch: _Batch, distance: str, chunk_size: int) -> torch.Tensor:
    """The result ``name`` of :func:`retrieval_metrics` without ranking for any Recall@K."""
    ranking = _RankingPass((), True, distance, chunk_size)
    return _retrieval_compute(_checked_sums(batch, ranking), ranking, leave_one_out=batch[2] is None)[name]


def count_queries_without_positive(
    query_labels: torch.Tensor, gallery_labels: torch.Tensor | None = None
) -> int:
    """The number of queries whose label has no item in the gallery, which every metric here skips.

    Args:
        query_labels (torch.Tensor): ``(Q,)`` integer.
        gallery_labels (torch.Tensor, optional): ``(G,)`` integer; ``None`` for leave-one-out, where a
            query needs another query of its label. Default: ``None``.

    Returns:
        int: How many of the ``Q`` queries have ``R = 0``.

    Raises:
        TypeError: If a label tensor is not a tensor of integers.
        ValueError: If a label tensor is not 1-D.

    Example:
        >>> count_queries_without_positive(torch.tensor([0, 0, 1, 2]))
        2
        >>> count_queries_without_positive(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
        1
    """
    queries = check_labels("query_labels", query_labels).detach().cpu()
    if gallery_labels is None:
        _, inverse, counts = torch.unique(queries, return_inverse=True, return_counts=True)
        return int((counts[inverse] == 1).sum())  # alone with its label: nothing else to find
    gallery = check_labels("gallery_labels", gallery_labels).detach().cpu()
    return int((~torch.isin(queries, gallery)).sum())
