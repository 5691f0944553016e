"""The corpus search of :class:`~composer_dynsample.samplers.mined_negatives.MinedNegativesPKBatchSampler`.

Each anchor's nearest passages of other pairs in a snapshot of the embeddings, with the false-negative
guards of ANCE / RocketQA (a rank window), NV-Retriever (a margin relative to the positive) and exact
duplicates (the same text). A fast float32 pass keeps :data:`~composer_dynsample.samplers._ranking.SLACK`
spare candidates, which are ranked again in float64 with ties in row order, so the lists are a pure
function of the snapshot: every rank computes the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from composer_dynsample.samplers._ranking import SLACK, rank_columns
from composer_dynsample.samplers.neighbours import check_search
from composer_dynsample.validation import check_float, check_int

__all__ = ["GUARDS", "CorpusCandidates", "corpus_candidates", "pair_layout"]

#: What the guards of :func:`corpus_candidates` drop, in the order they are tried on a candidate.
GUARDS = ("rank_window", "duplicate", "same_query", "margin")
_SIMILARITY_BUDGET = 2**25  # float32 entries of one chunk's similarity block: 128 MiB
# Anchors per faiss call: faiss blocks its own similarities, and its flat index is about 9 times slower
# per anchor when called with a few dozen (measured at 100,000 x 128 on one thread).
_FAISS_QUERIES = 1024
_IVF_PROBES = 32  # IVF cells searched per query, of about sqrt(N)


class CorpusCandidates(NamedTuple):
    """What :func:`corpus_candidates` finds for the anchors of the pairs it searched.

    Attributes:
        ranked (numpy.ndarray): ``(A, skip_top + window)`` int64, the passage rows examined, nearest
            first, ``-1`` where an anchor has fewer (or none: not searched).
        kept (numpy.ndarray): ``(A, skip_top + window)`` bool, which of them passed every guard (the
            ``skip_top`` first never do).
        dropped (numpy.ndarray): ``(A, 4)`` int64, how many candidates each of :data:`GUARDS` dropped.
        searched (numpy.ndarray): ``(A,)`` bool, false for an anchor without an embedding (or, with the
            margin guard, whose positive has none): it has no candidates.
    """

    ranked: np.ndarray
    kept: np.ndarray
    dropped: np.ndarray
    searched: np.ndarray

    def survivors(self) -> np.ndarray:
        """The kept rows of every anchor, nearest first, ``-1`` after them: ``(A, skip_top + window)``."""
        order = np.argsort(~self.kept, axis=1, kind="stable")
        return np.take_along_axis(np.where(self.kept, self.ranked, -1), order, axis=1)


def pair_layout(labels: np.ndarray, is_passage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The anchor row and the positive row of every pair, and the pair of every row.

    Pairs are numbered by sorted label. Every label must have exactly two rows, one anchor
    (``is_passage`` false) and one passage (its positive).

    Args:
        labels (numpy.ndarray): ``(N,)`` int64, the pair of every row.
        is_passage (numpy.ndarray): ``(N,)`` bool, which rows are passages.

    Returns:
        tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]: ``anchors`` ``(C,)``, ``positives`` ``(C,)`` and
        ``pair_of`` ``(N,)``, int64.

    Example:
        >>> anchors, positives, pair_of = pair_layout(np.array([7, 3, 7, 3]), np.array([0, 1, 1, 0], bool))
        >>> anchors.tolist(), positives.tolist(), pair_of.tolist()
        ([3, 0], [1, 2], [1, 0, 1, 0])
    """
    classes, pair_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if (counts != 2).any():
        bad = int(np.flatnonzero(counts != 2)[0])
        raise ValueError(
            f"labels must give every pair exactly 2 rows (an anchor and its positive); label "
            f"{int(classes[bad])} has {int(counts[bad])}."
        )
    passages = np.bincount(pair_of, weights=is_passage, minlength=classes.size)
    if (passages != 1).any():
        bad = int(np.flatnonzero(passages != 1)[0])
        kind = "2 passages" if passages[bad] == 2 else "no passage"
        raise ValueError(
            f"every pair needs one anchor (is_passage false) and one passage (is_passage true); label "
            f"{int(classes[bad])} has {kind}."
        )
    order = np.lexsort((is_passage, pair_of))  # per pair: the anchor, then the passage
    return order[0::2].astype(np.int64), order[1::2].astype(np.int64), pair_of.astype(np.int64)


