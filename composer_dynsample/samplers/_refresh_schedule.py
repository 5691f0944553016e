"""When :class:`~composer_dynsample.samplers.mined_negatives.MinedNegativesPKBatchSampler` searches its
snapshots and from which batch each applies: at epoch starts, every ``refresh_every`` batches of a rank,
inline or beside training (``refresh_in_background``).

A snapshot applies to the segments of ``refresh_every`` batches of an epoch, kept as ``{epoch: {segment:
candidates}}`` (the newest epoch only): a segment takes the snapshot of the nearest segment at or before
it, else the epoch's own (``_snapshot``). Inline, the search at the epoch's batch ``k * refresh_every``
applies from segment ``k``; in the background it applies from segment ``k + 1``, and the snapshot handed
over at an epoch start from the epoch's segment 1.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._background import BackgroundRefreshes
from composer_dynsample.samplers._candidates import CorpusCandidates
from composer_dynsample.samplers._corpus_search import GUARDS
from composer_dynsample.validation import check_bool, check_int


class RefreshSchedule:
    """The snapshot schedule of ``MinedNegativesPKBatchSampler``, a base of that class alone: it reads and
    sets the sampler's snapshot state (``_snapshot``, ``_pending``, ``_segments``) and calls its
    ``_search`` and ``_activate``."""

    epoch: int
    last_skipped: dict[str, int]
    _snapshot: CorpusCandidates | None
    _pending: CorpusCandidates | None
    _search: Callable[[torch.Tensor, Any], CorpusCandidates]
    _activate: Callable[[CorpusCandidates | None], None]

    def _set_snapshot_schedule(
        self, max_snapshots: int | None, refresh_every: int | None, refresh_in_background: bool
    ) -> None:
        """Check and set when snapshots are taken (``max_snapshots``, ``refresh_every``,
        ``refresh_in_background``), none taken yet."""
        self.max_snapshots = check_int("max_snapshots", max_snapshots, minimum=1, allow_none=True)
        self._snapshots_taken = 0  # snapshots handed over and searched, pending ones included
        self.refresh_every = check_int("refresh_every", refresh_every, minimum=1, allow_none=True)
        self.refresh_in_background = check_bool("refresh_in_background", refresh_in_background)
        if self.refresh_in_background and self.refresh_every is None:
            raise ValueError(
                "refresh_in_background=True runs the refreshes within an epoch beside training, and there are "
                "none: set refresh_every=N as well (a refresh every N batches of a rank)."
            )
        self._background = BackgroundRefreshes()  # the searches running beside training
        #: ``() -> (rows, valid)`` for a refresh within an epoch; set by ``EmbeddingTable``.
        self.snapshot_source: Callable[[], tuple[torch.Tensor, torch.Tensor | None] | None] | None = None
        # The refreshes of the newest epoch that had any: {epoch: {segment: snapshot}}.
        self._segments: dict[int, dict[int, CorpusCandidates]] = {}
        self._refresh_digest = ""  # a hash chain over every refresh taken: in the snapshot fingerprint
        #: One :meth:`CorpusCandidates.summary` per snapshot taken effect, with its ``epoch`` and the
        #: ``segment`` it applies from (``0``: the epoch start's): what the guards dropped and how many kept
        #: candidates score above the positive, refresh after refresh (in the state dict).
        self.snapshot_log: list[dict[str, float]] = []
        self._reading: tuple[int, int] | None = None  # (epoch, segment) while the source is read

    def _schedule_state(self) -> dict[str, Any]:
        """The schedule's part of the sampler's state dict (the searches running beside training joined)."""
        return {
            "handover": self._background.handover_state(),
            "snapshots_taken": self._snapshots_taken,
            "refresh_digest": self._refresh_digest,
            "snapshot_log": list(self.snapshot_log),
            "segments": {
                epoch: {segment: found._asdict() for segment, found in found_by_segment.items()}
                for epoch, found_by_segment in self._segments.items()
            },
        }

    def _load_schedule_state(self, state: dict[str, Any], taken_before: int) -> None:
        """Restore :meth:`_schedule_state` (``taken_before``: the snapshots a state from before the count
        was kept held)."""
        self._snapshots_taken = int(state.get("snapshots_taken", taken_before))
        self._refresh_digest = str(state.get("refresh_digest", ""))
        self.snapshot_log = list(state.get("snapshot_log", []))
        self._segments = {
            int(epoch): {int(segment): CorpusCandidates(**found) for segment, found in by_segment.items()}
            for epoch, by_segment in (state.get("segments") or {}).items()
        }
        self._background = BackgroundRefreshes(state.get("handover"))  # searches running here are dropped

    def _log_snapshot(self, epoch: int, segment: int, found: CorpusCandidates) -> None:
        self.snapshot_log.append({"epoch": float(epoch), "segment": float(segment), **found.summary()})

    def _capped(self) -> bool:
        """Whether ``max_snapshots`` were taken: no further search, at an epoch start or within one."""
        return self.max_snapshots is not None and self._snapshots_taken >= self.max_snapshots

    def wants_snapshot(self) -> bool:
        """Whether the next snapshot handed over or read from :attr:`snapshot_source` would be searched."""
        return not self._capped()

    def upcoming_segment(self, epoch: int) -> tuple[int, int]:
        """``(epoch, segment)`` of the batches the next snapshot applies from: while :attr:`snapshot_source`
        is read within an epoch, the refresh's; otherwise the one handed over at ``epoch``'s start (its
        segment 1 with ``refresh_in_background`` and a snapshot in force, else its segment 0)."""
        if self._reading is not None:
            return self._reading
        return epoch, int(self.refresh_in_background and self._in_force())

    @property
    def refreshes(self) -> int:
        """Refreshes within the current epoch so far (``refresh_every``): the snapshots that took effect
        within it, with ``refresh_in_background`` the one handed over at its start included."""
        return len(self._segments.get(self.epoch, {}))

    def _refresh(self, segment: int, background: bool = False) -> None:
        """Search the source's rows for the epoch's ``segment`` (once: a resumed epoch keeps its own); with
        ``background``, a copy of them beside training, joined when the iteration reaches ``segment``."""
        if self.snapshot_source is None or self.epoch < max(self._segments, default=-1):
            return  # an earlier epoch iterated again (Composer spins them on resume): no search
        if segment in self._segments.get(self.epoch, {}) or (self.epoch, segment) in self._background.running:
            return
        if self._capped():
            return
        self._reading = (self.epoch, segment)  # what upcoming_segment tells the source
        try:
            found = self.snapshot_source()
        finally:
            self._reading = None
        if found is None:
            return
        self._snapshots_taken += 1
        if background:
            self._background.start((self.epoch, segment), self._search, *found)
        else:
            self._keep_refresh(self.epoch, segment, self._search(*found))

    def _keep_refresh(self, epoch: int, segment: int, searched: CorpusCandidates) -> None:
        """Keep ``searched`` as the snapshot of ``epoch`` from ``segment`` on, in the fingerprint's chain."""
        self._segments = {epoch: {**self._segments.get(epoch, {}), segment: searched}}
        self._log_snapshot(epoch, segment, searched)
        digest = hashlib.sha256(f"{self._refresh_digest}:{epoch}:{segment}".encode())
        for array in (searched.ranked, searched.kept, searched.searched):
            digest.update(np.ascontiguousarray(array).tobytes())
        self._refresh_digest = digest.hexdigest()

    # --------------------------------------------------------------------------- refresh_in_background
    def _in_force(self) -> bool:
        """Whether a snapshot was taken (in force, pending or being searched): ``refresh_in_background``
        searches every later one beside training."""
        return (
            self._snapshot is not None
            or self._pending is not None
            or any(self._segments.values())
            or self._background.busy()
        )

    def _hand_over(self, embeddings: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Search a copy of an epoch start's rows beside the next epoch's first segment, to apply from its
        batch ``refresh_every`` (not started when the epoch has no such batch)."""
        if (self.refresh_every or 0) >= len(self):
            return
        self._snapshots_taken += 1
        self._background.hand_over(self._search, embeddings, valid)

    def _roll_forward(self, epoch: int) -> None:
        """At ``set_epoch``: an epoch later than the one held starts from the newest snapshot in force (the
        last one the epoch before applied), and the search handed over since applies from its segment 1."""
        held = max(self._segments, default=-1)
        if epoch <= held:
            return  # the same epoch again, or an earlier one (Composer spins them on resume)
        newest = self._segments.get(held, {})
        self._activate(newest[max(newest)] if newest else self._snapshot)
        self._segments = {epoch: {}}
        self._background.assign(epoch)

    def _boundary(self, segment: int, per_rank: int) -> None:
        """At the epoch's batch ``segment x refresh_every``: wait for the search that applies from here,
        then start the next segment's, if the epoch has one (the run's first snapshot is searched inline,
        for this segment)."""
        self._join_background(segment)
        if not self._in_force():
            self._refresh(segment)
        elif (segment + 1) * (self.refresh_every or 0) < per_rank:
            self._refresh(segment + 1, background=True)

    def _join_background(self, segment: int | None = None) -> None:
        """Wait for the epoch's searches running beside training (one ``segment``'s, or all) and keep each
        from the segment it applies from; the one handed over at the epoch start sets ``last_skipped``."""
        for (epoch, applies_from), searched in self._background.join(self.epoch, segment):
            self._keep_refresh(epoch, applies_from, searched)
            if applies_from == 1:  # only the epoch start's search applies from segment 1
                totals = searched.dropped.sum(axis=0).tolist()
                self.last_skipped = {name: int(count) for name, count in zip(GUARDS, totals)}
