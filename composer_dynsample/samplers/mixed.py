"""Batches from several data sets: every batch from one source, the sources taken by a seeded schedule.

A run on several data sets (``data: {name: mix, sources: {...}}``) concatenates the sources' rows, source
after source, and samples each source with a batch sampler of its own. :class:`MixedBatchSampler` lays those
samplers' batches out over the epoch: each batch is one source's batch (its indices shifted to the source's
rows), so in-batch negatives never cross sources, and which source comes next is a pure function of
``(seed, epoch)``, the same on every rank and whatever the number of ranks, like every sampler of this
package (see :class:`~composer_dynsample.samplers.base.DistributedBatchSampler`): a mid-epoch resume, also on
another number of ranks, continues the same sequence. A source's sampler may build its batches from the
embedding table (mined negatives, nearest rows, hard classes): the one table over the mix's rows hands each
such sampler the rows of its own source only, so its negatives and classes never leave the source.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.distributed import stable_hash
from composer_dynsample.samplers.base import (
    DistributedBatchSampler,
    as_index_array,
    class_positions,
    epoch_rng,
)
from composer_dynsample.samplers.hard_class import class_means
from composer_dynsample.validation import check_choice, check_int

__all__ = ["MIX_SAMPLING", "MixedBatchSampler", "check_mixable"]

#: The schedules of sources: sentence-transformers' ``MultiDatasetBatchSamplers`` of the same names.
MIX_SAMPLING = ("proportional", "round_robin")
_PAD = -1  # fills the batches of a source whose batches are smaller than the largest source's


class MixedBatchSampler(DistributedBatchSampler):
    """Distributed batch sampler over several sources, each batch from one source.

    ``sampling="proportional"`` (sentence-transformers' ``ProportionalBatchSampler``): without ``weights``
    an epoch holds every batch of every source's epoch once, the sources in a random order, so a source is
    drawn in proportion to its number of batches. With ``weights``, source ``i`` gives
    ``round(N * w_i / sum(w))`` batches of the ``N`` the sources hold together (at least one), cycling
    through further epochs of its own sampler where that is more than one epoch of it, or taking the
    first ones where it is fewer. ``sampling="round_robin"`` (``RoundRobinBatchSampler``): one batch of each
    source in turn, in the order of ``samplers``, until the source with the fewest batches has given all
    of its own; the other sources' remaining batches sit the epoch out.

    Source ``s``'s batches in epoch ``e`` are those of ``samplers[s].global_batches`` (of its epochs
    ``e * R_s ... e * R_s + R_s - 1`` when it gives ``R_s`` epochs' worth), plus ``offsets[s]``. With
    ``batches_per_draw=G`` the schedule draws a source for runs of ``G`` consecutive batches: on ``W``
    ranks with ``G`` a multiple of ``W`` the ranks' batches of one step all come from one source, as a
    cross-rank pool of embeddings needs.

    A source sampler that takes a snapshot of the :class:`~composer_dynsample.EmbeddingTable`
    (:class:`~composer_dynsample.samplers.MinedNegativesPKBatchSampler`,
    :class:`~composer_dynsample.samplers.NeighbourBatchSampler`,
    :class:`~composer_dynsample.samplers.HardClassPKBatchSampler`) gets it through the mix: the table feeds
    the mix (:meth:`update_neighbours`), which hands each such source its own rows, and :meth:`set_epoch`
    passes the epoch on, so each builds the batches it builds fed by a table of its source alone. Its
    snapshot is in :meth:`state_dict` and :meth:`snapshot_fingerprint`, by source.

    Args:
        samplers (Mapping[str, DistributedBatchSampler]): Each source's batch sampler over its own rows
            (indices ``0 .. n_s - 1``), by source name, in the order of the sources' rows.
        sizes (Sequence[int]): Each source's number of rows ``n_s``: source ``s`` has the dataset indices
            ``offsets[s] .. offsets[s] + n_s - 1`` with ``offsets`` the running sum of ``sizes``.
        sampling (str): ``"proportional"`` or ``"round_robin"``. Default: ``"proportional"``.
        weights (Sequence[float], optional): With ``"proportional"``, each source's share of the epoch's
            batches, positive numbers. Default: ``None`` (each source's own number of batches).
        batches_per_draw (int): ``G``, the consecutive batches of a source the schedule draws at once.
            Default: ``1``.
        labels (Mapping[str, Sequence[int]], optional): The labels each hard-class source's sampler was built
            from, by source name: the classes its centroids are taken over. Default: ``None``.
        num_replicas (int, optional): The number of ranks. Default: the process group's world size, else
            the launcher's ``WORLD_SIZE``, else ``1`` (see :class:`DistributedBatchSampler`).
        rank (int, optional): This process's rank. Default: the process group's rank, else ``RANK``, else ``0``.
        seed (int): The seed of the schedule; identical on every rank. Default: ``0``.
        drop_last (bool): Even out the batch count across ranks by dropping the last batches (``True``) or
            by repeating batches from the start of the epoch (``False``). Default: ``True``.

    Raises:
        ValueError: If ``samplers`` is empty or not samplers of this package, ``sizes`` does not hold one
            size per sampler, a sampler draws an index outside its source's rows, a source's sampler
            refreshes within an epoch (``refresh_every``, see :func:`check_mixable`), a hard-class source has
            no ``labels``, or an option is out of range.

    Example:
        >>> from composer_dynsample import PKBatchSampler
        >>> first = PKBatchSampler([0, 0, 1, 1] * 2, classes_per_batch=2, samples_per_class=2)
        >>> second = PKBatchSampler([0, 0, 1, 1], classes_per_batch=2, samples_per_class=2)
        >>> mixed = MixedBatchSampler({"a": first, "b": second}, sizes=[8, 4], sampling="round_robin")
        >>> mixed.source_names, mixed.sources_of(0).tolist()
        (('a', 'b'), [0, 1])
        >>> [sorted(batch) for batch in mixed][1]
        [8, 9, 10, 11]
    """

    def __init__(
        self,
        samplers: Mapping[str, DistributedBatchSampler],
        sizes: Sequence[int],
        *,
        sampling: str = "proportional",
        weights: Sequence[float] | None = None,
        batches_per_draw: int = 1,
        labels: Mapping[str, Sequence[int] | np.ndarray | torch.Tensor] | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if not isinstance(samplers, Mapping) or not samplers:
            raise ValueError("samplers must be a non-empty mapping of source names to batch samplers.")
        for name, sampler in samplers.items():
            if not isinstance(sampler, DistributedBatchSampler):
                raise ValueError(
                    f"source {name!r}: its sampler must be a batch sampler of composer_dynsample.samplers, "
                    f"got {type(sampler).__name__}."
                )
            try:
                check_mixable(sampler)
            except ValueError as error:
                raise ValueError(f"source {name!r}: {error}") from None
        self.source_names = tuple(str(name) for name in samplers)
        self._samplers = tuple(samplers.values())
        if len(sizes) != len(self._samplers):
            raise ValueError(
                f"sizes must hold one size per source ({len(self._samplers)}), got {len(sizes)}."
            )
        self._sizes = np.asarray([check_int(f"sizes[{i}]", n, minimum=1) for i, n in enumerate(sizes)])
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
        for name, sampler, size in zip(self.source_names, self._samplers, self._sizes, strict=True):
            if sampler.num_indices > size:
                raise ValueError(
                    f"source {name!r}: its sampler draws from {sampler.num_indices} rows, but the source has {size}."
                )
        self._dense_labels = _dense_labels(self.source_names, self._samplers, labels or {})
        self.sampling = check_choice("sampling", sampling, MIX_SAMPLING)
        self.batches_per_draw = check_int("batches_per_draw", batches_per_draw, minimum=1)
        self._counts = _batch_counts(
            self._samplers, self.sampling, weights, self.source_names, self.batches_per_draw
        )
        self.weights = None if weights is None else ",".join(f"{float(w):g}" for w in weights)
        self._rounds = np.asarray(
            [-(-int(c) // s.num_global_batches) for c, s in zip(self._counts, self._samplers, strict=True)]
        )
        batch_size = max(sampler.batch_size for sampler in self._samplers)
        super().__init__(
            int(self._sizes.sum()),
            batch_size,
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            drop_last=drop_last,
        )
        self._check_enough_batches()

    @property
    def num_global_batches(self) -> int:
        """The number of batches in one epoch over all ranks: the sum of what each source gives."""
        return int(self._counts.sum())

    @property
    def batch_counts(self) -> dict[str, int]:
        """The number of batches each source gives an epoch, by source name."""
        return {name: int(count) for name, count in zip(self.source_names, self._counts, strict=True)}

    @property
    def samplers(self) -> dict[str, DistributedBatchSampler]:
        """Each source's own batch sampler, by source name."""
        return dict(zip(self.source_names, self._samplers, strict=True))

    @property
    def offsets(self) -> np.ndarray:
        """Each source's first dataset index."""
        return self._offsets.copy()

    def sources_of(self, epoch: int) -> np.ndarray:
        """The source (its position in :attr:`source_names`) of each of the epoch's global batches."""
        if self.sampling == "round_robin":
            turns = np.tile(np.arange(len(self._samplers)), int(self._counts[0]) // self.batches_per_draw)
            return np.repeat(turns, self.batches_per_draw)
        draws = self._counts // self.batches_per_draw
        rest = self._counts - draws * self.batches_per_draw
        units = np.repeat(np.arange(len(self._samplers)), draws)
        order = units[epoch_rng(self.seed, epoch, stream=1).permutation(units.size)]
        runs = np.repeat(order, self.batches_per_draw)
        # What does not fill a whole draw closes the epoch, source by source.
        return np.concatenate([runs, np.repeat(np.arange(len(self._samplers)), rest)]).astype(np.int64)

    def source_batches(self, source: int, epoch: int) -> np.ndarray:
        """Source ``source``'s batches of the epoch, as indices of the mix (its offset added)."""
        sampler, count, rounds = self._samplers[source], int(self._counts[source]), int(self._rounds[source])
        parts = [sampler.global_batches(epoch * rounds + turn) for turn in range(rounds)]
        return np.concatenate(parts)[:count] + self._offsets[source]

    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks, each from one source, padded with ``-1`` to ``batch_size``."""
        order = self.sources_of(epoch)
        out = np.full((order.size, self.batch_size), _PAD, dtype=np.int64)
        for source in range(len(self._samplers)):
            batches = self.source_batches(source, epoch)
            out[order == source, : batches.shape[1]] = batches
        return out

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        for batch in super().__iter__():
            yield [index for index in batch if index != _PAD]

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, and each source sampler's first epoch of it (a snapshot handed over since applies)."""
        super().set_epoch(epoch)
        for sampler, rounds in zip(self._samplers, self._rounds, strict=True):
            sampler.set_epoch(self.epoch * int(rounds))

    # -------------------------------------------------------------------- the embedding table's snapshot
    def _fed(self) -> list[tuple[int, Any]]:
        """The sources whose sampler takes a snapshot of the embedding table, with their positions."""
        return [(s, sampler) for s, sampler in enumerate(self._samplers) if takes_snapshot(sampler)]

    def update_neighbours(self, embeddings: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Hand each source whose sampler takes a snapshot its own rows of ``(N, D)`` embeddings (the
        table's, one row per index of the mix; ``valid`` marks rows that hold one): rows ``offsets[s] ..
        offsets[s] + n_s - 1`` to a sampler of nearest rows (``update_neighbours``), or the class centroids
        of those rows by the source's labels to a hard-class one (``update_class_embeddings``), as the
        :class:`~composer_dynsample.EmbeddingTable` of that source alone hands them; they apply from the
        next :meth:`set_epoch`. The other sources take nothing."""
        shape = tuple(getattr(embeddings, "shape", ()))
        if not isinstance(embeddings, torch.Tensor) or len(shape) != 2 or shape[0] != self.num_indices:
            raise ValueError(
                f"embeddings must be ({self.num_indices}, dim), one row per index of the mix, got {shape}."
            )
        for source, sampler in self._fed():
            start, stop = int(self._offsets[source]), int(self._offsets[source] + self._sizes[source])
            rows, held = embeddings[start:stop], None if valid is None else valid[start:stop]
            if callable(getattr(sampler, "update_neighbours", None)):
                sampler.update_neighbours(rows, held)
            else:
                classes = int(sampler.classes.size)
                sampler.update_class_embeddings(*class_means(rows, self._dense_labels[source], classes, held))

    @property
    def last_skipped(self) -> dict[str, int]:
        """What the false-negative guards of the sources' last searches dropped, summed over the sources."""
        totals: dict[str, int] = {}
        for _, sampler in self._fed():
            for name, count in getattr(sampler, "last_skipped", {}).items():
                totals[name] = totals.get(name, 0) + int(count)
        return totals

    @property
    def search_device(self) -> torch.device | str | None:
        """Where the sources' corpus searches run (``None`` while one of them has none)."""
        devices = [s.search_device for _, s in self._fed() if hasattr(s, "search_device")]
        return None if not devices or any(device is None for device in devices) else devices[0]

    @search_device.setter
    def search_device(self, device: torch.device | str | None) -> None:
        for _, sampler in self._fed():
            if hasattr(sampler, "search_device"):
                sampler.search_device = device

    def wants_snapshot(self) -> bool:
        """Whether a source's sampler would take the next snapshot handed over."""
        return any(_wants(sampler) for _, sampler in self._fed())

    def upcoming_rows(self, epoch: int) -> np.ndarray:
        """The rows (indices of the mix, sorted) the next snapshot applies to: each source's ``upcoming_rows``
        of its epochs within ``epoch``, for the sources that take it (``EmbeddingTable``'s ``fresh_upcoming``)."""
        parts = [np.zeros(0, dtype=np.int64)]
        for source, sampler in self._fed():
            if callable(getattr(sampler, "upcoming_rows", None)) and _wants(sampler):
                rounds = int(self._rounds[source])
                own = [sampler.upcoming_rows(epoch * rounds + turn) for turn in range(rounds)]
                parts.extend(rows + self._offsets[source] for rows in own)
        return np.unique(np.concatenate(parts))

    def snapshot_fingerprint(self) -> str:
        """A SHA-256 of each source's snapshot fingerprint, by source name (``""`` before any source took one)."""
        parts = [(self.source_names[s], sampler.snapshot_fingerprint()) for s, sampler in self._fed()]
        if not any(fingerprint for _, fingerprint in parts):
            return ""
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The epoch and each table-fed source sampler's state (its snapshot), by name, for an exact resume."""
        states = {self.source_names[s]: sampler.state_dict() for s, sampler in self._fed()}
        return {"epoch": self.epoch, "sources": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the resumed epoch's sources build the interrupted epoch's batches."""
        self.epoch = int(state["epoch"])
        saved = state.get("sources") or {}
        for source, sampler in self._fed():
            if self.source_names[source] in saved:
                sampler.load_state_dict(saved[self.source_names[source]])

    def _hash_labels(self) -> int:
        """The sources' names and sizes, the hash of each source sampler's labels and its options but the
        number of ranks (a resume on another number of ranks draws the same batches)."""
        parts = [
            (name, int(size), sampler.labels_hash(), _options_but_ranks(sampler))
            for name, size, sampler in zip(self.source_names, self._sizes, self._samplers, strict=True)
        ]
        return stable_hash(repr(parts))


_WORLD_KEYS = ("num_replicas", "num_samples", "total_size")  # DistributedSampler's, by the number of ranks


def _options_but_ranks(sampler: DistributedBatchSampler) -> str:
    return repr(sorted((k, v) for k, v in sampler.options().items() if k not in _WORLD_KEYS))


def _batch_counts(
    samplers: Sequence[DistributedBatchSampler],
    sampling: str,
    weights: Sequence[float] | None,
    names: Sequence[str],
    per_draw: int,
) -> np.ndarray:
    """How many batches each source gives an epoch."""
    own = np.asarray([sampler.num_global_batches for sampler in samplers], dtype=np.int64)
    if sampling == "round_robin":
        if weights is not None:
            raise ValueError(
                "weights are for sampling='proportional'; round_robin takes one batch of each source in turn."
            )
        turns = int(own.min()) // per_draw
        if turns < 1:
            smallest = names[int(own.argmin())]
            raise ValueError(
                f"source {smallest!r} has {int(own.min())} batches an epoch, fewer than batches_per_draw="
                f"{per_draw}: round_robin would take none; use a smaller batches_per_draw or smaller batches."
            )
        return np.full(own.size, turns * per_draw, dtype=np.int64)
    if weights is None:
        return own
    if len(weights) != own.size:
        raise ValueError(f"weights must hold one weight per source ({own.size}), got {len(weights)}.")
    values = []
    for name, weight in zip(names, weights, strict=True):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            raise ValueError(f"source {name!r}: weight must be a positive number, got {weight!r}.")
        values.append(float(weight))
    shares = np.asarray(values) / sum(values)
    return np.maximum(np.rint(shares * own.sum()).astype(np.int64), 1)


def takes_snapshot(sampler: Any) -> bool:
    """Whether a batch sampler builds its batches from a snapshot of the embedding table."""
    return callable(getattr(sampler, "snapshot_fingerprint", None))


def check_mixable(sampler: Any) -> None:
    """Raise a ``ValueError`` saying why ``sampler`` cannot sample one source of a mix, if it cannot."""
    if takes_snapshot(sampler) and getattr(sampler, "refresh_every", None) is not None:
        raise ValueError(
            f"{type(sampler).__name__}(refresh_every=...) refreshes its negatives at batches of its own iteration, "
            "which a mix never runs (it lays out the source's epochs whole); leave refresh_every out (the table "
            "still hands it a snapshot at every epoch start)."
        )


def _wants(sampler: Any) -> bool:
    wants = getattr(sampler, "wants_snapshot", None)
    return bool(wants()) if callable(wants) else True


def _dense_labels(
    names: Sequence[str], samplers: Sequence[Any], labels: Mapping[str, Any]
) -> dict[int, torch.Tensor]:
    """Each class-centroid source's labels as positions in its sampler's ``classes`` (what the table's
    centroids are indexed by), checked."""
    dense = {}
    for source, (name, sampler) in enumerate(zip(names, samplers, strict=True)):
        if not takes_snapshot(sampler) or callable(getattr(sampler, "update_neighbours", None)):
            continue
        if name not in labels:
            raise ValueError(
                f"source {name!r}: {type(sampler).__name__} takes the class centroids of its source's rows; "
                f"pass labels={{{name!r}: the labels it was built from}}."
            )
        values = as_index_array(f"labels[{name!r}]", labels[name])
        positions, unknown = class_positions(sampler.classes, values)
        if values.size != sampler.num_indices or unknown.size:
            raise ValueError(
                f"source {name!r}: labels[{name!r}] are not the labels its sampler was built from."
            )
        dense[source] = torch.from_numpy(positions)
    return dense
