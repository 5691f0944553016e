"""How a batch's negative slots are filled: each anchor's mined candidates, then random passages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates
from composer_dynsample.samplers._corpus_search import GUARDS
from composer_dynsample.validation import as_labels

_DRAWS_PER_BLOCK = 4096  # random passages drawn at a time; a fixed size keeps the plan a pure function
_DRAWS_BEFORE_SCAN = 64  # rejected random draws for one slot before the valid passages are listed
#: What ``MinedNegativesPKBatchSampler.guard_counts`` reports: the search's guards, then the plan's.
PLAN_COUNTS = (*GUARDS, "in_batch", "random", "no_embedding", "above_positive")
#: How an anchor takes its kept candidates (:class:`Sampling`).
SAMPLINGS = ("uniform", "softmax", "simans")


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


class Sampling(NamedTuple):
    """The order in which an anchor takes its kept candidates, from one uniform draw ``u`` per candidate.

    - ``"uniform"``: a uniformly random order (the order of ``u``);
    - ``"softmax"``: sampling without replacement with probabilities ``softmax(similarity / temperature)``
      over the kept candidates, by the Gumbel-top-k trick (Kool et al. 2019; the Gumbel-max sampling of
      Lindgren et al.'s negative cache): descending ``similarity / temperature - log(-log u)``;
    - ``"simans"``: SimANS' weights (Zhou et al. 2022), ``exp(-((similarity - positive - shift) /
      temperature) ** 2)``, where ``positive`` is the anchor's similarity to its own positive: the
      candidates near ``positive + shift`` are likeliest, the far easy ones and the ones far above the
      positive (likely unlabelled answers) rare. An anchor whose positive has no embedding samples
      uniformly.

    A small ``temperature`` approaches the hardest-first order (``"softmax"``) or the candidates nearest the
    positive's score (``"simans"``); a large one the uniform order.
    """

    name: str = "uniform"
    temperature: float = 0.05
    shift: float = 0.0

    def keys(self, snapshot: CorpusCandidates, own: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Sort keys (ascending: taken first) of the candidates of the anchors of pairs ``own``."""
        if self.name == "uniform" or snapshot.similarity is None or snapshot.positive is None:
            return uniform
        similarity = snapshot.similarity[own]
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.name == "softmax":
                log_weight = similarity / self.temperature
            else:
                gap = similarity - snapshot.positive[own][:, None] - self.shift
                log_weight = -np.square(gap / self.temperature)
            log_weight = np.where(np.isnan(log_weight), 0.0, log_weight)  # no positive: uniform
            gumbel = -np.log(-np.log(np.maximum(uniform, np.finfo(np.float64).tiny)))
            return -(log_weight + gumbel)


#: The default order: the kept candidates uniformly at random.
UNIFORM = Sampling()


def ordered_candidates(
    snapshot: CorpusCandidates | None,
    own: np.ndarray,
    rng: np.random.Generator,
    counts: dict[str, int],
    pairs_per_batch: int,
    width: int,
    sampling: Sampling = UNIFORM,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The anchors' kept candidates, each row in the order ``sampling`` draws with ``-1`` last, the
    candidates they must not take (examined and not kept; ``None`` before a snapshot), and which of the
    ordered ones are at least as similar to the anchor as its positive (``None`` before a snapshot).

    Args:
        snapshot (CorpusCandidates, optional): The candidate lists, ``None`` before the first snapshot.
        own (numpy.ndarray): The pair of each anchor of the batches, batch after batch.
        rng (numpy.random.Generator): The segment's random stream (``own.size x width`` draws).
        counts (dict[str, int]): The plan's counts: the snapshot's guard counts over these anchors and
            ``no_embedding`` are set.
        pairs_per_batch (int): P.
        width (int): ``skip_top + window``, the candidates each list holds.
        sampling (Sampling): How each anchor orders its kept candidates. Default: uniformly at random.

    Returns:
        tuple[numpy.ndarray, numpy.ndarray | None, numpy.ndarray | None]: All ``(n, P, width)``: the ordered
        candidates and the forbidden ones (``-1`` where empty), and the ordered ones above the positive.
    """
    shape = (own.size // pairs_per_batch, pairs_per_batch, width)
    uniform = rng.random((own.size, width))
    if snapshot is None:
        counts["no_embedding"] = int(own.size)
        return np.full(shape, -1, dtype=np.int64), None, None
    for name, total in zip(GUARDS, snapshot.dropped[own].sum(axis=0).tolist()):
        counts[name] = int(total)
    counts["no_embedding"] = int((~snapshot.searched[own]).sum())
    ranked, kept = snapshot.ranked[own], snapshot.kept[own]
    keys = sampling.keys(snapshot, own, uniform)
    order = np.argsort(np.where(kept, keys, np.inf), axis=1, kind="stable")
    ordered = np.take_along_axis(np.where(kept, ranked, -1), order, axis=1)
    above = np.take_along_axis(snapshot.above_positive()[own], order, axis=1)
    return ordered.reshape(shape), np.where(kept, -1, ranked).reshape(shape), above.reshape(shape)


def plan_negatives(
    sampler: Any, pairs: np.ndarray, snapshot: CorpusCandidates | None, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, int]]:
    """The negatives of ``pairs``' batches (``(n, 2P)`` rows) from ``snapshot``, and what the guards and the
    plan did (:data:`PLAN_COUNTS`); ``sampler`` is the
    :class:`~composer_dynsample.samplers.mined_negatives.MinedNegativesPKBatchSampler` whose layout, window
    and sampling they follow."""
    n, p = pairs.shape[0], sampler.pairs_per_batch
    chunks = pairs.reshape(n, p, 2)
    first_is_anchor = ~sampler.is_passage[chunks[:, :, 0]]
    anchor_rows = np.where(first_is_anchor, chunks[:, :, 0], chunks[:, :, 1]).reshape(-1)
    own = sampler._pair_of[anchor_rows]
    counts = dict.fromkeys(PLAN_COUNTS, 0)
    width = sampler.skip_top + sampler.window
    ordered, forbidden, above = ordered_candidates(
        snapshot, own, rng, counts, sampler.pairs_per_batch, width, sampler.sampling
    )
    planner = NegativePlanner(
        sampler._texts,
        sampler._positives,
        sampler._texts[sampler._anchors],
        sampler.negatives_per_anchor,
        rng,
    )
    negatives = np.empty((n, p * sampler.negatives_per_anchor), dtype=np.int64)
    anchor_texts = sampler._texts[anchor_rows].reshape(n, p)
    for b in range(n):
        batch_texts = sampler._texts[pairs[b]].tolist()
        excluded = None if forbidden is None else forbidden[b]
        negatives[b] = planner.batch(batch_texts, anchor_texts[b].tolist(), ordered[b], excluded)
    counts["in_batch"], counts["random"] = planner.in_batch, planner.random
    if above is not None:  # each taken negative against its anchor's ordered candidates
        taken = negatives.reshape(n, p, sampler.negatives_per_anchor, 1)
        hits = (taken == ordered[:, :, None, :]) & above[:, :, None, :]
        counts["above_positive"] = int(hits.any(axis=3).sum())
    negatives.flags.writeable = False  # cached: shared by every caller of this epoch's plan
    return negatives, counts


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
