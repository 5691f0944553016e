"""One ranking pass of queries against a prepared gallery, summed per query, for the retrieval metrics.

It owns the gallery prepared once for ranking (:class:`_Gallery`: cast, normalised for cosine, with
per-label counts), what a pass ranks for (:class:`_RankingPass`), the ranking key and the tie-stable ``k``
nearest items (:func:`_nearest`: ties go to the lower gallery index), the per-query sums of Recall@K hits,
average precision and R-precision over the queries with ``R > 0`` (:func:`_retrieval_update`), and their
means with the warning about queries that have no same-label gallery item (:func:`_retrieval_compute`).
The definitions, distances and tie handling are documented in :mod:`composer_dynsample.metrics.functional`,
whose functions and the torchmetrics classes of :mod:`composer_dynsample.metrics.retrieval` both run this
pass.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from composer_dynsample.distances import working_dtype


class _Gallery(NamedTuple):
    """A gallery prepared once for ranking: cast, normalised (cosine) and with per-label counts."""

    embeddings: torch.Tensor
    sq_norms: torch.Tensor | None
    labels: torch.Tensor
    unique_labels: torch.Tensor
    counts: torch.Tensor


class _RankingPass(NamedTuple):
    """What one ranking pass computes and how: Recall@K for each of ``ks``, and the ``R`` nearest items
    (MAP@R, R-precision) with ``need_r``, by ``distance``, ``chunk_size`` queries at a time."""

    ks: tuple[int, ...]
    need_r: bool
    distance: str
    chunk_size: int


class _RetrievalSums(NamedTuple):
    """Per-query results summed over the queries with ``R > 0``."""

    recall_hits: torch.Tensor  # int64 (len(ks),)
    ap_sum: torch.Tensor  # float64 ()
    r_precision_sum: torch.Tensor  # float64 ()
    num_valid: torch.Tensor  # int64 ()
    num_queries: torch.Tensor  # int64 (): every query, with R > 0 or not


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The ranking dtype: at least float32, float64 where float32 would overflow (see ``working_dtype``)."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, working_dtype(tensor, tensor))
    return dtype


def _prepare_gallery(
    embeddings: torch.Tensor, labels: torch.Tensor, distance: str, dtype: torch.dtype
) -> _Gallery:
    embeddings = embeddings.to(dtype)
    sq_norms = None
    if distance == "cosine":
        embeddings = F.normalize(embeddings, dim=1)
    else:
        sq_norms = (embeddings * embeddings).sum(1)
    unique_labels, counts = torch.unique(labels, sorted=True, return_counts=True)
    return _Gallery(embeddings.contiguous(), sq_norms, labels, unique_labels, counts)


def _gallery_to(gallery: _Gallery, device: torch.device) -> _Gallery:
    return _Gallery(*(None if t is None else t.to(device) for t in gallery))


def _positives_per_query(query_labels: torch.Tensor, gallery: _Gallery) -> torch.Tensor:
    """``R`` before any self-exclusion: the number of gallery items with each query's label."""
    if gallery.unique_labels.numel() == 0:
        return torch.zeros_like(query_labels)
    pos = torch.searchsorted(gallery.unique_labels, query_labels).clamp(max=gallery.unique_labels.numel() - 1)
    found = gallery.unique_labels[pos] == query_labels
    return torch.where(found, gallery.counts[pos], torch.zeros_like(query_labels))


def _ranking_keys(query: torch.Tensor, gallery: _Gallery) -> torch.Tensor:
    """A ``(num_queries, num_gallery)`` key that is smaller for nearer items (monotone in the distance)."""
    products = query @ gallery.embeddings.T
    if gallery.sq_norms is None:  # cosine: rows are unit length
        return products.neg_()
    return products.mul_(-2).add_(gallery.sq_norms.unsqueeze(0)).add_((query * query).sum(1, keepdim=True))


