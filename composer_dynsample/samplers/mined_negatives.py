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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._corpus_search import (
    GUARDS,
    CorpusCandidates,
    corpus_candidates,
    dense_ids,
    pair_layout,
)
from composer_dynsample.samplers._negative_plan import NegativePlanner, row_array
from composer_dynsample.samplers.base import DistributedBatchSampler, epoch_rng
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
from composer_dynsample.samplers.neighbours import check_max_relative_similarity, check_search
from composer_dynsample.samplers.pk import PKBatchSampler
from composer_dynsample.validation import check_float, check_int

__all__ = ["CorpusCandidates", "MinedNegativesPKBatchSampler", "corpus_candidates"]

#: What :meth:`MinedNegativesPKBatchSampler.guard_counts` reports: the search's guards, then the plan's.
PLAN_COUNTS = (*GUARDS, "in_batch", "random", "no_embedding")
_SEGMENT_STREAM = 1 << 20  # the random stream of a refresh segment: 4 is the epoch's first


class MinedNegativesPKBatchSampler(DistributedBatchSampler):
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
    of the same query, the margin ``max_relative_similarity`` x sim(anchor, positive)). Each epoch an
    anchor takes its survivors in a random order (so negatives vary across epochs;
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
            times the anchor's similarity to its positive; ``None`` turns the guard off. Default: ``0.95``.
        search (str): ``"exact"`` (torch), ``"faiss"`` (exact, the same lists) or ``"faiss_ivf"``
            (approximate, for large corpora); the faiss ones need the ``faiss`` extra. Default: ``"exact"``.
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
        search: str = "exact",
        hard_fraction: float = 0.0,
        max_snapshots: int | None = None,
        refresh_every: int | None = None,
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
        self.search = check_search(search)
        self._set_snapshot_schedule(max_snapshots, refresh_every)
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

    def _set_snapshot_schedule(self, max_snapshots: int | None, refresh_every: int | None) -> None:
        """Check and set when snapshots are taken (``max_snapshots``, ``refresh_every``), none taken yet."""
        self.max_snapshots = check_int("max_snapshots", max_snapshots, minimum=1, allow_none=True)
        self._snapshots_taken = 0  # snapshots handed over and searched, pending ones included
        self.refresh_every = check_int("refresh_every", refresh_every, minimum=1, allow_none=True)
        #: ``() -> (rows, valid)`` for a refresh within an epoch; set by ``EmbeddingTable``.
        self.snapshot_source: Callable[[], tuple[torch.Tensor, torch.Tensor | None] | None] | None = None
        # The refreshes of the newest epoch that had any: {epoch: {segment: snapshot}}.
        self._segments: dict[int, dict[int, CorpusCandidates]] = {}
        self._refresh_digest = ""  # a hash chain over every refresh taken: in the snapshot fingerprint

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
        (rows that are not queries) and its text hashes as duplicate ids; ``options`` as for the class."""
        size = len(store)
        return cls(
            store.labels,
            pairs_per_batch,
            negatives_per_anchor,
            is_passage=~np.asarray(store.is_query[:size], dtype=bool),
            duplicate_ids=np.asarray(store.text_hash[:size]),
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
        ``max_snapshots`` were taken, the call does nothing (``last_skipped`` all zero).
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
        self._snapshots_taken += 1
        self._pending = self._search(embeddings, valid)
        if isinstance(self._pair_batches, HardClassPKBatchSampler):
            self._pair_batches.update_class_embeddings(*self._pair_centroids(embeddings, valid))
        totals = self._pending.dropped.sum(axis=0).tolist()
        self.last_skipped = {name: int(count) for name, count in zip(GUARDS, totals)}

    def _capped(self) -> bool:
        """Whether ``max_snapshots`` were taken: no further search, at an epoch start or within one."""
        return self.max_snapshots is not None and self._snapshots_taken >= self.max_snapshots

    def _search(self, embeddings: torch.Tensor, valid: torch.Tensor | None) -> CorpusCandidates:
        return corpus_candidates(
            embeddings,
            self.labels,
            self.is_passage,
            self.window,
            skip_top=self.skip_top,
            max_relative_similarity=self.max_relative_similarity,
            duplicate_ids=self.duplicate_ids,
            valid=valid,
            search=self.search,
        )

    def _pair_centroids(
        self, embeddings: torch.Tensor, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's centroid (in sorted label order): the mean of its valid, finite unit rows, and how
        many rows it is over (0: no centroid)."""
        unit = torch.nn.functional.normalize(embeddings.detach().cpu().float(), dim=1)
        usable = torch.isfinite(unit).all(dim=1)
        if valid is not None:
            usable &= torch.as_tensor(valid).cpu().bool()
        pair_of = torch.from_numpy(self._pair_of)[usable]
        sums = torch.zeros(self._anchors.size, unit.shape[1])
        sums.index_add_(0, pair_of, unit[usable])
        counts = torch.bincount(pair_of, minlength=self._anchors.size)
        return sums / counts.clamp(min=1).unsqueeze(1), counts

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; a snapshot handed over since the last call applies from this epoch on."""
        super().set_epoch(epoch)
        self._pair_batches.set_epoch(epoch)
        if self._pending is not None:
            self._activate(self._pending)
            self._pending = None

    def _activate(self, snapshot: CorpusCandidates | None) -> None:
        self._snapshot = snapshot
        self._segments, self._cached = {}, {}

    @property
    def refreshes(self) -> int:
        """Refreshes within the current epoch so far (``refresh_every``)."""
        return len(self._segments.get(self.epoch, {}))

    def _refresh(self, segment: int) -> None:
        """Search the source's rows for the epoch's ``segment`` (once: a resumed epoch keeps its own)."""
        if self.snapshot_source is None or self.epoch < max(self._segments, default=-1):
            return  # an earlier epoch iterated again (Composer spins them on resume): no search
        if segment in self._segments.get(self.epoch, {}):
            return
        if self._capped():
            return
        found = self.snapshot_source()
        if found is None:
            return
        self._snapshots_taken += 1
        searched = self._search(*found)
        self._segments = {self.epoch: {**self._segments.get(self.epoch, {}), segment: searched}}
        digest = hashlib.sha256(f"{self._refresh_digest}:{self.epoch}:{segment}".encode())
        for array in (searched.ranked, searched.kept, searched.searched):
            digest.update(np.ascontiguousarray(array).tobytes())
        self._refresh_digest = digest.hexdigest()

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        if self.refresh_every is None:
            yield from super().__iter__()
            return
        per_rank = len(self)
        for start in range(0, per_rank, self.refresh_every):
            if start:
                self._refresh(start // self.refresh_every)
            yield from self.rank_batches()[start : start + self.refresh_every].tolist()

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
        """The epoch and the candidate lists its batches are built from, for an exact resume."""
        return {
            "epoch": self.epoch,
            "snapshot": _as_dict(self._snapshot),
            "pending": _as_dict(self._pending),
            "snapshots_taken": self._snapshots_taken,
            "refresh_digest": self._refresh_digest,
            "segments": {
                epoch: {segment: found._asdict() for segment, found in found_by_segment.items()}
                for epoch, found_by_segment in self._segments.items()
            },
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
        self._snapshots_taken = int(
            state.get("snapshots_taken", (snapshot is not None) + (pending is not None))
        )
        self._refresh_digest = str(state.get("refresh_digest", ""))
        self._segments = {
            int(epoch): {int(segment): CorpusCandidates(**found) for segment, found in by_segment.items()}
            for epoch, by_segment in (state.get("segments") or {}).items()
        }
        if state.get("pair_batches") is not None and isinstance(self._pair_batches, HardClassPKBatchSampler):
            self._pair_batches.load_state_dict(state["pair_batches"])

    # ----------------------------------------------------------------------------------------- batches
    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks: ``(num_global_batches, P * (2 + negatives_per_anchor))``."""
        return self._plan(epoch)[0]

    def guard_counts(self, epoch: int | None = None) -> dict[str, int]:
        """What the guards dropped in an epoch's plan (default: the current epoch), for logging.

        Over the epoch's anchors: the search's guards of :data:`GUARDS` (``rank_window``: candidates
        skipped at the top; ``duplicate``; ``same_query``; ``margin``), then the plan's: ``in_batch``
        (survivors skipped because their text was in the batch already), ``random`` (negatives drawn at
        random) and ``no_embedding`` (anchors without candidates: before the first snapshot, every one).
        """
        return dict(self._plan(self.epoch if epoch is None else epoch)[1])

    def _plan(self, epoch: int) -> tuple[np.ndarray, dict[str, int]]:
        pairs = self._pair_batches.global_batches(epoch)  # (n, 2P): the pair sampler's, untouched
        n = pairs.shape[0]
        step = n if self.refresh_every is None else self.refresh_every * self.num_replicas
        parts, counts = [], dict.fromkeys(PLAN_COUNTS, 0)
        refreshed = self._segments.get(int(epoch), {})
        if any(key[0] != epoch for key in self._cached):
            self._cached = {}  # one epoch's segments at a time
        for segment, start in enumerate(range(0, n, step)):
            source = max((s for s in refreshed if s <= segment), default=-1)  # -1: the epoch's snapshot
            key = (int(epoch), segment, source)
            if key not in self._cached:
                snapshot = self._snapshot if source < 0 else refreshed[source]
                stream = 4 if segment == 0 else _SEGMENT_STREAM + segment
                self._cached[key] = self._build(
                    pairs[start : start + step], snapshot, epoch_rng(self.seed, epoch, stream)
                )
            negatives, part_counts = self._cached[key]
            parts.append(negatives)
            for name, value in part_counts.items():
                counts[name] += value
        batches = np.concatenate([pairs, np.concatenate(parts)], axis=1)
        batches.flags.writeable = False
        return batches, counts

    def _build(
        self, pairs: np.ndarray, snapshot: CorpusCandidates | None, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, int]]:
        """The negatives of ``pairs``' batches from ``snapshot``, and what the guards and the plan did."""
        n, p = pairs.shape[0], self.pairs_per_batch
        chunks = pairs.reshape(n, p, 2)
        first_is_anchor = ~self.is_passage[chunks[:, :, 0]]
        anchor_rows = np.where(first_is_anchor, chunks[:, :, 0], chunks[:, :, 1]).reshape(-1)
        own = self._pair_of[anchor_rows]
        counts = dict.fromkeys(PLAN_COUNTS, 0)
        ordered, forbidden = self._ordered_candidates(own, rng, counts, snapshot)
        planner = NegativePlanner(
            self._texts, self._positives, self._texts[self._anchors], self.negatives_per_anchor, rng
        )
        negatives = np.empty((n, p * self.negatives_per_anchor), dtype=np.int64)
        anchor_texts = self._texts[anchor_rows].reshape(n, p)
        for b in range(n):
            batch_texts = self._texts[pairs[b]].tolist()
            excluded = None if forbidden is None else forbidden[b]
            negatives[b] = planner.batch(batch_texts, anchor_texts[b].tolist(), ordered[b], excluded)
        counts["in_batch"], counts["random"] = planner.in_batch, planner.random
        negatives.flags.writeable = False  # cached: shared by every caller of this epoch's plan
        return negatives, counts

    def _ordered_candidates(
        self,
        own: np.ndarray,
        rng: np.random.Generator,
        counts: dict[str, int],
        snapshot: CorpusCandidates | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The epoch's anchors' kept candidates, each row in a random order with ``-1`` last, and the
        candidates they must not take (examined and not kept; ``None`` before a snapshot), both ``(n, P,
        skip_top + window)``; the snapshot's guard counts over these anchors are added to ``counts``."""
        width = self.skip_top + self.window
        shape = (own.size // self.pairs_per_batch, self.pairs_per_batch, width)
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


def _as_dict(found: CorpusCandidates | None) -> dict[str, np.ndarray] | None:
    return None if found is None else found._asdict()
