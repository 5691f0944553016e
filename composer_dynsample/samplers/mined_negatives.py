"""Pair batches with corpus negatives mined by the current model: ANCE inside the trainer.

ANCE (Xiong et al. 2020) and RocketQA train a retriever on negatives taken from the corpus by an index
of the model being trained, refreshed every few thousand steps by a second job. Here the index is
:class:`~composer_dynsample.EmbeddingTable`, which the forward pass keeps up to date and hands to
:class:`MinedNegativesPKBatchSampler` at every epoch start (the first one too when the table's
``warm_start`` encoded the training set with the starting model): identical on every rank, part of the
checkpoint, with the false-negative guards of the field (a rank window, a margin relative to the
positive, no identical texts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates
from composer_dynsample.samplers._corpus_search import (
    GUARDS,
    check_corpus_search,
    corpus_candidates,
    dense_ids,
    pair_layout,
)
from composer_dynsample.samplers._negative_plan import SAMPLINGS, Sampling, row_array
from composer_dynsample.samplers._refresh_schedule import RefreshSchedule
from composer_dynsample.samplers._segment_plan import SegmentPlan
from composer_dynsample.samplers.base import DistributedBatchSampler
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler, pair_centroids
from composer_dynsample.samplers.neighbours import check_max_relative_similarity
from composer_dynsample.samplers.pk import PKBatchSampler
from composer_dynsample.validation import check_choice, check_float, check_int

__all__ = ["CorpusCandidates", "MinedNegativesPKBatchSampler", "corpus_candidates"]


class MinedNegativesPKBatchSampler(SegmentPlan, RefreshSchedule, DistributedBatchSampler):
    """P pairs per batch, as :class:`~composer_dynsample.PKBatchSampler` with K = 2, and each anchor's
    nearest passages of other pairs in the embedding table as its negatives.

    A batch holds ``pairs_per_batch`` pairs (anchor and positive, contiguous, exactly the batches of
    ``PKBatchSampler(labels, pairs_per_batch, 2, seed=seed)``), followed by ``negatives_per_anchor``
    negatives for each anchor, in the order of the anchors: ``pairs_per_batch x (2 +
    negatives_per_anchor)`` rows. Every guarantee of ``PKBatchSampler`` holds for the pairs: each pair
    at most once an epoch, disjoint shards, equal lengths on every rank, ``drop_last`` as there.

    Negatives come from the snapshot handed over with :meth:`update_neighbours` (from
    :class:`~composer_dynsample.EmbeddingTable`, from the next :meth:`set_epoch` on): each anchor's
    passages of other pairs ranked by cosine similarity, the ``skip_top`` nearest skipped, the next
    ``window`` passed through the guards of :func:`corpus_candidates` (identical texts, another answer
    of the same query, the margin ``max_relative_similarity`` x sim(anchor, positive) or
    ``absolute_margin`` below it). Each epoch an anchor takes its survivors in an order drawn by
    ``sampling`` (uniformly at random by default, so negatives vary across epochs;
    ``window=negatives_per_anchor`` takes the hardest ones), skipping any whose text is already in the
    batch (a pair's row or an earlier negative). Slots left over, every slot before the first
    snapshot, and the slots of an anchor without an embedding take random passages of other pairs
    under the same rules, never one of the anchor's candidates that the rank window or a guard
    dropped, so the batch size never changes. The batches are a pure function of
    ``(seed, epoch, snapshot)``: every rank computes the same plan and takes its shard.

    Args:
        labels (Sequence[int] | numpy.ndarray | torch.Tensor): The pair of every row: each label exactly
            twice, an anchor and its positive (the pairs data's ``store.labels``).
        pairs_per_batch (int): P, the pairs of a batch, at least 2.
        negatives_per_anchor (int): Mined negatives per anchor, at least 1.
        is_passage (Sequence[bool] | numpy.ndarray | torch.Tensor): Which rows are passages (positives);
            the other row of each pair is its anchor (``~store.is_query[:len(store)]``).
        duplicate_ids (Sequence[int] | numpy.ndarray | torch.Tensor, optional): Every row's text id, equal
            for equal texts (``store.text_hash[:len(store)]``). Default: none (every row its own text).
        skip_top (int): The nearest passages skipped (the rank window). Default: ``0``.
        window (int, optional): The candidates looked at after them, at least ``negatives_per_anchor``.
            Default: ``negatives_per_anchor`` (the hardest ones).
        max_relative_similarity (float, optional): Drop candidates more similar to the anchor than this
            times the anchor's similarity to its positive (sentence-transformers' ``relative_margin`` is
            ``1 - max_relative_similarity``); ``None`` turns the guard off. Default: ``0.95``.
        absolute_margin (float, optional): Drop candidates whose similarity to the anchor plus this exceeds
            the anchor's similarity to its positive (sentence-transformers' ``absolute_margin``; ``0``: never
            one more similar than the positive). Counted with the relative one as ``margin``. Default:
            ``None`` (off).
        sampling (str): How an anchor orders its window's survivors: ``"uniform"`` (at random),
            ``"softmax"`` (without replacement, proportional to ``exp(similarity / sampling_temperature)``, by
            Gumbel-max) or ``"simans"`` (proportional to ``exp(-((similarity - positive's -
            sampling_shift) / sampling_temperature) ** 2)``, SimANS): see
            :class:`~composer_dynsample.samplers._negative_plan.Sampling`. Every draw comes from the
            ``(seed, epoch, segment)`` stream, so ranks agree and a resume draws the same. Default:
            ``"uniform"``.
        sampling_temperature (float): The temperature of ``"softmax"`` and the width of ``"simans"``.
            Default: ``0.05``.
        sampling_shift (float): SimANS' ``b``: the similarity, relative to the positive's, sampled most.
            Default: ``0.0``.
        search (str): ``"exact"`` (torch), ``"ivf"`` (the project's own inverted file in torch: 1,000,000
            pairs at D = 128 in about 21 s on 2 threads, window recall about 0.95; 1.9 to 5.2 times faster
            than faiss's IVF-Flat at equal recall, benchmarks/ivf_faiss.py), ``"auto"`` (exact up to 50,000
            passages, ``"ivf"`` above), ``"faiss"`` (exact, the same lists as ``"exact"``) or
            ``"faiss_ivf"`` (approximate); the faiss ones need the ``faiss`` extra. Default: ``"exact"``.
        hard_fraction (float): The pairs of a batch as :class:`~composer_dynsample.samplers.HardClassPKBatchSampler`
            builds them with K = 2, each pair's centroid the mean of its anchor's and positive's unit rows
            in the snapshot (TAS-B's batches of similar queries, refreshed by the current model): this
            share of a batch's pairs are the nearest pairs of the others. ``0`` keeps
            ``PKBatchSampler``'s batches. Default: ``0.0``.
        max_snapshots (int, optional): Take at most this many snapshots; later ones are ignored (no search
            runs) and the negatives stay those of the last one taken. ``1`` is offline mining: negatives
            mined once, from the table after the first (warm-up) epoch, then fixed, as
            sentence-transformers' ``mine_hard_negatives`` or TAS-B's clustering are used; with the
            table's ``warm_start``, mined by the starting model before the first epoch, as
            ``mine_hard_negatives`` mines with the base model. Default: ``None`` (every epoch's).
        refresh_every (int, optional): Also refresh the negatives every this many batches of a rank within
            an epoch: when the iteration reaches batch ``k * refresh_every`` of the epoch, the sampler searches
            the rows of :attr:`snapshot_source` (which :class:`~composer_dynsample.EmbeddingTable` sets to its
            rows) and the epoch's following batches take their negatives from that snapshot (the pairs stay
            the epoch's). The DataLoader asks for a batch at a step fixed by its configuration (its
            ``num_workers x prefetch_factor`` batches ahead), so every rank searches the same table at the
            same step and a resume with the same configuration searches again what the interrupted run
            searched; the snapshots already taken in an epoch are in :meth:`state_dict`. Default: ``None``
            (at epoch starts only).
        refresh_in_background (bool): Needs ``refresh_every``. Every search but the run's first snapshot
            (searched inline: nothing is in force yet) runs beside training, in a daemon thread, on a copy
            of the rows taken when it starts, and applies one segment later: a search started at the
            epoch's batch ``k * refresh_every`` (``k >= 1``, or ``k = 0`` for the snapshot handed over at the
            epoch start) applies from batch ``(k + 1) * refresh_every``, where the iteration waits for a
            late one (an error in it is raised there, naming the refresh); one whose batch is past the
            epoch's end is not started. Until then batches take the newest snapshot in force (an epoch's
            first segment: the previous epoch's last). The batches stay a pure function of ``(seed,
            epoch, the rows at those points)``; :meth:`state_dict` waits for the searches running and
            keeps them, so a resume neither searches them again nor changes a batch. ``hard_fraction``'s
            pair centroids still change at the epoch start. Default: ``False``.
        num_replicas, rank, seed, drop_last: As for :class:`~composer_dynsample.PKBatchSampler`.

    Example:
        >>> labels = torch.arange(40) // 2  # rows 2k and 2k + 1 are pair k
        >>> is_passage = torch.arange(40) % 2 == 1
        >>> sampler = MinedNegativesPKBatchSampler(labels, 4, 2, is_passage=is_passage)
        >>> sampler.batch_size, len(sampler)
        (16, 5)
        >>> sampler.update_neighbours(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)))
        >>> sampler.set_epoch(1)
        >>> batch = next(iter(sampler))
        >>> bool(is_passage[batch[8:]].all()), len(set(labels[batch].tolist()))
        (True, 12)
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        pairs_per_batch: int,
        negatives_per_anchor: int,
        *,
        is_passage: Sequence[bool] | np.ndarray | torch.Tensor,
        duplicate_ids: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        skip_top: int = 0,
        window: int | None = None,
        max_relative_similarity: float | None = 0.95,
        absolute_margin: float | None = None,
        sampling: str = "uniform",
        sampling_temperature: float = 0.05,
        sampling_shift: float = 0.0,
        search: str = "exact",
        hard_fraction: float = 0.0,
        max_snapshots: int | None = None,
        refresh_every: int | None = None,
        refresh_in_background: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        self.labels = row_array("labels", labels, None)
        self.is_passage = row_array("is_passage", is_passage, self.labels.size, bool)
        self.duplicate_ids = (
            None if duplicate_ids is None else row_array("duplicate_ids", duplicate_ids, self.labels.size)
        )
        self._anchors, self._positives, self._pair_of = pair_layout(self.labels, self.is_passage)
        self.pairs_per_batch = check_int("pairs_per_batch", pairs_per_batch, minimum=2)
        self.negatives_per_anchor = check_int("negatives_per_anchor", negatives_per_anchor, minimum=1)
        self.skip_top = check_int("skip_top", skip_top, minimum=0)
        self.window = check_int(
            "window", negatives_per_anchor if window is None else window, minimum=self.negatives_per_anchor
        )
        self.max_relative_similarity = check_max_relative_similarity(max_relative_similarity)
        self.absolute_margin = (
            None if absolute_margin is None else check_float("absolute_margin", absolute_margin)
        )
        self.sampling = Sampling(
            check_choice("sampling", sampling, SAMPLINGS),
            check_float("sampling_temperature", sampling_temperature, minimum=0, strict_minimum=True),
            check_float("sampling_shift", sampling_shift),
        )
        self.search = check_corpus_search(search)
        #: Where the exact and ``"ivf"`` searches run (``None``: the CPU); ``EmbeddingTable`` sets the model's
        #: CUDA device when the model is on one. The float64 ranking and the guards stay on the CPU.
        self.search_device: torch.device | str | None = None
        self._set_snapshot_schedule(max_snapshots, refresh_every, refresh_in_background)
        group = 2 + self.negatives_per_anchor
        super().__init__(
            self.labels.size,
            self.pairs_per_batch * group,
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            drop_last=drop_last,
        )
        self._texts = dense_ids(self.duplicate_ids, self.labels.size)
        self._check_enough_passages()
        self.hard_fraction = check_float(
            "hard_fraction", hard_fraction, minimum=0, maximum=1, strict_maximum=True
        )
        self._pair_batches = self._pair_sampler(seed)
        self._pending: CorpusCandidates | None = None
        self._snapshot: CorpusCandidates | None = None  # what the current epoch's negatives come from
        # (epoch, segment, refresh it uses or -1) -> the segment's negatives and counts
        self._cached: dict[tuple[int, int, int], tuple[np.ndarray, dict[str, int]]] = {}
        self.last_skipped: dict[str, int] = dict.fromkeys(GUARDS, 0)
        self._check_enough_batches()

    def _pair_sampler(self, seed: int) -> PKBatchSampler:
        """The sampler of the batches' pairs, over every rank (this sampler shards the batches): P x K with
        K = 2, or with ``hard_fraction`` the hard-class one, whose centroids :meth:`update_neighbours` sets."""
        if self.hard_fraction > 0:
            return HardClassPKBatchSampler(
                self.labels,
                self.pairs_per_batch,
                2,
                hard_fraction=self.hard_fraction,
                distance="cosine",
                num_replicas=1,
                rank=0,
                seed=seed,
            )
        return PKBatchSampler(self.labels, self.pairs_per_batch, 2, num_replicas=1, rank=0, seed=seed)

    @classmethod
    def from_store(
        cls, store: Any, pairs_per_batch: int, negatives_per_anchor: int, **options: Any
    ) -> MinedNegativesPKBatchSampler:
        """The sampler of a pairs :class:`~composer_dynsample.data.TextStore`: its labels, its passages
        (rows that are not queries) and its text groups as duplicate ids (every text of the pairs linked to an
        anchor's by shared texts is then never its candidate: :func:`~composer_dynsample.data.text.text_identity.text_groups`);
        ``options`` as for the class."""
        size = len(store)
        return cls(
            store.labels,
            pairs_per_batch,
            negatives_per_anchor,
            is_passage=~np.asarray(store.is_query[:size], dtype=bool),
            duplicate_ids=np.asarray(store.text_group[:size]),
            **options,
        )

    def _check_enough_passages(self) -> None:
        """Refuse data whose passages cannot fill a batch with distinct texts, whatever the draw."""
        passage_texts = self._texts[self._positives]
        anchor_texts = self._texts[self._anchors]
        most_answers = int(np.unique(anchor_texts, return_counts=True)[1].max())  # pairs of one query
        distinct = int(np.unique(passage_texts).size)
        # A slot excludes the batch's texts, the other answers of its query and its dropped candidates.
        needed = self.batch_size + most_answers - 1 + self.skip_top + self.window
        if distinct < needed:
            raise ValueError(
                f"pairs_per_batch={self.pairs_per_batch} x (2 + negatives_per_anchor="
                f"{self.negatives_per_anchor}) with skip_top={self.skip_top} and window={self.window} needs "
                f"at least {needed} passages of distinct texts, and the pairs hold {distinct}; use fewer "
                "pairs per batch, fewer negatives per anchor or a smaller window."
            )

    @property
    def num_global_batches(self) -> int:
        """The number of batches in one epoch over all ranks: ``PKBatchSampler``'s with K = 2."""
        return self._pair_batches.num_global_batches

    # ------------------------------------------------------------------------------------------ snapshot
    def update_neighbours(self, embeddings: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Search every anchor's candidate negatives in ``(N, D)`` embeddings (e.g. the table's rows);
        they apply from the next :meth:`set_epoch`. ``valid`` marks rows that hold an embedding.

        The name is :class:`~composer_dynsample.EmbeddingTable`'s protocol for samplers that take the
        rows themselves; what each guard dropped over all anchors is left in ``last_skipped``. Once
        ``max_snapshots`` were taken, the call does nothing (``last_skipped`` all zero). With
        ``refresh_in_background`` and a snapshot in force, the search runs beside the next epoch's first
        segment and ``last_skipped`` is set when the epoch's batch ``refresh_every`` joins it.
        """
        if (
            not isinstance(embeddings, torch.Tensor)
            or embeddings.ndim != 2
            or embeddings.shape[0] != self.num_indices
        ):
            shape = (
                tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            )
            raise ValueError(
                f"embeddings must be ({self.num_indices}, dim), one row per sample, got {shape}."
            )
        if self._capped():
            self.last_skipped = dict.fromkeys(GUARDS, 0)
            return
        if self.refresh_in_background and self._in_force():
            self._hand_over(embeddings, valid)  # searched beside the next epoch's first segment
        else:
            self._snapshots_taken += 1
            self._pending = self._search(embeddings, valid)
            totals = self._pending.dropped.sum(axis=0).tolist()
            self.last_skipped = {name: int(count) for name, count in zip(GUARDS, totals)}
        if isinstance(self._pair_batches, HardClassPKBatchSampler):  # the next epoch's pairs
            self._pair_batches.update_class_embeddings(
                *pair_centroids(embeddings, valid, self._pair_of, self._anchors.size)
            )

    def search_corpus(self, embeddings: torch.Tensor, valid: torch.Tensor | None = None) -> CorpusCandidates:
        """The candidate lists of ``(N, D)`` embeddings with this sampler's window, guards and search, on its
        ``search_device``: what a snapshot searches, without taking one (``composer-dynsample mine``)."""
        return self._search(embeddings, valid)

    def _search(self, embeddings: torch.Tensor, valid: torch.Tensor | None) -> CorpusCandidates:
        return corpus_candidates(
            embeddings,
            self.labels,
            self.is_passage,
            self.window,
            skip_top=self.skip_top,
            max_relative_similarity=self.max_relative_similarity,
            absolute_margin=self.absolute_margin,
            duplicate_ids=self.duplicate_ids,
            valid=valid,
            search=self.search,
            device=self.search_device,
        )

    def upcoming_rows(self, epoch: int) -> np.ndarray:
        """The anchor and positive rows (sorted, each once) of the batches the next snapshot applies to: the
        epoch's global batches of the segment :meth:`upcoming_segment` names (the whole epoch without
        ``refresh_every``; every pair's at an epoch start with ``hard_fraction``, whose pairs the snapshot
        itself chooses), on every rank alike. :class:`~composer_dynsample.EmbeddingTable`'s
        ``fresh_upcoming`` encodes them with the current model before the snapshot is searched."""
        if self.hard_fraction > 0 and self._reading is None:  # the snapshot chooses the epoch's pairs
            return np.unique(np.concatenate([self._anchors, self._positives]))
        epoch, segment = self.upcoming_segment(epoch)
        pairs = self._pair_batches.global_batches(epoch)
        step = self._segment_batches(pairs.shape[0])
        return np.unique(pairs[segment * step : (segment + 1) * step])

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; a snapshot handed over since the last call applies from this epoch on (with
        ``refresh_in_background``, from the epoch's batch ``refresh_every`` on)."""
        super().set_epoch(epoch)
        self._pair_batches.set_epoch(epoch)
        if self._pending is not None:
            self._activate(self._pending)
            self._log_snapshot(epoch, 0, self._pending)
            self._pending = None
        if self.refresh_in_background:
            self._roll_forward(epoch)

    def _activate(self, snapshot: CorpusCandidates | None) -> None:
        self._snapshot = snapshot
        self._segments, self._cached = {}, {}

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        if self.refresh_every is None:
            yield from super().__iter__()
            return
        per_rank = len(self)
        for start in range(0, per_rank, self.refresh_every):
            if start and self.refresh_in_background:
                self._boundary(start // self.refresh_every, per_rank)
            elif start:
                self._refresh(start // self.refresh_every)
            yield from self._rank_segment(start // self.refresh_every, per_rank).tolist()

    def resume_epoch(self, epoch: int, global_batches_done: int, batches_to_skip: int) -> None:
        """As for :class:`~composer_dynsample.samplers.DistributedBatchSampler`; refused with
        ``refresh_every``, whose refreshes are at batches of a rank: resume on the same number of ranks."""
        if self.refresh_every is not None:
            raise ValueError(
                "MinedNegativesPKBatchSampler(refresh_every=...) refreshes at batches of a rank, so an epoch "
                "cannot resume part-way on another number of ranks; resume on the number of ranks it was "
                "saved on, or from an epoch-end checkpoint."
            )
        super().resume_epoch(epoch, global_batches_done, batches_to_skip)

    def snapshot_fingerprint(self) -> str:
        """A SHA-256 of the candidate lists the current epoch uses and of every refresh taken within an epoch
        so far (``""`` before any snapshot): ranks whose refreshes differed in one epoch differ at the next."""
        if self._snapshot is None:
            return ""
        digest = hashlib.sha256()
        for array in (self._snapshot.ranked, self._snapshot.kept, self._snapshot.searched):
            digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(self._refresh_digest.encode())  # every refresh so far, earlier epochs' included
        if isinstance(self._pair_batches, HardClassPKBatchSampler):
            digest.update(self._pair_batches.snapshot_fingerprint().encode())
        return digest.hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the candidate lists its batches are built from, for an exact resume; the searches
        running beside training (``refresh_in_background``) are waited for and kept."""
        self._join_background()
        return {
            "epoch": self.epoch,
            "snapshot": _as_dict(self._snapshot),
            "pending": _as_dict(self._pending),
            **self._schedule_state(),
            "pair_batches": (
                self._pair_batches.state_dict()
                if isinstance(self._pair_batches, HardClassPKBatchSampler)
                else None
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the resumed epoch yields the interrupted epoch's batches."""
        self.epoch = int(state["epoch"])
        snapshot, pending = state.get("snapshot"), state.get("pending")
        self._activate(None if snapshot is None else CorpusCandidates(**snapshot))
        self._pending = None if pending is None else CorpusCandidates(**pending)
        self._load_schedule_state(state, (snapshot is not None) + (pending is not None))
        if state.get("pair_batches") is not None and isinstance(self._pair_batches, HardClassPKBatchSampler):
            self._pair_batches.load_state_dict(state["pair_batches"])


def _as_dict(found: CorpusCandidates | None) -> dict[str, np.ndarray] | None:
    return None if found is None else found._asdict()
