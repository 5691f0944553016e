"""Two-stream batches: a primary stream iterated once per epoch, a secondary stream cycled alongside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

import numpy as np
import torch

from composer_dynsample.samplers.base import DistributedBatchSampler, ShardKeywords, as_index_array, epoch_rng
from composer_dynsample.validation import check_int, check_keywords

__all__ = ["TwoStreamBatchSampler"]


class TwoStreamBatchSampler(DistributedBatchSampler):
    """Distributed two-stream batch sampler (for example labelled + unlabelled data), sharded by whole batches.

    Each batch is ``primary_batch_size`` indices of the primary stream followed by
    ``secondary_batch_size`` indices of the secondary stream. Per epoch the primary stream is shuffled and
    iterated exactly once (an incomplete last primary batch is left out, a different remainder each
    epoch); the secondary stream is shuffled, and cycled, reshuffled at every cycle, as often as the
    primary stream needs. ``batch_size`` is the sum of the two sizes. The order is a pure function of
    ``(seed, epoch)`` and the rank; rank ``r`` of ``W`` takes batches ``r, r + W, ...``.

    Within an epoch a primary index appears on one rank only, once per occurrence in ``primary_indices``
    (repeated primary indices, an oversampling, trigger a warning); a secondary index repeats only when
    the secondary stream is shorter than what the epoch consumes of it.

    Args:
        primary_indices (Sequence[int] | numpy.ndarray | torch.Tensor): Dataset indices of the primary
            stream, non-negative integers.
        secondary_indices (Sequence[int] | numpy.ndarray | torch.Tensor): Dataset indices of the secondary
            stream. Indices in both streams trigger a warning.
        primary_batch_size (int): Primary indices per batch, at least 1.
        secondary_batch_size (int): Secondary indices per batch, at least 1 and at most the number of
            secondary indices.
        **options: ``num_replicas``, ``rank``, ``seed`` (the seed of every epoch's order, identical on every
            rank) and ``drop_last``, as :class:`DistributedBatchSampler` takes them.

    Example:
        >>> sampler = TwoStreamBatchSampler(range(6), range(6, 9), primary_batch_size=2, secondary_batch_size=1)
        >>> len(sampler), sampler.batch_size
        (3, 3)
        >>> batches = list(sampler)
        >>> sorted(i for b in batches for i in b[:2])
        [0, 1, 2, 3, 4, 5]
        >>> sorted(b[2] for b in batches)
        [6, 7, 8]
    """

    def __init__(
        self,
        primary_indices: Sequence[int] | np.ndarray | torch.Tensor,
        secondary_indices: Sequence[int] | np.ndarray | torch.Tensor,
        primary_batch_size: int,
        secondary_batch_size: int,
        **options: Unpack[ShardKeywords],
    ) -> None:
        check_keywords(type(self).__name__, options, ShardKeywords)
        primary = as_index_array("primary_indices", _materialise(primary_indices))
        secondary = as_index_array("secondary_indices", _materialise(secondary_indices))
        for name, values in (("primary_indices", primary), ("secondary_indices", secondary)):
            if values.size == 0:
                raise ValueError(f"{name} must not be empty.")
            if values.min() < 0:
                raise ValueError(f"{name} must be non-negative dataset indices, got {int(values.min())}.")
        self.primary_batch_size = check_int("primary_batch_size", primary_batch_size, minimum=1)
        self.secondary_batch_size = check_int("secondary_batch_size", secondary_batch_size, minimum=1)
        for name, size, stream in (
            ("primary_batch_size", self.primary_batch_size, primary),
            ("secondary_batch_size", self.secondary_batch_size, secondary),
        ):
            if size > stream.size:
                kind = name.split("_")[0]
                raise ValueError(
                    f"{name} must be in [1, {stream.size}] (the number of {kind} indices), got {size}."
                )
        super().__init__(
            int(max(primary.max(), secondary.max())) + 1,
            self.primary_batch_size + self.secondary_batch_size,
            **options,
        )
        values, counts = np.unique(primary, return_counts=True)
        if (counts > 1).any():
            repeated = values[counts > 1]
            self._warn_overlap(
                f"{repeated.size} primary indices occur more than once in primary_indices (for example "
                f"{repeated[:5].tolist()}); each occurrence is trained once per epoch, so they repeat within "
                "an epoch. Pass numpy.unique(primary_indices) unless the oversampling is meant."
            )
        overlap = np.intersect1d(primary, secondary)
        if overlap.size:
            self._warn_overlap(
                f"{overlap.size} indices are in both primary_indices and secondary_indices "
                f"(for example {overlap[:5].tolist()}); they can appear twice in one epoch."
            )
        self.primary_indices = primary
        self.secondary_indices = secondary
        self._check_enough_batches()

    @property
    def num_global_batches(self) -> int:
        """The number of batches in one epoch over all ranks: one pass over the primary stream."""
        return self.primary_indices.size // self.primary_batch_size

    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks, shape ``(num_global_batches, batch_size)``."""
        n = self.num_global_batches
        primary = epoch_rng(self.seed, epoch, stream=0).permutation(self.primary_indices)
        primary = primary[: n * self.primary_batch_size].reshape(n, self.primary_batch_size)

        needed = n * self.secondary_batch_size
        size = self.secondary_indices.size
        cycles = -(-needed // size)
        # One independent shuffle per cycle, all drawn at once: argsort of random keys row by row.
        keys = epoch_rng(self.seed, epoch, stream=1).random((cycles, size))
        secondary = self.secondary_indices[np.argsort(keys, axis=1)].reshape(-1)[:needed]
        return np.concatenate([primary, secondary.reshape(n, self.secondary_batch_size)], axis=1)


def _materialise(values: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Turn ``range`` and other sequences into arrays; tensors and arrays pass through."""
    if isinstance(values, (np.ndarray, torch.Tensor)):
        return values
    return np.fromiter(values, dtype=np.int64) if isinstance(values, range) else np.asarray(list(values))
