"""How far the negatives mined from the table are from the current model's: the overlap of candidate lists.

The table's rows were written by older models (and in training mode), so a snapshot ranks each anchor's
candidates as no single model would. :class:`ListDrift` measures that at each snapshot the sampler takes:
it encodes every row of the training set with the model as it is then (eval mode, ``no_grad``, each rank a
share, gathered, the global random states put back), searches those fresh rows with the sampler's own search
(its window, guards and margins), and compares each anchor's kept candidates with what the table's rows give:

- ``overlap_table``: the mean, over anchors with candidates in both, of the share of the current model's
  kept candidates that the table's lists also hold (1.0: the table mines exactly what the current model
  would);
- ``top1_table``: the share of those anchors whose nearest kept candidate is the same;
- ``overlap_first`` and ``top1_first``: the same for the first snapshot's lists, what mining once keeps
  using all run long (the first check compares them with the model of that moment).

It is a diagnostic: an extra eval-mode encoding of the whole training set per snapshot, asked for with
:class:`~composer_dynsample.EmbeddingTable`'s ``list_drift=True``; training reads nothing from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates

__all__ = ["ListDrift", "list_overlap"]


def list_overlap(held: CorpusCandidates, current: CorpusCandidates) -> tuple[float, float, int]:
    """``(overlap, top-1 agreement, anchors)`` of ``held``'s kept candidates against ``current``'s.

    For each anchor searched in both with at least one kept candidate in ``current``: the share of
    ``current``'s kept candidates that ``held`` also keeps, and whether their nearest kept candidates are the
    same row. NaN and ``0`` anchors when none qualifies.

    Example:
        >>> def found(ranked, kept):
        ...     ranked, kept = np.array(ranked), np.array(kept)
        ...     return CorpusCandidates(ranked, kept, np.zeros((len(ranked), 4), np.int64), np.ones(len(ranked), bool))
        >>> now = found([[4, 5, 6], [7, 8, 9]], [[True, True, True], [True, True, False]])
        >>> old = found([[5, 4, 1], [8, 7, 9]], [[True, True, True], [True, True, True]])
        >>> tuple(round(x, 4) if isinstance(x, float) else x for x in list_overlap(old, now))
        (0.8333, 0.0, 2)
    """
    both = held.searched & current.searched
    overlaps, same_first = [], []
    for anchor in np.flatnonzero(both):
        now = current.ranked[anchor][current.kept[anchor]]
        if now.size == 0:
            continue
        then = held.ranked[anchor][held.kept[anchor]]
        overlaps.append(np.isin(now, then).mean())
        same_first.append(then.size > 0 and then[0] == now[0])
    if not overlaps:
        return float("nan"), float("nan"), 0
    return float(np.mean(overlaps)), float(np.mean(same_first)), len(overlaps)


class ListDrift:
    """The checks of one :class:`~composer_dynsample.EmbeddingTable` run: the first snapshot's lists and a
    record per check since the last :meth:`take` (both in the checkpoint)."""

    def __init__(self) -> None:
        self._first: CorpusCandidates | None = None
        self._records: list[dict[str, float]] = []

    @staticmethod
    def wanted(sampler: Any) -> bool:
        """Whether ``sampler`` searches candidate lists (``search_corpus``) and is about to take a snapshot."""
        return callable(getattr(sampler, "search_corpus", None)) and bool(sampler.wants_snapshot())

    def check(
        self,
        sampler: Any,
        rows: torch.Tensor,
        valid: torch.Tensor | None,
        encode: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        *,
        epoch: int,
        step: int,
    ) -> dict[str, float]:
        """Encode every row afresh (``encode(row_indices) -> (indices, embeddings)``, gathered from the
        ranks in any order), search the table's ``rows`` and the fresh ones with ``sampler.search_corpus``
        and record how their lists overlap (and the first snapshot's); returns the record."""
        started = time.perf_counter()
        indices, embeddings = encode(torch.arange(rows.shape[0]))
        fresh = torch.empty(rows.shape, dtype=torch.float32, device=embeddings.device)
        fresh[indices.to(embeddings.device)] = embeddings.float()
        held = sampler.search_corpus(rows, valid)
        current = sampler.search_corpus(fresh, None)
        if self._first is None:
            self._first = held
        overlap, top1, anchors = list_overlap(held, current)
        first, first_top1, _ = list_overlap(self._first, current)
        record = {
            "epoch": float(epoch), "step": float(step), "anchors": float(anchors),
            "overlap_table": overlap, "top1_table": top1, "overlap_first": first, "top1_first": first_top1,
            "rows_encoded": float(fresh.shape[0]), "seconds": time.perf_counter() - started,
        }  # fmt: skip
        self._records.append(record)
        return record

    def take(self) -> list[dict[str, float]]:
        """The records since the last call, which starts a new list."""
        records, self._records = self._records, []
        return records

    def state_dict(self) -> dict[str, Any]:
        return {
            "first": None if self._first is None else self._first._asdict(),
            "records": [dict(record) for record in self._records],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        first = state.get("first")
        self._first = None if first is None else CorpusCandidates(**first)
        self._records = [dict(record) for record in state.get("records", [])]
