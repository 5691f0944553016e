"""What a corpus search finds, and how much of an exact search's window an approximate one finds.

:class:`CorpusCandidates` holds the lists of
:func:`~composer_dynsample.samplers._corpus_search.corpus_candidates` (whichever search made them), and
:func:`window_recall` compares an approximate search's lists (the own IVF, faiss's IVF) with the exact
ones: the tests and the corpus benchmarks measure the approximate searches with it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["GUARDS", "CorpusCandidates", "window_recall"]

#: What the guards of the corpus search drop, in the order they are tried on a candidate.
GUARDS = ("rank_window", "duplicate", "same_query", "margin")


class CorpusCandidates(NamedTuple):
    """What :func:`~composer_dynsample.samplers._corpus_search.corpus_candidates` finds for the anchors of
    the pairs it searched.

    Attributes:
        ranked (numpy.ndarray): ``(A, skip_top + window)`` int64, the passage rows examined, nearest
            first, ``-1`` where an anchor has fewer (or none: not searched).
        kept (numpy.ndarray): ``(A, skip_top + window)`` bool, which of them passed every guard (the
            ``skip_top`` first never do).
        dropped (numpy.ndarray): ``(A, 4)`` int64, how many candidates each of
            :data:`GUARDS` dropped.
        searched (numpy.ndarray): ``(A,)`` bool, false for an anchor without an embedding (or, with the
            margin guard, whose positive has none): it has no candidates.
        similarity (numpy.ndarray, optional): ``(A, skip_top + window)`` float64, each ranked candidate's cosine
            similarity to the anchor, ``-inf`` where ``ranked`` is ``-1`` (``None`` in lists saved before it was
            kept: sampling by similarity then falls back to a uniform order).
        positive (numpy.ndarray, optional): ``(A,)`` float64, the anchor's similarity to its own positive, NaN
            where the positive has no embedding.
    """

    ranked: np.ndarray
    kept: np.ndarray
    dropped: np.ndarray
    searched: np.ndarray
    similarity: np.ndarray | None = None
    positive: np.ndarray | None = None

    def above_positive(self) -> np.ndarray:
        """``(A, skip_top + window)`` bool: the kept candidates at least as similar to the anchor as its own
        positive, the likeliest unlabelled answers (all false without similarities)."""
        if self.similarity is None or self.positive is None:
            return np.zeros_like(self.kept)
        with np.errstate(invalid="ignore"):
            return self.kept & (self.similarity >= self.positive[:, None])

    def summary(self) -> dict[str, float]:
        """What one search found, over the anchors searched, for a log: ``anchors``, ``kept`` candidates,
        each guard's drops (:data:`GUARDS`), ``above_positive``
        (kept ones at least as similar to the anchor as its positive) and the mean similarity of the kept
        candidates and of the positives (NaN without similarities)."""
        record = {"anchors": float(self.searched.sum()), "kept": float(self.kept.sum())}
        record.update({name: float(total) for name, total in zip(GUARDS, self.dropped.sum(axis=0).tolist())})
        record["above_positive"] = float(self.above_positive().sum())
        nan = float("nan")
        with np.errstate(invalid="ignore"):
            kept = self.similarity[self.kept] if self.similarity is not None else np.empty(0)
            positive = self.positive[self.searched] if self.positive is not None else np.empty(0)
            record["kept_similarity"] = float(kept.mean()) if kept.size else nan
            record["positive_similarity"] = (
                float(np.nanmean(positive)) if np.isfinite(positive).any() else nan
            )
        return record

    def survivors(self) -> np.ndarray:
        """The kept rows of every anchor, nearest first, ``-1`` after them: ``(A, skip_top + window)``."""
        order = np.argsort(~self.kept, axis=1, kind="stable")
        return np.take_along_axis(np.where(self.kept, self.ranked, -1), order, axis=1)


def window_recall(approx: CorpusCandidates, exact: CorpusCandidates, rows: np.ndarray | None = None) -> float:
    """How much of an exact search's window an approximate search finds: over the anchors searched by
    both that have exact survivors, the mean share of the exact survivors (the candidates kept after
    ``skip_top`` and the guards) that are also among the approximate search's survivors.

    Args:
        approx (CorpusCandidates): The approximate search's lists (for instance ``search="ivf"``).
        exact (CorpusCandidates): The exact search's lists, with the same ``window``, ``skip_top`` and
            guards.
        rows (numpy.ndarray, optional): The rows of ``approx`` that match the rows of ``exact``, when
            ``exact`` searched a subset (the ``pairs`` it was given, if ``approx`` searched them all).
            Default: the same rows.

    Returns:
        float: The window recall in ``[0, 1]``; NaN when no anchor has exact survivors.

    Example:
        >>> exact = CorpusCandidates(np.array([[4, 5, 6]]), np.array([[0, 1, 1]], bool), np.zeros((1, 4)), np.ones(1, bool))
        >>> approx = exact._replace(ranked=np.array([[4, 5, 7]]))
        >>> window_recall(approx, exact)
        0.5
    """
    if rows is not None:
        approx = approx._make(None if field is None else np.asarray(field)[rows] for field in approx)
    if approx.ranked.shape[0] != exact.ranked.shape[0]:
        raise ValueError(
            f"approx and exact must cover the same anchors, got {approx.ranked.shape[0]} and "
            f"{exact.ranked.shape[0]} rows: pass rows= (the pairs exact searched) to match them."
        )
    ours, theirs = approx.survivors(), exact.survivors()
    counted = (theirs >= 0).sum(axis=1)
    both = np.flatnonzero(approx.searched & exact.searched & (counted > 0))
    shares = np.empty(both.size)
    for start in range(0, both.size, 65536):  # blocks: (anchors, window, window) comparisons
        at = both[start : start + 65536]
        hits = ((theirs[at, :, None] == ours[at, None, :]) & (theirs[at, :, None] >= 0)).any(axis=2)
        shares[start : start + 65536] = hits.sum(axis=1) / counted[at]
    return float(shares.mean()) if both.size else float("nan")
