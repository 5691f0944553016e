"""Hard-class P x K batches: each batch holds classes the current model confuses, chosen by class centroid.

Class-level hard mining (Smirnov et al. 2018, "Doppelganger mining"; Suh et al. 2019, "Stochastic
class-based hard example mining") builds batches whose classes lie close together in embedding
space, so the in-batch miner finds hard negatives at all. :class:`HardClassPKBatchSampler` does it with
class centroids handed to it between epochs (from :class:`~composer_dynsample.EmbeddingTable`, which
the forward pass feeds), keeping every guarantee of :class:`~composer_dynsample.PKBatchSampler`; which
classes fill each batch of an epoch is planned by :mod:`~composer_dynsample.samplers._hard_class_plan`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np
import torch

from composer_dynsample.samplers._hard_class_plan import _plan_classes
from composer_dynsample.samplers._ivf import _kmeans, _nearest_centre
from composer_dynsample.samplers._ranking import SLACK, rank_columns
from composer_dynsample.samplers.base import epoch_rng
from composer_dynsample.samplers.pk import PKBatchSampler, PKKeywords
from composer_dynsample.validation import check_choice, check_float, check_int, check_keywords

__all__ = ["HardClassPKBatchSampler", "class_means", "nearest_classes", "pair_centroids"]


#: Valid values of ``search`` for :func:`nearest_classes` and :class:`HardClassPKBatchSampler`.
CLASS_SEARCHES = ("auto", "exact", "ivf")
# Up to this many classes with a centroid, ``search="auto"`` is exact: a few seconds at most on 2 cores.
EXACT_SEARCH_MAX_CLASSES = 10_000
_IVF_PROBES = 8  # a cell's queries meet the classes of about this many average cells


def class_means(
    rows: torch.Tensor, labels: torch.Tensor, num_classes: int, held: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of each class's rows, in float32, and how many rows each mean is over: the centroids
    :meth:`HardClassPKBatchSampler.update_class_embeddings` takes.

    Args:
        rows (torch.Tensor): ``(N, D)`` embeddings, one per sample.
        labels (torch.Tensor): ``(N,)`` class of each row, in ``[0, num_classes)``.
        num_classes (int): The number of classes ``C``.
        held (torch.Tensor, optional): ``(N,)`` bool, the rows that hold an embedding; the others count for
            no class. Default: every row.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``(C, D)`` centroids (zeros for a class with no row) and the
        ``(C,)`` int64 counts.

    Example:
        >>> rows = torch.tensor([[0.0, 2.0], [2.0, 0.0], [4.0, 4.0]])
        >>> centroids, counts = class_means(rows, torch.tensor([0, 0, 1]), 2, torch.tensor([True, True, False]))
        >>> centroids.tolist(), counts.tolist()
        ([[1.0, 1.0], [0.0, 0.0]], [2, 0])
    """
    labels = labels.to(rows.device)
    values = rows.float()
    if held is not None:
        held = held.to(rows.device).bool()
        labels, values = labels[held], values[held]
    sums = torch.zeros(num_classes, rows.shape[1], dtype=torch.float32, device=rows.device)
    sums.index_add_(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes)
    return sums / counts.clamp(min=1).unsqueeze(1), counts


