"""What a corpus search finds, and how much of an exact search's window an approximate one finds.

:class:`CorpusCandidates` holds the lists of
:func:`~composer_dynsample.samplers._corpus_search.corpus_candidates` (whichever search made them), and
:func:`window_recall` compares an approximate search's lists (the own IVF, faiss's IVF) with the exact
ones: the tests and the corpus benchmarks measure the approximate searches with it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["CorpusCandidates", "window_recall"]


class CorpusCandidates(NamedTuple):
    """What :func:`~composer_dynsample.samplers._corpus_search.corpus_candidates` finds for the anchors of
    the pairs it searched.

    Attributes:
        ranked (numpy.ndarray): ``(A, skip_top + window)`` int64, the passage rows examined, nearest
            first, ``-1`` where an anchor has fewer (or none: not searched).
        kept (numpy.ndarray): ``(A, skip_top + window)`` bool, which of them passed every guard (the
            ``skip_top`` first never do).
        dropped (numpy.ndarray): ``(A, 4)`` int64, how many candidates each of
            :data:`~composer_dynsample.samplers._corpus_search.GUARDS` dropped.
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
        approx = approx._make(np.asarray(field)[rows] for field in approx)
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
