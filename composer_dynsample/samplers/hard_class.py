"""Hard-class P x K batches: each batch holds classes the current model confuses, chosen by class centroid.

Class-level hard mining (Smirnov et al. 2018, "Doppelganger mining"; Suh et al. 2019, "Stochastic
class-based hard example mining") builds batches whose classes lie close together in embedding
space, so the in-batch miner finds hard negatives at all. :class:`HardClassPKBatchSampler` does it with
class centroids handed to it between epochs (from :class:`~composer_dynsample.EmbeddingTable`, which
the forward pass feeds), keeping every guarantee of :class:`~composer_dynsample.PKBatchSampler`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers.base import epoch_rng
from composer_dynsample.samplers.pk import PKBatchSampler
from composer_dynsample.validation import check_choice, check_float, check_int

__all__ = ["HardClassPKBatchSampler", "nearest_classes"]


def nearest_classes(
    centroids: torch.Tensor,
    valid: torch.Tensor | None = None,
    distance: str = "euclidean",
    *,
    limit: int | None = None,
    chunk_size: int = 2048,
) -> np.ndarray:
    """Every class's nearest other classes by centroid, nearest first: a ``(C, M)`` int64 array.

    ``M`` is ``C - 1`` (every other class) or ``limit``. Rows are computed a chunk of classes at a time,
    so memory is ``chunk_size x C`` rather than ``C x C``. Classes without a centroid (``valid`` false)
    come last, in class order; ties keep class order, so the result is a pure function of the centroids.

    Args:
        centroids (torch.Tensor): ``(C, D)`` class centroids.
        valid (torch.Tensor, optional): ``(C,)`` bool, which centroids exist. Default: all.
        distance (str): ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.
        limit (int, optional): Keep this many nearest classes per class. Default: all ``C - 1``.
        chunk_size (int): Classes per distance block. Default: ``2048``.

    Example:
        >>> nearest_classes(torch.tensor([[0.0], [10.0], [1.0]])).tolist()
        [[2, 1], [2, 0], [0, 1]]
        >>> nearest_classes(torch.tensor([[0.0], [10.0], [1.0]]), limit=1).tolist()
        [[2], [2], [0]]
    """
    check_choice("distance", distance, ("euclidean", "cosine"))
    points = centroids.detach().to(torch.float64).cpu()
    if distance == "cosine":
        points = torch.nn.functional.normalize(points, dim=1)
    count = points.shape[0]
    keep = count - 1 if limit is None else min(check_int("limit", limit, minimum=1), count - 1)
    invalid = None if valid is None else ~valid.cpu().bool()
    out = np.empty((count, keep), dtype=np.int64)
    for start in range(0, count, chunk_size):
        block = torch.cdist(points[start : start + chunk_size], points)
        if invalid is not None:
            block[:, invalid] = torch.finfo(block.dtype).max  # after every real class
        rows = torch.arange(block.shape[0])
        block[rows, rows + start] = float("inf")  # after the classes without a centroid: never oneself
        values, indices = block.topk(keep, dim=1, largest=False)
        # Ties in class order: sort the kept entries by (distance, class).
        order = np.lexsort((indices.numpy(), values.numpy()), axis=1)
        out[start : start + chunk_size] = np.take_along_axis(indices.numpy(), order, axis=1)
    return out


class HardClassPKBatchSampler(PKBatchSampler):
    """P x K batches whose classes are partly the nearest neighbours of the batch's seed classes.

    Before any centroids it yields exactly :class:`~composer_dynsample.PKBatchSampler`'s batches. After
    :meth:`update_class_embeddings`, from the next :meth:`set_epoch` on, each batch takes
    ``P - round(hard_fraction * P)`` seed classes at random (weighted by the chunks each class has left
    this epoch) and fills the other slots, one seed after the other, with the seed's nearest class by
    centroid distance that is not in the batch yet and still has a chunk. The chunks are
    :class:`~composer_dynsample.PKBatchSampler`'s, so a batch is exactly P classes x K samples, every class
    contributes as many chunks per epoch as under P x K (every class still appears), and a class whose
    chunks left equal the batches left joins the next batch first, so the epoch always completes. The
    order is a pure function of ``(seed, epoch, centroids)``; ranks shard the global batches as every
    :class:`~composer_dynsample.samplers.DistributedBatchSampler` does.

    Args:
        labels (Sequence[int] | numpy.ndarray | torch.Tensor): The class of every dataset index.
        classes_per_batch (int): P, at least 2.
        samples_per_class (int): K, at least 1.
        hard_fraction (float): The share of a batch's classes chosen as the seeds' nearest classes, in
            ``[0, 1)``. Default: ``0.5``.
        distance (str): Centroid distance, ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.
        **pk_options: ``num_replicas``, ``rank``, ``seed``, ``small_classes``, ``drop_last``, as for
            :class:`~composer_dynsample.PKBatchSampler`.

    Example:
        >>> labels = torch.arange(32) % 8
        >>> sampler = HardClassPKBatchSampler(labels, classes_per_batch=2, samples_per_class=2, hard_fraction=0.5)
        >>> centroids = torch.tensor([[float(c // 2)] for c in range(8)])  # classes 2j and 2j+1 coincide
        >>> sampler.update_class_embeddings(centroids)
        >>> sampler.set_epoch(1)
        >>> all(labels[b[0]] // 2 == labels[b[2]] // 2 for b in sampler)  # each batch pairs doppelgangers
        True
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        classes_per_batch: int,
        samples_per_class: int,
        *,
        hard_fraction: float = 0.5,
        distance: str = "euclidean",
        **pk_options: Any,
    ) -> None:
        super().__init__(labels, classes_per_batch, samples_per_class, **pk_options)
        self.hard_fraction = check_float(
            "hard_fraction", hard_fraction, minimum=0, maximum=1, strict_maximum=True
        )
        self.distance = check_choice("distance", distance, ("euclidean", "cosine"))
        self._pending: torch.Tensor | None = None
        self._centroids: torch.Tensor | None = None  # the snapshot the current epoch's batches use
        self._neighbours: np.ndarray | None = None

    # ------------------------------------------------------------------------------------------ snapshot
    def update_class_embeddings(self, centroids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Hand over ``(num_classes, D)`` centroids, one row per class in sorted label order.

        They apply from the next :meth:`set_epoch`. Classes with a zero in ``counts`` (no embedding seen
        yet, as :func:`~composer_dynsample.algorithms.class_centroids` reports them) or a non-finite row
        are nobody's neighbour until they have a centroid.
        """
        if (
            not isinstance(centroids, torch.Tensor)
            or centroids.ndim != 2
            or centroids.shape[0] != self.classes.size
        ):
            shape = (
                tuple(centroids.shape) if isinstance(centroids, torch.Tensor) else type(centroids).__name__
            )
            raise ValueError(
                f"centroids must be a ({self.classes.size}, dim) tensor, one row per class, got {shape}."
            )
        centroids = centroids.detach().to(torch.float32).cpu().clone()
        if counts is not None:
            counts = torch.as_tensor(counts).cpu()
            if counts.shape != (self.classes.size,):
                raise ValueError(f"counts must have shape ({self.classes.size},), got {tuple(counts.shape)}.")
            centroids[counts <= 0] = float("nan")
        self._pending = centroids

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; centroids handed over since the last call apply from this epoch on."""
        super().set_epoch(epoch)
        if self._pending is not None:
            self._activate(self._pending)
            self._pending = None

    def _activate(self, centroids: torch.Tensor) -> None:
        valid = torch.isfinite(centroids).all(dim=1)
        self._centroids = centroids
        # A seed draws at most P - 1 neighbours; a few times that leaves room for ones already used up.
        limit = max(4 * self.classes_per_batch, 64)
        self._neighbours = nearest_classes(torch.nan_to_num(centroids), valid, self.distance, limit=limit)

    def snapshot_fingerprint(self) -> str:
        """A SHA-256 of the centroids the current epoch uses (``""`` before any): equal across ranks when
        their batches are."""
        if self._centroids is None:
            return ""
        return hashlib.sha256(torch.nan_to_num(self._centroids, nan=-1.0).numpy().tobytes()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the centroid snapshot its batches are built from, for an exact resume."""
        return {"epoch": self.epoch, "centroids": self._centroids, "pending": self._pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the resumed epoch yields the interrupted epoch's batches."""
        self.epoch = int(state["epoch"])
        centroids, self._pending = state.get("centroids"), state.get("pending")
        if centroids is None:
            self._centroids = self._neighbours = None
        else:
            self._activate(centroids)

    # ----------------------------------------------------------------------------------------- batches
    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks, ``(num_global_batches, P * K)``; P x K's before centroids."""
        if self._neighbours is None:
            return super().global_batches(epoch)
        p, k, n = self.classes_per_batch, self.samples_per_class, self._num_batches
        rng = epoch_rng(self.seed, epoch, stream=1)
        shuffled = self._by_class[np.argsort(self._class_of_sorted + rng.random(self._by_class.size))]
        left = self._chunks_this_epoch(rng)
        used = np.zeros_like(left)
        batches = np.empty((n, p * k), dtype=np.int64)
        for b in range(n):
            members = self._batch_classes(left, n - b, rng)
            for slot, c in enumerate(members):
                if self._is_small[c]:
                    draws = np.floor(rng.random(k) * self._counts[c]).astype(np.int64)
                    positions = self._class_start[c] + draws
                else:
                    positions = self._class_start[c] + used[c] * k + np.arange(k)
                batches[b, slot * k : (slot + 1) * k] = shuffled[positions]
                used[c] += 1
                left[c] -= 1
        return batches[rng.permutation(n)]

    def _chunks_this_epoch(self, rng: np.random.Generator) -> np.ndarray:
        """Each class's chunks this epoch: P x K's capped counts, trimmed at random to exactly n * P."""
        left = self._chunks.astype(np.int64).copy()
        excess = int(left.sum()) - self._num_batches * self.classes_per_batch
        if excess > 0:  # fewer than P chunks over: one off each of `excess` distinct classes
            candidates = np.flatnonzero(left > 0)
            left[rng.choice(candidates, size=excess, replace=False)] -= 1
        return left

    def _batch_classes(self, left: np.ndarray, batches_left: int, rng: np.random.Generator) -> list[int]:
        """The P classes of the next batch: forced classes, random seeds, then the seeds' nearest classes."""
        p = self.classes_per_batch
        neighbours = self._neighbours
        members = [int(c) for c in np.flatnonzero(left == batches_left)]  # must be in every batch left
        in_batch = np.zeros(left.size, dtype=bool)
        in_batch[members] = True
        num_seeds = max(1, p - round(self.hard_fraction * p))
        while len(members) < num_seeds:
            members.append(_draw(left, in_batch, rng))
        seeds = list(members)
        turn = 0
        while len(members) < p:
            seed = seeds[turn % len(seeds)]
            turn += 1
            choice = next((int(c) for c in neighbours[seed] if left[c] > 0 and not in_batch[c]), None)  # type: ignore[index]
            if choice is None:  # every neighbour used up: a random class keeps the batch whole
                choice = _draw(left, in_batch, rng)
            members.append(choice)
            in_batch[choice] = True
        return members


def _draw(left: np.ndarray, in_batch: np.ndarray, rng: np.random.Generator) -> int:
    """A class not in the batch, with probability proportional to its chunks left; marks it taken."""
    weights = np.where(in_batch, 0, left).astype(np.float64)
    choice = int(rng.choice(left.size, p=weights / weights.sum()))
    in_batch[choice] = True
    return choice