def nearest_classes(
    centroids: torch.Tensor,
    valid: torch.Tensor | None = None,
    distance: str = "euclidean",
    *,
    limit: int | None = None,
    chunk_size: int = 2048,
    search: str = "auto",
) -> np.ndarray:
    """Every class's nearest other classes by centroid, nearest first: a ``(C, M)`` int64 array.

    ``M`` is ``C - 1`` (every other class) or ``limit``. Classes without a centroid (``valid`` false)
    come last, in class order; ties are in class order too. The result is a pure function of the
    centroids: every rank that runs the same code on the same snapshot gets the same lists.

    ``search="exact"`` compares every pair a chunk of classes at a time (memory ``chunk_size x C``): a
    float32 pass keeps each class's ``limit + 8`` nearest, ranked again by float64 distance, so the lists
    equal a float64 brute force. ``search="ivf"`` is approximate, for many classes, and needs ``limit``:
    a k-means of the centroids (fixed seed and subsample, 10 iterations, sums in float64 in a fixed
    order) cuts them into about ``sqrt(C)`` cells, and the classes of a cell are compared, in float32,
    only with the classes of the nearest cells until those hold 8 average cells' worth. ``"auto"`` is
    exact up to 10,000 classes with a centroid (or without ``limit``), IVF above.

    Args:
        centroids (torch.Tensor): ``(C, D)`` class centroids.
        valid (torch.Tensor, optional): ``(C,)`` bool, which centroids exist. Default: all.
        distance (str): ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.
        limit (int, optional): Keep this many nearest classes per class. Default: all ``C - 1``.
        chunk_size (int): Classes per distance block of the exact search. Default: ``2048``.
        search (str): ``"auto"``, ``"exact"`` or ``"ivf"``. Default: ``"auto"``.

    Example:
        >>> nearest_classes(torch.tensor([[0.0], [10.0], [1.0]])).tolist()
        [[2, 1], [2, 0], [0, 1]]
        >>> nearest_classes(torch.tensor([[0.0], [10.0], [1.0]]), limit=1).tolist()
        [[2], [2], [0]]
    """
    check_choice("distance", distance, ("euclidean", "cosine"))
    check_choice("search", search, CLASS_SEARCHES)
    check_int("chunk_size", chunk_size, minimum=1)
    points = centroids.detach().to(torch.float64).cpu()
    if distance == "cosine":
        points = torch.nn.functional.normalize(points, dim=1)
    count = points.shape[0]
    keep = count - 1 if limit is None else min(check_int("limit", limit, minimum=1), count - 1)
    usable = torch.ones(count, dtype=torch.bool) if valid is None else valid.cpu().bool()
    if search == "ivf" and limit is None:
        raise ValueError("search='ivf' needs a limit: it finds a few nearest classes, not every order.")
    small = int(usable.sum()) <= max(EXACT_SEARCH_MAX_CLASSES if search == "auto" else 0, 4 * (keep + SLACK))
    if search == "exact" or limit is None or small:
        return _rank_candidates(points, _exact_candidates(points, usable, keep, chunk_size), usable, keep)
    return _ivf_nearest(points, usable, keep)


def _exact_candidates(points: torch.Tensor, usable: torch.Tensor, keep: int, chunk_size: int) -> torch.Tensor:
    """Every class's ``keep + 8`` nearest usable classes by float32 distance, or all others when few."""
    count = points.shape[0]
    others = torch.arange(count)
    if keep + SLACK + 1 >= int(usable.sum()):  # few enough to rank every other class in float64
        return others.expand(count, count)
    fast = _centred32(points, usable)
    norms = (fast * fast).sum(dim=1)
    out = torch.empty(count, keep + SLACK, dtype=torch.int64)
    for start in range(0, count, chunk_size):
        block = fast[start : start + chunk_size]
        squared = norms[start : start + chunk_size, None] - 2 * block @ fast.T + norms[None, :]
        squared[:, ~usable] = float("inf")
        rows = torch.arange(block.shape[0])
        squared[rows, rows + start] = float("inf")
        out[start : start + chunk_size] = squared.topk(keep + SLACK, dim=1, largest=False).indices
    return out


