"""The float64 ranking both model-aware samplers use, so that their lists are a pure function of the snapshot.

A fast float32 pass keeps ``SLACK`` candidates beyond the wanted ones; :func:`rank_columns` then orders
them by a float64 key with ties in id order, which no float32 rounding or thread count can change.
"""

from __future__ import annotations

import numpy as np

#: Candidates a float32 pass keeps beyond the wanted ones, so the float64 ranking sees the true top.
SLACK = 8


def rank_columns(keys: np.ndarray, ids: np.ndarray, keep: int) -> np.ndarray:
    """Per row, the first ``keep`` columns in ascending ``keys`` order, ties by ``ids``, NaN keys last.

    Example:
        >>> keys = np.array([[2.0, 1.0, 1.0, np.nan]])
        >>> rank_columns(keys, np.array([[0, 7, 3, 1]]), 3).tolist()
        [[2, 1, 0]]
    """
    return np.lexsort((ids, np.isnan(keys), keys), axis=1)[:, :keep]
