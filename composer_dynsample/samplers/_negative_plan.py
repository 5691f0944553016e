"""How a batch's negative slots are filled: each anchor's mined candidates, then random passages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates
from composer_dynsample.samplers._corpus_search import GUARDS
from composer_dynsample.validation import as_labels

_DRAWS_PER_BLOCK = 4096  # random passages drawn at a time; a fixed size keeps the plan a pure function
_DRAWS_BEFORE_SCAN = 64  # rejected random draws for one slot before the valid passages are listed


class NegativePlanner:
    """Fills one batch's negative slots: each anchor's candidates in order, then random passages.

    A negative is never a text already in the batch (a pair's row or an earlier negative), and a random
    one never a passage of a pair whose anchor has the anchor's text (that includes the anchor's own)
    nor one of the anchor's candidates that the rank window or a guard dropped.
    """

    def __init__(
        self,
        texts: np.ndarray,
        positives: np.ndarray,
        query_texts: np.ndarray,
        per_anchor: int,
        rng: np.random.Generator,
    ) -> None:
        self.texts, self.positives, self.query_texts = texts, positives, query_texts
        self.passage_texts = texts[positives]
        self.per_anchor, self.rng = per_anchor, rng
        self.in_batch = self.random = 0
        self._draws: list[tuple[int, int, int]] = []

    def batch(
        self,
        batch_texts: list[int],
        anchor_texts: list[int],
        ordered: np.ndarray,
        forbidden: np.ndarray | None,
    ) -> list[int]:
        """The negatives of one batch, anchor after anchor: ``ordered`` holds each anchor's candidates in
        the order to take them, ``forbidden`` the ones it must not take (both ``(P, width)``, ``-1`` empty;
        ``None``: no snapshot)."""
        texts = set(batch_texts)
        out: list[int] = []
        rows, row_texts = ordered.tolist(), self.texts[np.maximum(ordered, 0)].tolist()
        excluded_rows = None if forbidden is None else forbidden.tolist()
        for j, anchor_text in enumerate(anchor_texts):
            taken = 0
            for row, text in zip(rows[j], row_texts[j]):
                if row < 0 or taken == self.per_anchor:
                    break
                if text in texts:
                    self.in_batch += 1
                    continue
                texts.add(text)
                out.append(row)
                taken += 1
            if taken < self.per_anchor:
                excluded = set() if excluded_rows is None else set(excluded_rows[j])  # -1 is no row
                self._fill(out, texts, anchor_text, excluded, self.per_anchor - taken)
        return out

    def _fill(
        self, out: list[int], texts: set[int], anchor_text: int, excluded: set[int], count: int
    ) -> None:
        """Append ``count`` random passages whose text is not in the batch, whose query is not the
        anchor's and which are not ``excluded``."""
        self.random += count
        rejected = 0
        while count:
            if not self._draws:
                pairs = self.rng.integers(0, self.positives.size, size=_DRAWS_PER_BLOCK)
                block = zip(
                    self.positives[pairs].tolist(),
                    self.passage_texts[pairs].tolist(),
                    self.query_texts[pairs].tolist(),
                )
                self._draws = list(block)[::-1]  # popped from the end: drawn in order
            row, text, query_text = self._draws.pop()
            if text in texts or query_text == anchor_text or row in excluded:
                rejected += 1
                if rejected < _DRAWS_BEFORE_SCAN:
                    continue
                row, text = self._scan(texts, anchor_text, excluded)
            texts.add(text)
            out.append(row)
            count, rejected = count - 1, 0

    def _scan(self, texts: set[int], anchor_text: int, excluded: set[int]) -> tuple[int, int]:
        """One of the passages allowed for the slot, at random: few are left, so they are listed (the
        sampler's constructor made sure there is one)."""
        allowed = ~np.isin(self.passage_texts, np.fromiter(texts, dtype=np.int64))
        allowed &= self.query_texts != anchor_text
        allowed &= ~np.isin(self.positives, np.fromiter(excluded, dtype=np.int64))
        choices = np.flatnonzero(allowed)
        pair = int(choices[self.rng.integers(0, choices.size)])
        return int(self.positives[pair]), int(self.passage_texts[pair])


def ordered_candidates(
    snapshot: CorpusCandidates | None,
    own: np.ndarray,
    rng: np.random.Generator,
    counts: dict[str, int],
    pairs_per_batch: int,
    width: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The anchors' kept candidates, each row in a random order with ``-1`` last, and the candidates they
    must not take (examined and not kept; ``None`` before a snapshot).

    Args:
        snapshot (CorpusCandidates, optional): The candidate lists, ``None`` before the first snapshot.
        own (numpy.ndarray): The pair of each anchor of the batches, batch after batch.
        rng (numpy.random.Generator): The segment's random stream (``own.size x width`` draws).
        counts (dict[str, int]): The plan's counts: the snapshot's guard counts over these anchors and
            ``no_embedding`` are set.
        pairs_per_batch (int): P.
        width (int): ``skip_top + window``, the candidates each list holds.

    Returns:
        tuple[numpy.ndarray, numpy.ndarray | None]: Both ``(n, P, width)``, ``-1`` where empty.
    """
    shape = (own.size // pairs_per_batch, pairs_per_batch, width)
    keys = rng.random((own.size, width))
    if snapshot is None:
        counts["no_embedding"] = int(own.size)
        return np.full(shape, -1, dtype=np.int64), None
    for name, total in zip(GUARDS, snapshot.dropped[own].sum(axis=0).tolist()):
        counts[name] = int(total)
    counts["no_embedding"] = int((~snapshot.searched[own]).sum())
    ranked, kept = snapshot.ranked[own], snapshot.kept[own]
    order = np.argsort(np.where(kept, keys, 2.0), axis=1, kind="stable")
    ordered = np.take_along_axis(np.where(kept, ranked, -1), order, axis=1)
    return ordered.reshape(shape), np.where(kept, -1, ranked).reshape(shape)


#: row_array's wording of as_labels' shape errors: the rows of a sampler's per-pair arrays.
_ROW_MESSAGES = {
    "ndim": "{name} must be a non-empty 1-D sequence, got shape {shape}.",
    "length": "{name} must have one entry per row of labels ({num_items},), got shape {shape}.",
}


def row_array(
    name: str, values: Sequence[Any] | np.ndarray | torch.Tensor, size: int | None, dtype: type | None = None
) -> np.ndarray:
    """A 1-D numpy array, with ``size`` entries when given: bool (``dtype=bool``) or integers (checked by
    :func:`~composer_dynsample.validation.as_labels`), else a clear error."""
    if dtype is not bool:
        array = as_labels(name, values, size, "labels", messages=_ROW_MESSAGES)
        if array.size == 0:
            raise ValueError(_ROW_MESSAGES["ndim"].format(name=name, shape=array.shape))
        return array
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.shape != (size,):
        raise ValueError(_ROW_MESSAGES["length"].format(name=name, num_items=size, shape=array.shape))
    if array.dtype != np.bool_:
        raise ValueError(f"{name} must hold booleans, got dtype {array.dtype}.")
    return array.astype(bool, copy=False)
