"""The float64 rerank and the false-negative guards of the corpus search's candidates.

:func:`~composer_dynsample.samplers._corpus_search.corpus_candidates` finds each anchor's candidate
passages with a fast float32 search; :class:`_Screen` takes a block of anchors and their candidate rows,
ranks the candidates again by float64 cosine similarity with ties in row order (:func:`_rerank`, numpy on
one thread, so every machine and thread count gives the same bits), and applies the guards of
:class:`_Guard`: the rank window (``skip_top``), exact duplicates of the anchor's or the positive's text,
the positive of another pair with the anchor's text, and the margin relative to the anchor's similarity to
its own positive. What each guard drops is counted in the order of
:data:`~composer_dynsample.samplers._candidates.GUARDS`.
"""

from __future__ import annotations

import numpy as np
import torch

from composer_dynsample.samplers._ranking import rank_columns


def _row_norms(base: torch.Tensor) -> np.ndarray:
    """Every row's float64 length, computed as :func:`_unit64` computes it (row by row: the same bits)."""
    norms = np.empty(base.shape[0])
    for start in range(0, base.shape[0], 8192):  # 8 MiB blocks: reused memory, not fresh pages
        block = _numpy_rows(base[start : start + 8192]).astype(np.float64)
        norms[start : start + 8192] = np.linalg.norm(block, axis=1)
    return norms


def _numpy_rows(rows: torch.Tensor) -> np.ndarray:
    """``rows`` as a numpy array of their own float type (float64 for one numpy lacks)."""
    return (
        rows.numpy() if rows.dtype in (torch.float16, torch.float32, torch.float64) else rows.double().numpy()
    )


def _unit64(base: torch.Tensor, rows: np.ndarray, norms: np.ndarray | None = None) -> np.ndarray:
    """``base[rows]`` in float64, each row scaled to unit length (numpy: one thread, one summation order);
    with ``norms`` (:func:`_row_norms`) the lengths are looked up, not summed again: the same bits."""
    flat = np.ascontiguousarray(rows).reshape(-1)
    if base.dtype in (torch.float16, torch.float32, torch.float64):  # numpy's gather: 1.5 times faster
        vectors = np.take(base.numpy(), flat, axis=0)
    else:
        vectors = torch.index_select(base, 0, torch.from_numpy(flat)).double().numpy()
    if norms is None:
        vectors = vectors.astype(np.float64)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    else:  # the float cast is exact, so this is the float64 division above
        vectors = np.divide(vectors, norms[flat][:, None], dtype=np.float64)
    return vectors.reshape(*np.shape(rows), base.shape[1])


def _similarity(
    base: torch.Tensor, first: np.ndarray, second: np.ndarray, norms: np.ndarray | None = None
) -> np.ndarray:
    """Float64 cosine similarity of rows ``first[i]`` and ``second[i]``."""
    return np.einsum("qd,qd->q", _unit64(base, first, norms), _unit64(base, second, norms))


def _rerank(
    base: torch.Tensor, anchors: np.ndarray, rows: np.ndarray, keep: int, norms: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``keep`` most similar of each anchor's candidate ``rows`` by float64 cosine similarity, ties in
    row order: ``(values, rows)``, ``-inf`` and ``-1`` where an anchor has fewer."""
    similarity = np.einsum(
        "qd,qkd->qk", _unit64(base, anchors, norms), _unit64(base, np.maximum(rows, 0), norms)
    )
    similarity[rows < 0] = -np.inf
    order = rank_columns(-similarity, rows, keep)
    values, ranked = np.take_along_axis(similarity, order, 1), np.take_along_axis(rows, order, 1)
    if ranked.shape[1] < keep:
        pad = ((0, 0), (0, keep - ranked.shape[1]))
        values, ranked = np.pad(values, pad, constant_values=-np.inf), np.pad(ranked, pad, constant_values=-1)
    return values, ranked


class _Screen:
    """The float64 rerank and the guards of a block of anchors: ``screen(pairs, rows)``."""

    def __init__(
        self,
        base: torch.Tensor,
        texts: np.ndarray,
        layout: tuple[np.ndarray, np.ndarray, np.ndarray],
        skip_top: int,
        width: int,
    ) -> None:
        self.base, self.texts, self.skip_top, self.width = base, texts, skip_top, width
        self.anchors, self.positives, self.pair_of = layout
        self.margin: float | None = None  # max_relative_similarity
        self.gap: float | None = None  # absolute_margin
        self.norms: np.ndarray | None = None  # every row's float64 length, when many rows are reranked

    def __call__(
        self, pairs: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(ranked, kept, dropped, similarity, positive)`` of the anchors of ``pairs`` from their candidate
        passage ``rows``."""
        anchors, positives = self.anchors[pairs], self.positives[pairs]
        values, ranked = _rerank(self.base, anchors, rows, self.width, self.norms)
        guard = _Guard(self.texts, self.anchors, self.pair_of, (anchors, positives), self.skip_top)
        with np.errstate(invalid="ignore", divide="ignore"):  # a positive without an embedding: NaN
            positive = _similarity(self.base, anchors, positives, self.norms)
        limits = [positive * self.margin] if self.margin is not None else []
        if self.gap is not None:
            limits.append(positive - self.gap)
        if limits:
            guard.margin = np.minimum.reduce(limits)
        kept, dropped = guard(values, ranked)
        return ranked, kept, dropped, values, positive


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