def dense_ids(duplicate_ids: np.ndarray | None, size: int) -> np.ndarray:
    """Duplicate ids renumbered ``0 .. U-1`` (equal ids stay equal), or every row its own id."""
    if duplicate_ids is None:
        return np.arange(size, dtype=np.int64)
    return np.unique(duplicate_ids, return_inverse=True)[1].astype(np.int64).reshape(-1)


def corpus_candidates(
    embeddings: torch.Tensor,
    labels: Sequence[int] | np.ndarray,
    is_passage: Sequence[bool] | np.ndarray,
    window: int,
    *,
    skip_top: int = 0,
    max_relative_similarity: float | None = None,
    duplicate_ids: np.ndarray | None = None,
    valid: torch.Tensor | np.ndarray | None = None,
    pairs: np.ndarray | None = None,
    chunk_size: int | None = None,
    search: str = "exact",
) -> CorpusCandidates:
    """Each anchor's nearest passages of other pairs by cosine similarity, through false-negative guards.

    The passages with an embedding are ranked by their similarity to the anchor, its own positive left
    out. The ``skip_top`` nearest are skipped (the rank window: the very nearest are the likeliest
    unlabelled positives), and of the next ``window`` a candidate is dropped when its text (its
    ``duplicate_ids`` entry) is the anchor's or the positive's (``"duplicate"``), when it is the
    positive of another pair whose anchor has the anchor's text (``"same_query"``: the same query with
    another answer), or when its similarity exceeds ``max_relative_similarity`` times the anchor's
    similarity to its positive (``"margin"``, NV-Retriever's TopK-PercPos). Rows without an embedding
    (``valid`` false, a non-finite or a zero row) are no candidate, and their anchors get none.

    Searches (every one keeps 8 spare candidates, ranked again in float64 with ties in row order):
    ``"exact"`` compares a chunk of anchors with every passage in torch (memory ``chunk_size x
    passages``); ``"faiss"`` uses faiss's exact ``IndexFlatIP`` (the same lists); ``"faiss_ivf"`` faiss's
    approximate ``IndexIVFFlat`` (about ``sqrt(N)`` cells, 32 searched per anchor). The faiss searches
    need the ``faiss`` extra. Memory is linear in the number of rows.

    Args:
        embeddings (torch.Tensor): ``(N, D)`` embeddings, one row per row of ``labels``.
        labels (Sequence[int] | numpy.ndarray): ``(N,)`` the pair of every row (see :func:`pair_layout`).
        is_passage (Sequence[bool] | numpy.ndarray): ``(N,)`` which rows are passages.
        window (int): Candidates looked at after the skipped ones.
        skip_top (int): The nearest passages skipped. Default: ``0``.
        max_relative_similarity (float, optional): The margin guard's fraction. Default: ``None`` (off).
        duplicate_ids (numpy.ndarray, optional): ``(N,)`` integer id of every row's text (equal texts,
            equal ids). Default: none (no duplicate or same-query guard).
        valid (torch.Tensor | numpy.ndarray, optional): ``(N,)`` bool, the rows holding an embedding.
            Default: every finite row.
        pairs (numpy.ndarray, optional): The pairs (numbered by sorted label) whose anchors to search.
            Default: all.
        chunk_size (int, optional): Anchors per similarity block. Default: about 128 MiB of similarities
            for ``"exact"`` (at most 1024 anchors), 1024 anchors per call for the faiss searches.
        search (str): ``"exact"``, ``"faiss"`` or ``"faiss_ivf"``. Default: ``"exact"``.

    Returns:
        CorpusCandidates: The passage rows examined, which passed, what each guard dropped and which
        anchors were searched.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.9, 0.5], [0.8, 0.6], [0.0, 1.0]])
        >>> found = corpus_candidates(x, [0, 0, 1, 1, 2, 2], [False, True] * 3, 2)
        >>> found.survivors()[:, :2].tolist()
        [[3, 5], [5, 1], [3, 1]]
    """
    check_int("window", window, minimum=1)
    check_int("skip_top", skip_top, minimum=0)
    check_search(search)
    if max_relative_similarity is not None:
        check_float("max_relative_similarity", max_relative_similarity, minimum=0, strict_minimum=True)
    labels, is_passage = np.asarray(labels, dtype=np.int64), np.asarray(is_passage, dtype=bool)
    base = embeddings.detach().cpu()
    anchors, positives, pair_of = pair_layout(labels, is_passage)
    texts = dense_ids(duplicate_ids, labels.size)
    usable = _usable_rows(base, valid)
    pairs = np.arange(anchors.size) if pairs is None else np.asarray(pairs, dtype=np.int64)
    searched = usable[anchors[pairs]] & (usable[positives[pairs]] | (max_relative_similarity is None))
    database = np.flatnonzero(usable[positives])  # pairs whose passage has an embedding
    column_of = np.full(anchors.size, -1, dtype=np.int64)
    column_of[database] = np.arange(database.size)
    database_rows = positives[database]
    fast = torch.nn.functional.normalize(base[torch.from_numpy(database_rows)].float(), dim=1)
    find = _finder(search, fast)
    width = skip_top + window
    ranked = np.full((pairs.size, width), -1, dtype=np.int64)
    kept = np.zeros((pairs.size, width), dtype=bool)
    dropped = np.zeros((pairs.size, len(GUARDS)), dtype=np.int64)
    queries = np.flatnonzero(searched)
    step = chunk_size or (
        max(1, min(1024, _SIMILARITY_BUDGET // max(1, database.size)))
        if search == "exact"
        else _FAISS_QUERIES
    )
    for start in range(0, queries.size, check_int("chunk_size", step, minimum=1)):
        at = queries[start : start + step]
        own = pairs[at]
        query = torch.nn.functional.normalize(base[torch.from_numpy(anchors[own])].float(), dim=1)
        found = find(query, torch.from_numpy(column_of[own]), width + SLACK)
        rows = np.where(found >= 0, database_rows[np.maximum(found, 0)], -1)
        values, ranked[at] = _rerank(base, anchors[own], rows, width)
        guard = _Guard(texts, anchors, pair_of, (anchors[own], positives[own]), skip_top)
        if max_relative_similarity is not None:
            guard.margin = max_relative_similarity * _similarity(base, anchors[own], positives[own])
        kept[at], dropped[at] = guard(values, ranked[at])
    return CorpusCandidates(ranked, kept, dropped, searched)


def _usable_rows(base: torch.Tensor, valid: torch.Tensor | np.ndarray | None) -> np.ndarray:
    """Rows with an embedding: ``valid`` (default all) and finite and not zero."""
    usable = np.empty(base.shape[0], dtype=bool)
    for start in range(0, base.shape[0], 65536):  # blocks: no temporary of the table's size
        block = base[start : start + 65536].float()
        usable[start : start + 65536] = (
            torch.isfinite(block).all(dim=1) & (block.abs().sum(dim=1) > 0)
        ).numpy()
    if valid is not None:
        given = valid.cpu().numpy() if isinstance(valid, torch.Tensor) else np.asarray(valid)
        if given.shape != usable.shape:
            raise ValueError(f"valid must have shape {usable.shape}, got {given.shape}.")
        usable &= given.astype(bool)
    return usable


def _finder(search: str, fast: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, int], np.ndarray]:
    """``find(queries, own, width)``: each query's ``width`` most similar database columns by float32
    similarity, its ``own`` column (``-1``: none) left out, ``-1`` where there are fewer."""
    if search == "exact":

        def find_exact(queries: torch.Tensor, own: torch.Tensor, width: int) -> np.ndarray:
            similarity = queries @ fast.T
            has = torch.nonzero(own >= 0).flatten()
            similarity[has, own[has]] = float("-inf")
            values, columns = similarity.topk(min(width, fast.shape[0]), dim=1, sorted=False)
            return torch.where(torch.isfinite(values), columns, -1).numpy()

        return find_exact
    index = _faiss_index(search, fast)
    fewest = _blas_queries(fast.shape[1]) if search == "faiss" else 0

    def find_faiss(queries: torch.Tensor, own: torch.Tensor, width: int) -> np.ndarray:
        asked = min(width + 1, fast.shape[0])  # one more: the query's own passage may be among them
        data = queries.numpy()
        if fewest > data.shape[0] >= fewest // 8:  # padded with copies: one matrix product costs less
            data = np.concatenate([data, np.repeat(data[:1], fewest - data.shape[0], axis=0)])
        found = index.search(np.ascontiguousarray(data), asked)[1][: queries.shape[0]]
        columns = found.astype(np.int64)
        columns[columns == own.numpy()[:, None]] = -1
        order = np.argsort(columns < 0, axis=1, kind="stable")  # found ones first, in order
        return np.take_along_axis(columns, order, axis=1)[:, :width]

    return find_faiss


def _blas_queries(dim: int) -> int:
    """The fewest queries for which faiss's flat index multiplies matrices (``nq x dim`` at least its
    ``distance_compute_blas_threshold``); below, it compares query by query, about 15 times slower at
    1,000,000 x 128 on one thread."""
    import faiss

    return -(-int(faiss.cvar.distance_compute_blas_threshold) // max(1, dim))


def _faiss_index(search: str, fast: torch.Tensor) -> Any:
    """A faiss inner-product index of the database rows: exact flat, or IVF."""
    import faiss

    data = np.ascontiguousarray(fast.numpy())
    dim = data.shape[1]
    if search == "faiss":
        index = faiss.IndexFlatIP(dim)
    else:
        cells = max(1, min(round(math.sqrt(data.shape[0])), data.shape[0] // 39))  # faiss wants 39 per cell
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, cells, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter, index.cp.max_points_per_centroid = 10, 64  # k-means on a sample: seconds
        index.train(data)
        index.nprobe = min(_IVF_PROBES, cells)
    index.add(data)
    return index


def _unit64(base: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """``base[rows]`` in float64, each row scaled to unit length (numpy: one thread, one summation order)."""
    vectors = base[torch.from_numpy(np.ascontiguousarray(rows).reshape(-1))].double().numpy()
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.reshape(*np.shape(rows), base.shape[1])


def _similarity(base: torch.Tensor, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Float64 cosine similarity of rows ``first[i]`` and ``second[i]``."""
    return np.einsum("qd,qd->q", _unit64(base, first), _unit64(base, second))


def _rerank(
    base: torch.Tensor, anchors: np.ndarray, rows: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``keep`` most similar of each anchor's candidate ``rows`` by float64 cosine similarity, ties in
    row order: ``(values, rows)``, ``-inf`` and ``-1`` where an anchor has fewer."""
    similarity = np.einsum("qd,qkd->qk", _unit64(base, anchors), _unit64(base, np.maximum(rows, 0)))
    similarity[rows < 0] = -np.inf
    order = rank_columns(-similarity, rows, keep)
    values, ranked = np.take_along_axis(similarity, order, 1), np.take_along_axis(rows, order, 1)
    if ranked.shape[1] < keep:
        pad = ((0, 0), (0, keep - ranked.shape[1]))
        values, ranked = np.pad(values, pad, constant_values=-np.inf), np.pad(ranked, pad, constant_values=-1)
    return values, ranked


class _Guard:
    """The guards of one chunk of anchors, applied to their ranked candidates."""

    def __init__(
        self,
        texts: np.ndarray,
        anchors: np.ndarray,
        pair_of: np.ndarray,
        own: tuple[np.ndarray, np.ndarray],
        skip_top: int,
    ) -> None:
        self.texts, self.anchors, self.pair_of, self.skip_top = texts, anchors, pair_of, skip_top
        self.anchor_text, self.positive_text = texts[own[0]][:, None], texts[own[1]][:, None]
        self.margin: np.ndarray | None = None  # per anchor: the largest similarity a candidate may have

    def __call__(self, values: np.ndarray, ranked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kept, dropped)``: which ranked candidates pass every guard, and each guard's count per anchor."""
        skipped = np.isfinite(values[:, : self.skip_top]).sum(axis=1)
        values, rows = values[:, self.skip_top :], ranked[:, self.skip_top :]
        present = rows >= 0
        text = self.texts[np.maximum(rows, 0)]
        duplicate = present & ((text == self.anchor_text) | (text == self.positive_text))
        query_text = self.texts[self.anchors[self.pair_of[np.maximum(rows, 0)]]]
        same_query = present & ~duplicate & (query_text == self.anchor_text)
        kept = present & ~duplicate & ~same_query
        margin = np.zeros_like(kept)
        if self.margin is not None:
            margin = kept & (values > self.margin[:, None])
            kept &= ~margin
        counts = np.stack([skipped, duplicate.sum(1), same_query.sum(1), margin.sum(1)], axis=1)
        return np.concatenate([np.zeros((kept.shape[0], self.skip_top), bool), kept], axis=1), counts