def _centred32(points: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``points`` moved so that the usable ones average zero.

    Distances do not change, but the float32 passes compute ``|x|^2 - 2 x.y + |y|^2``: centroids that
    share a large offset would make those terms huge and cancel away the differences between classes.
    """
    centre = points[usable].mean(dim=0) if bool(usable.any()) else points.new_zeros(points.shape[1])
    return (points - centre).float()


def _rank_candidates(
    points: torch.Tensor, candidates: torch.Tensor, usable: torch.Tensor, keep: int
) -> np.ndarray:
    """Each row's first ``keep`` candidates by float64 squared distance, ties and unusable classes in class
    order (unusable after every usable one), never the row's own class."""
    count, width = candidates.shape
    out = np.empty((count, keep), dtype=np.int64)
    step = max(1, 2**21 // max(1, width * points.shape[1]))  # about 16 MiB of gathered rows at a time
    for start in range(0, count, step):
        chosen = candidates[start : start + step]
        rows = torch.arange(start, start + chosen.shape[0])
        squared = ((points[chosen] - points[rows, None]) ** 2).sum(dim=2)
        squared[~usable[chosen]] = float("inf")
        squared[chosen == rows[:, None]] = float("nan")  # oneself: after everything, even the unusable
        order = rank_columns(squared.numpy(), chosen.numpy(), keep)
        out[start : start + chosen.shape[0]] = np.take_along_axis(chosen.numpy(), order, axis=1)
    return out


def _ivf_nearest(points: torch.Tensor, usable: torch.Tensor, keep: int) -> np.ndarray:
    """Each class's ``keep`` nearest usable classes among the classes of its cell's nearest cells, by
    float32 distance with ties in class order (each row is computed once, so the order is still a pure
    function of the centroids)."""
    members = torch.nonzero(usable).flatten()
    cells = max(1, round(math.sqrt(members.numel())))
    fast = _centred32(points, usable)
    centres = _kmeans(fast[members], cells)
    cell_of = _nearest_centre(fast, centres)  # every class, usable or not, has a cell
    member_cell = cell_of[members]
    by_cell = members[torch.argsort(member_cell, stable=True)].numpy()
    sizes = torch.bincount(member_cell, minlength=cells).numpy()
    starts = np.cumsum(sizes) - sizes
    queries_by_cell = torch.argsort(cell_of, stable=True)
    query_ends = torch.cumsum(torch.bincount(cell_of, minlength=cells), 0).tolist()
    probe_order = torch.argsort(torch.cdist(centres.double(), centres.double()), dim=1, stable=True).numpy()
    norms = (fast * fast).sum(dim=1)
    out = np.empty((points.shape[0], keep), dtype=np.int64)
    target = _IVF_PROBES * members.numel() // cells  # a cell's queries meet about 8 mean cells' classes
    where = torch.full((points.shape[0],), -1, dtype=torch.int64)
    for cell in range(cells):
        queries = queries_by_cell[(query_ends[cell - 1] if cell else 0) : query_ends[cell]]
        if queries.numel() == 0:
            continue
        probes = probe_order[cell]
        # Nearest cells first until the pool holds `target` classes (and `keep` besides oneself).
        enough = int(np.searchsorted(np.cumsum(sizes[probes]), max(target, keep + 1)))
        pool = np.concatenate([by_cell[starts[c] : starts[c] + sizes[c]] for c in probes[: enough + 1]])
        candidates = torch.from_numpy(pool)
        # ||q||^2 is the same along a row, so it changes no row's order: left out.
        squared = torch.addmm(norms[None, candidates], fast[queries], fast[candidates].T, alpha=-2)
        where[candidates] = torch.arange(pool.size)
        own = where[queries]  # each query's own column in the pool, -1 where it is not there
        squared[torch.nonzero(own >= 0).flatten(), own[own >= 0]] = float("inf")
        where[candidates] = -1
        out[queries.numpy()] = _smallest(squared, pool, keep)
    return out


def _smallest(values: torch.Tensor, labels: np.ndarray, keep: int) -> np.ndarray:
    """Per row, the ``labels`` of the ``keep`` smallest ``values``, ordered by value then label."""
    kept, top = values.topk(keep, dim=1, largest=False)
    chosen = labels[top.numpy()]
    return np.take_along_axis(chosen, rank_columns(kept.numpy(), chosen, keep), axis=1)


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
        samples_per_class (int): K, at least 2 (1 with ``require_positive_pairs=False``).
        hard_fraction (float): The share of a batch's classes chosen as the seeds' nearest classes, in
            ``[0, 1)``. Default: ``0.5``.
        distance (str): Centroid distance, ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.
        **pk_options: ``num_replicas``, ``rank``, ``seed``, ``small_classes``, ``drop_last``,
            ``require_positive_pairs``, as for :class:`~composer_dynsample.PKBatchSampler`.

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
        search: str = "auto",
        **pk_options: Unpack[PKKeywords],
    ) -> None:
        check_keywords(type(self).__name__, pk_options, PKKeywords)
        super().__init__(labels, classes_per_batch, samples_per_class, **pk_options)
        self.hard_fraction = check_float(
            "hard_fraction", hard_fraction, minimum=0, maximum=1, strict_maximum=True
        )
        self.distance = check_choice("distance", distance, ("euclidean", "cosine"))
        self.search = check_choice("search", search, CLASS_SEARCHES)
        self._pending: torch.Tensor | None = None
        self._centroids: torch.Tensor | None = None  # the snapshot the current epoch's batches use
        self._neighbours: np.ndarray | None = None

    # ------------------------------------------------------------------------------------------ snapshot
    def update_class_embeddings(self, centroids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Hand over ``(num_classes, D)`` centroids, one row per class in sorted label order.

        They apply from the next :meth:`set_epoch`. Classes with a zero in ``counts`` (no embedding seen
        yet, as :func:`class_means` reports them) or a non-finite row
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
        # A seed draws at most P - 1 neighbours; twice that leaves room for ones already used up.
        self._neighbours = nearest_classes(
            torch.nan_to_num(centroids),
            valid,
            self.distance,
            limit=2 * self.classes_per_batch,
            search=self.search,
        )

    def snapshot_fingerprint(self) -> str:
        """A SHA-256 of the centroids the current epoch uses and of the nearest classes found from them
        (``""`` before any): equal across ranks when their batches are."""
        if self._centroids is None or self._neighbours is None:
            return ""
        digest = hashlib.sha256(torch.nan_to_num(self._centroids, nan=-1.0).numpy().tobytes())
        digest.update(np.ascontiguousarray(self._neighbours).tobytes())
        return digest.hexdigest()

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
        num_seeds = max(1, p - round(self.hard_fraction * p))
        classes, chunk_in_class = _plan_classes(left, n, p, num_seeds, self._neighbours, rng)
        positions = self._class_start[classes, None] + chunk_in_class[:, None] * k + np.arange(k)
        small = self._is_small[classes]
        if small.any():  # a class smaller than K: K draws with replacement from its own block
            draws = np.floor(rng.random((int(small.sum()), k)) * self._counts[classes[small], None])
            positions[small] = self._class_start[classes[small], None] + draws.astype(np.int64)
        batches = shuffled[positions].reshape(n, p * k)
        return batches[rng.permutation(n)]

    def _chunks_this_epoch(self, rng: np.random.Generator) -> np.ndarray:
        """Each class's chunks this epoch: P x K's capped counts, trimmed at random to exactly n * P."""
        left = self._chunks.astype(np.int64).copy()
        excess = int(left.sum()) - self._num_batches * self.classes_per_batch
        if excess > 0:  # fewer than P chunks over: one off each of `excess` distinct classes
            candidates = np.flatnonzero(left > 0)
            left[rng.choice(candidates, size=excess, replace=False)] -= 1
        return left


def pair_centroids(
    embeddings: torch.Tensor, valid: torch.Tensor | None, pair_of: np.ndarray, num_pairs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's centroid for hard-class batches of pairs (in sorted label order): the mean of its valid,
    finite unit rows, and how many rows it is over (0: no centroid).

    Args:
        embeddings (torch.Tensor): ``(N, D)`` rows.
        valid (torch.Tensor, optional): ``(N,)`` bool, the rows holding an embedding. Default: every finite row.
        pair_of (numpy.ndarray): ``(N,)`` the pair of every row, ``0 .. num_pairs - 1``.
        num_pairs (int): The number of pairs.
    """
    unit = torch.nn.functional.normalize(embeddings.detach().cpu().float(), dim=1)
    usable = torch.isfinite(unit).all(dim=1)
    if valid is not None:
        usable &= torch.as_tensor(valid).cpu().bool()
    pairs = torch.from_numpy(pair_of)[usable]
    sums = torch.zeros(num_pairs, unit.shape[1])
    sums.index_add_(0, pairs, unit[usable])
    counts = torch.bincount(pairs, minlength=num_pairs)
    return sums / counts.clamp(min=1).unsqueeze(1), counts