def _nearest(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` smallest keys per row, ordered by (key, index): ties go to the lower index."""
    kth = keys.topk(k, dim=1, largest=False, sorted=True).values[:, -1:]
    below = keys < kth
    at = keys == kth
    room = k - below.sum(1, keepdim=True)  # how many of the items tied at the k-th key fit
    cut = (at.sum(1, keepdim=True) > room).squeeze(1)  # rows where a tie straddles the cut-off
    if bool(cut.any()):
        at[cut] &= at[cut].cumsum(1, dtype=torch.int32) <= room[cut]  # keep the lowest indices
    selected = below | at
    index = selected.nonzero()[:, 1].view(keys.shape[0], k)  # ascending gallery index
    order = keys.gather(1, index).sort(dim=1, stable=True).indices
    return index.gather(1, order)


def _retrieval_update(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    gallery: _Gallery,
    ranking: _RankingPass,
    *,
    leave_one_out: bool,
) -> _RetrievalSums:
    """Sum the per-query results of ``query`` against a prepared ``gallery``.

    In leave-one-out mode, query row ``i`` is gallery row ``i`` and is excluded from its own ranking.
    """
    ks, need_r, distance, chunk_size = ranking
    device = gallery.embeddings.device
    hits = torch.zeros(len(ks), dtype=torch.int64, device=device)
    ap_sum = torch.zeros((), dtype=torch.float64, device=device)
    rp_sum = torch.zeros((), dtype=torch.float64, device=device)
    num_valid = torch.zeros((), dtype=torch.int64, device=device)
    num_queries = torch.tensor(query.shape[0], dtype=torch.int64, device=device)
    num_gallery = gallery.embeddings.shape[0] - int(leave_one_out)
    if query.shape[0] == 0 or num_gallery <= 0:
        return _RetrievalSums(hits, ap_sum, rp_sum, num_valid, num_queries)
    if leave_one_out:
        query = gallery.embeddings  # already cast and normalised
    else:
        dtype = torch.promote_types(gallery.embeddings.dtype, _compute_dtype(query))
        if dtype != gallery.embeddings.dtype:  # queries too large for the gallery's float32
            gallery = _prepare_gallery(gallery.embeddings, gallery.labels, distance, dtype)
        query = query.to(device=device, dtype=dtype)
        if distance == "cosine":
            query = F.normalize(query, dim=1)
    query_labels = query_labels.to(device)
    max_k = max(ks, default=1)
    for start in range(0, query.shape[0], chunk_size):
        rows = torch.arange(start, min(start + chunk_size, query.shape[0]), device=device)
        labels = query_labels[rows]
        r = _positives_per_query(labels, gallery) - int(leave_one_out)
        valid = r > 0
        if not bool(valid.any()):
            continue
        rows, labels, r = rows[valid], labels[valid], r[valid]
        keys = _ranking_keys(query[rows], gallery)
        if leave_one_out:
            keys[torch.arange(rows.numel(), device=device), rows] = float("inf")
        depth = min(num_gallery, max(max_k, int(r.max())) if need_r else max_k)
        relevant = gallery.labels[_nearest(keys, depth)] == labels.unsqueeze(1)
        num_valid += rows.numel()
        for j, k in enumerate(ks):
            hits[j] += relevant[:, :k].any(1).sum()
        if need_r:
            rank = torch.arange(1, depth + 1, device=device, dtype=torch.float64)
            within_r = relevant & (rank.unsqueeze(0) <= r.unsqueeze(1))
            precision = relevant.cumsum(1, dtype=torch.float64) / rank
            rp_sum += (within_r.sum(1, dtype=torch.float64) / r).sum()
            ap_sum += ((precision * within_r).sum(1) / r).sum()
    return _RetrievalSums(hits, ap_sum, rp_sum, num_valid, num_queries)


def _warn_about_queries_without_positive(sums: _RetrievalSums, leave_one_out: bool) -> None:
    """Say how many queries the metrics leave out for want of a same-label gallery item, if any."""
    total, valid = int(sums.num_queries), int(sums.num_valid)
    if valid == total:
        return
    item = "other item" if leave_one_out else "item"
    if valid == 0:
        message = (
            f"none of the {total} queries has an {item} of its label in the gallery, so every metric is "
            "NaN; are the queries' classes in the gallery?"
        )
    else:
        message = (
            f"{total - valid} of {total} queries have no {item} of their label in the gallery; the metrics "
            f"average over the other {valid} (as pytorch-metric-learning's AccuracyCalculator does)."
        )
    warnings.warn(message, UserWarning, stacklevel=4)


def _retrieval_compute(
    sums: _RetrievalSums, ranking: _RankingPass, *, leave_one_out: bool = False
) -> dict[str, torch.Tensor]:
    """Turn summed per-query results into means over the queries with ``R > 0`` (NaN if there are none).

    Warns when some queries have no same-label gallery item (see
    :func:`~composer_dynsample.metrics.functional.count_queries_without_positive`).
    """
    _warn_about_queries_without_positive(sums, leave_one_out)
    count = sums.num_valid.to(torch.float64)
    result = {
        f"recall_at_{k}": (sums.recall_hits[j].to(torch.float64) / count).float()
        for j, k in enumerate(ranking.ks)
    }
    if ranking.need_r:
        result["map_at_r"] = (sums.ap_sum / count).float()
        result["r_precision"] = (sums.r_precision_sum / count).float()
    return result
