"""The epoch plan of :class:`~composer_dynsample.samplers.MinedNegativesPKBatchSampler`, by refresh segments.

An epoch's batches are the pair sampler's P x K batches of pairs with each anchor's negatives appended,
planned from a snapshot of candidate lists (:func:`~composer_dynsample.samplers._negative_plan.plan_negatives`).
With ``refresh_every`` the epoch is cut into segments of ``refresh_every`` batches a rank, and a snapshot
refreshed within the epoch applies from its segment on: each segment's negatives are planned once per
(epoch, segment, snapshot), from the snapshot in force there, with a random stream of its own. This mixin
holds that plan; the sampler holds the snapshots (``_snapshot``, ``_segments``) and the pair sampler.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from composer_dynsample.samplers._negative_plan import PLAN_COUNTS, plan_negatives
from composer_dynsample.samplers.base import epoch_rng

__all__ = ["SegmentPlan"]

_SEGMENT_STREAM = 1 << 20  # the random stream of a refresh segment: 4 is the epoch's first


class SegmentPlan:
    """The epoch's batches of a mined-negatives sampler, planned segment by segment (see the module docstring).

    The sampler provides ``_pair_batches`` (its P x K sampler of pairs), ``_snapshot`` (the epoch's candidate
    lists), ``_segments`` (``{epoch: {segment: snapshot}}`` of the refreshes within an epoch), ``_cached``,
    ``refresh_every``, ``pairs_per_batch``, ``negatives_per_anchor`` and the sampler contract's ``epoch``,
    ``seed``, ``rank`` and ``num_replicas``.
    """

    _pair_batches: Any
    _snapshot: Any
    _segments: dict[int, dict[int, Any]]
    _cached: dict[tuple[int, int, int], tuple[np.ndarray, dict[str, int]]]
    refresh_every: int | None
    pairs_per_batch: int
    negatives_per_anchor: int
    epoch: int
    seed: int
    rank: int
    num_replicas: int

    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks: ``(num_global_batches, P * (2 + negatives_per_anchor))``."""
        return self._plan(epoch)[0]

    def guard_counts(self, epoch: int | None = None) -> dict[str, int]:
        """What the guards dropped in an epoch's plan (default: the current epoch), for logging.

        Over the epoch's anchors: the search's guards of :data:`GUARDS` (``rank_window``: candidates
        skipped at the top; ``duplicate``; ``same_query``; ``margin``), then the plan's: ``in_batch``
        (survivors skipped because their text was in the batch already), ``random`` (negatives drawn at
        random), ``no_embedding`` (anchors without candidates: before the first snapshot, every one) and
        ``above_positive`` (mined negatives at least as similar to their anchor as its own positive, in the
        snapshot they came from: the likeliest unlabelled answers that passed the guards).
        """
        return dict(self._plan(self.epoch if epoch is None else epoch)[1])

    def _plan(self, epoch: int) -> tuple[np.ndarray, dict[str, int]]:
        pairs = self._pair_batches.global_batches(epoch)  # (n, 2P): the pair sampler's, untouched
        n = pairs.shape[0]
        step = self._segment_batches(n)
        parts, counts = [], dict.fromkeys(PLAN_COUNTS, 0)
        for segment in range(-(-n // step)):
            negatives, part_counts = self._segment_negatives(epoch, segment, pairs, step)
            parts.append(negatives)
            for name, value in part_counts.items():
                counts[name] += value
        batches = np.concatenate([pairs, np.concatenate(parts)], axis=1)
        batches.flags.writeable = False
        return batches, counts

    def _segment_negatives(
        self, epoch: int, segment: int, pairs: np.ndarray, step: int
    ) -> tuple[np.ndarray, dict[str, int]]:
        """The negatives of the epoch's global batches ``segment x step`` onwards (``step`` of them) and their
        counts, from the snapshot in force there, built once per (epoch, segment, snapshot)."""
        refreshed = self._segments.get(int(epoch), {})
        if any(key[0] != epoch for key in self._cached):
            self._cached = {}  # one epoch's segments at a time
        source = max((s for s in refreshed if s <= segment), default=-1)  # -1: the epoch's snapshot
        key = (int(epoch), segment, source)
        if key not in self._cached:
            snapshot = self._snapshot if source < 0 else refreshed[source]
            stream = 4 if segment == 0 else _SEGMENT_STREAM + segment
            start = segment * step
            self._cached[key] = plan_negatives(
                self, pairs[start : start + step], snapshot, epoch_rng(self.seed, epoch, stream)
            )
        return self._cached[key]

    def _rank_segment(self, segment: int, per_rank: int) -> np.ndarray:
        """This rank's batches ``segment x refresh_every`` onwards, ``refresh_every`` of them (fewer at the end):
        the rows :meth:`rank_batches` holds there, with only the negatives of the segments they come from
        built (a refresh rebuilds none of the epoch's later segments, which a later refresh replaces)."""
        pairs = self._pair_batches.global_batches(self.epoch)
        step = self._segment_batches(pairs.shape[0])
        at = np.arange(
            segment * (self.refresh_every or 0), min((segment + 1) * (self.refresh_every or 0), per_rank)
        )
        rows = (at * self.num_replicas + self.rank) % pairs.shape[0]  # the padding wraps to the epoch's start
        negatives = np.empty((rows.size, self.pairs_per_batch * self.negatives_per_anchor), dtype=np.int64)
        for source in np.unique(rows // step).tolist():
            chosen = rows // step == source
            negatives[chosen] = self._segment_negatives(self.epoch, source, pairs, step)[0][
                rows[chosen] - source * step
            ]
        return np.concatenate([pairs[rows], negatives], axis=1)

    def _segment_batches(self, global_batches: int) -> int:
        """The global batches of a refresh segment: ``refresh_every`` on every rank, or the whole epoch's
        ``global_batches`` without refreshes."""
        return global_batches if self.refresh_every is None else self.refresh_every * self.num_replicas
