"""Neighbour batches: each seed sample with a positive and its nearest other-class samples in the dataset.

Dataset-level hard negatives (ANCE, sentence-transformers' ``mine_hard_negatives``, NV-Retriever) are
usually mined offline, between trainings or by a second job refreshing an index. Here the nearest
neighbours come from :class:`~composer_dynsample.EmbeddingTable`, which the forward pass keeps up to
date, and are handed to :class:`NeighbourBatchSampler` between epochs: identical on every rank, part of
the checkpoint, with the false-negative guards of the offline tools.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import numpy as np
import torch

from composer_dynsample.samplers._ranking import SLACK, rank_columns
from composer_dynsample.samplers.base import DistributedBatchSampler, ShardKeywords, as_index_array, epoch_rng
from composer_dynsample.validation import check_choice, check_float, check_int, check_keywords

__all__ = ["NeighbourBatchSampler", "nearest_other_class"]


SEARCHES = ("exact", "faiss", "faiss_ivf")
_IVF_PROBES = 32  # IVF cells searched per query, of about sqrt(N)


def _centroid_similarity(unit: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each row's cosine similarity to its class centroid (the mean of the class's valid rows)."""
    centroids = torch.zeros(int(labels.max()) + 1, unit.shape[1], dtype=unit.dtype)
    centroids.index_add_(0, labels[valid], unit[valid])
    return (unit * torch.nn.functional.normalize(centroids, dim=1)[labels]).sum(dim=1)


def nearest_other_class(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    k: int,
    *,
    skip_top: int = 0,
    max_relative_similarity: float | None = None,
    valid: torch.Tensor | None = None,
    chunk_size: int = 1024,
    search: str = "exact",
) -> tuple[np.ndarray, dict[str, int]]:
    """Each sample's ``k`` nearest samples of other classes by cosine similarity, with false-negative guards.

    Every search keeps a few more candidates than needed by float32 similarity and ranks them again in
    float64 (ties in index order), so the lists are a pure function of the embeddings. ``"exact"``: one
    chunk of rows at a time against all rows in torch, memory ``chunk_size x N``; equal to a float64
    brute force. ``"faiss"``: faiss's exact ``IndexFlatIP``, the same lists. ``"faiss_ivf"``: faiss's
    approximate ``IndexIVFFlat`` (about ``sqrt(N)`` cells, 32 searched per query; 10 k-means iterations on
    at most 64 rows per cell, with faiss's fixed seed), for large tables. Both faiss searches need the
    ``faiss`` extra (``pip install composer-dynsample[faiss]``).

    Guards, as in sentence-transformers' ``mine_hard_negatives`` and NV-Retriever: the ``skip_top`` nearest
    other-class samples are skipped (a rank window: the very nearest are the likeliest unlabelled
    positives), and with ``max_relative_similarity`` a candidate more similar to the anchor than that
    fraction of the anchor's similarity to its own class centroid is skipped. Rows without a valid
    embedding (``valid`` false, or a non-finite row) are nobody's neighbour and get no neighbours (a row
    of ``-1``); an anchor left with fewer than ``k`` candidates is padded with ``-1``. Labels may be any
    integers.

    Args:
        embeddings (torch.Tensor): ``(N, D)`` embeddings.
        labels (torch.Tensor): ``(N,)`` integer labels.
        k (int): Neighbours kept per sample.
        skip_top (int): Nearest other-class samples skipped first. Default: ``0``.
        max_relative_similarity (float, optional): Skip candidates with similarity above this fraction of
            the anchor's similarity to its class centroid (NV-Retriever uses 0.95). Default: ``None`` (off).
        valid (torch.Tensor, optional): ``(N,)`` bool, which rows hold an embedding. Default: all.
        chunk_size (int): Anchors per matrix product. Default: ``1024``.
        search (str): ``"exact"``, ``"faiss"`` or ``"faiss_ivf"``. Default: ``"exact"``.

    Returns:
        tuple[numpy.ndarray, dict[str, int]]: ``(N, k)`` int64 neighbour indices, nearest first, and how many
        candidates each guard skipped (``"rank_window"``, ``"margin"``).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> neighbours, skipped = nearest_other_class(x, torch.tensor([0, 1, 0, 1]), 1)
        >>> neighbours.ravel().tolist()
        [1, 0, 3, 2]
    """
    check_int("k", k, minimum=1)
    check_int("skip_top", skip_top, minimum=0)
    check_int("chunk_size", chunk_size, minimum=1)
    check_search(search)
    n = embeddings.shape[0]
    unit = torch.nn.functional.normalize(embeddings.detach().cpu().double(), dim=1)
    labels = torch.unique(torch.as_tensor(labels).cpu().long(), return_inverse=True)[1]  # classes 0..C-1
    valid = torch.ones(n, dtype=torch.bool) if valid is None else torch.as_tensor(valid).cpu().bool()
    valid = valid & torch.isfinite(unit).all(dim=1)  # one NaN row would make its class centroid NaN
    positive = _centroid_similarity(unit, labels, valid)
    wanted = skip_top + k
    find = _candidate_finder(search, unit, labels, valid)
    out = np.full((n, k), -1, dtype=np.int64)
    skipped = {"rank_window": 0, "margin": 0}
    for start in range(0, n, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, n))
        candidates = find(rows, wanted + SLACK)
        values, indices = _rerank(unit, rows, candidates, wanted)
        has_embedding = valid[rows, None]  # an anchor without one keeps a row of -1
        kept = torch.isfinite(values[:, skip_top:]) & has_embedding
        skipped["rank_window"] += int((torch.isfinite(values[:, :skip_top]) & has_embedding).sum())
        if max_relative_similarity is not None:
            too_close = kept & (values[:, skip_top:] > max_relative_similarity * positive[rows, None])
            skipped["margin"] += int(too_close.sum())
            kept &= ~too_close
        # Kept candidates first, in similarity order; the rest become -1.
        order = torch.argsort((~kept).to(torch.int8), dim=1, stable=True)
        ranked = torch.where(kept, indices[:, skip_top:], -1).gather(1, order)
        out[start : start + rows.numel(), : ranked.shape[1]] = ranked[:, :k].numpy()
    return out, skipped


def check_max_relative_similarity(value: object) -> float | None:
    """Validate the margin guard's factor: ``None`` (the guard off) or a number above 0."""
    if value is None:
        return None
    return check_float("max_relative_similarity", value, minimum=0, strict_minimum=True)


def check_search(search: object) -> str:
    """Validate ``search`` and, for a faiss search, that faiss is installed; raise a clear error otherwise."""
    check_choice("search", search, SEARCHES)
    if search != "exact" and importlib.util.find_spec("faiss") is None:
        raise ImportError(
            f"search={search!r} needs faiss, which is not installed: pip install 'composer-dynsample[faiss]' "
            "(faiss-cpu), or use search='exact'."
        )
    return str(search)


def _candidate_finder(
    search: str, unit: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor
) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``find(rows, width)``: each row's ``width`` most similar valid samples of other classes by float32
    similarity, most similar first, ``-1`` where there are fewer."""
    fast = unit.float()
    if search == "exact":

        def find_exact(rows: torch.Tensor, width: int) -> torch.Tensor:
            similarity = fast[rows] @ fast.T
            blocked = (labels[rows, None] == labels[None, :]) | ~valid[None, :]
            similarity.masked_fill_(blocked, float("-inf"))
            values, indices = similarity.topk(min(width, fast.shape[0]), dim=1)
            return torch.where(torch.isfinite(values), indices, -1)

        return find_exact
    index, ids = _faiss_index(search, fast, valid)
    same_class = torch.bincount(labels[ids], minlength=int(labels.max()) + 1)

    def find_faiss(rows: torch.Tensor, width: int) -> torch.Tensor:
        # The index holds the rows' own classes too: ask for enough to keep `width` others without them.
        asked = min(width + int(same_class[labels[rows]].max()), ids.numel())
        found = torch.from_numpy(index.search(np.ascontiguousarray(fast[rows].numpy()), asked)[1])
        candidates = torch.where(found >= 0, ids[found.clamp(min=0)], -1)
        candidates[(candidates >= 0) & (labels[candidates.clamp(min=0)] == labels[rows, None])] = -1
        order = torch.argsort((candidates < 0).to(torch.int8), dim=1, stable=True)  # others first, in order
        return candidates.gather(1, order)[:, :width]

    return find_faiss


def _faiss_index(search: str, fast: torch.Tensor, valid: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """A faiss inner-product index of the valid rows (exact flat, or IVF) and the row of each of its ids."""
    import faiss

    ids = torch.nonzero(valid).flatten()
    data = np.ascontiguousarray(fast[ids].numpy())
    dim = data.shape[1]
    if search == "faiss":
        index = faiss.IndexFlatIP(dim)
    else:
        cells = max(1, min(round(math.sqrt(ids.numel())), ids.numel() // 39))  # faiss wants 39 per cell
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, cells, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter, index.cp.max_points_per_centroid = 10, 64  # k-means on a sample: seconds, not minutes
        index.train(data)
        index.nprobe = min(_IVF_PROBES, cells)
    index.add(data)
    return index, ids


def _rerank(
    unit: torch.Tensor, rows: torch.Tensor, candidates: torch.Tensor, wanted: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``wanted`` most similar candidates of each row by float64 cosine similarity, ties in index order:
    ``(values, indices)``, ``-inf`` and ``-1`` where a row has fewer."""
    similarity = (unit[rows, None, :] * unit[candidates.clamp(min=0)]).sum(dim=2)
    similarity[candidates < 0] = float("-inf")
    order = torch.from_numpy(rank_columns(-similarity.numpy(), candidates.numpy(), wanted))
    values, indices = similarity.gather(1, order), candidates.gather(1, order)
    if values.shape[1] < wanted:
        pad = wanted - values.shape[1]
        values = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
        indices = torch.nn.functional.pad(indices, (0, pad), value=-1)
    return values, indices


class NeighbourBatchSampler(DistributedBatchSampler):
    """Batches of seed samples, each with a same-class positive and its nearest other-class samples.

    Every batch holds ``seeds_per_batch`` groups of ``2 + negatives_per_seed`` indices: a seed, a random
    other sample of the seed's class, and the seed's nearest samples of other classes in the snapshot
    handed over with :meth:`update_neighbours` (from the next :meth:`set_epoch` on; see
    :func:`nearest_other_class` for the false-negative guards). Before any snapshot, and where a seed has
    fewer neighbours than asked for, the negatives are random samples of other classes. Seeds are drawn
    from a permutation of the dataset, so an epoch has ``len(labels) // batch_size`` global batches and
    every sample is a seed at most once per epoch; the order is a pure function of
    ``(seed, epoch, snapshot)``. A sample may appear twice in a batch (a seed may be another seed's
    negative); the miner and loss see a pool with hard negatives either way.

    Args:
        labels (Sequence[int] | numpy.ndarray | torch.Tensor): The class of every dataset index.
        seeds_per_batch (int): Seeds per batch, at least 1; a batch of ``seeds_per_batch x (2 +
            negatives_per_seed)`` indices holds at most ``len(labels)``.
        negatives_per_seed (int): Nearest other-class samples per seed, at least 1.
        skip_top (int): The rank window: nearest other-class samples skipped. Default: ``0``.
        max_relative_similarity (float, optional): The margin guard of :func:`nearest_other_class`.
            Default: ``None``.
        search (str): How :func:`nearest_other_class` searches: ``"exact"`` (torch), ``"faiss"`` (exact, the
            same lists) or ``"faiss_ivf"`` (approximate, for large tables); the faiss ones need the ``faiss``
            extra. Default: ``"exact"``.
        num_replicas, rank, seed, drop_last: As for :class:`~composer_dynsample.PKBatchSampler`.

    Example:
        >>> labels = torch.arange(24) % 4
        >>> sampler = NeighbourBatchSampler(labels, seeds_per_batch=2, negatives_per_seed=2)
        >>> sampler.batch_size, len(sampler)
        (8, 3)
        >>> batch = next(iter(sampler))
        >>> labels[batch[0]] == labels[batch[1]], labels[batch[0]] != labels[batch[2]]
        (tensor(True), tensor(True))
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        seeds_per_batch: int,
        negatives_per_seed: int,
        *,
        skip_top: int = 0,
        max_relative_similarity: float | None = None,
        search: str = "exact",
        **options: Unpack[ShardKeywords],
    ) -> None:
        check_keywords(type(self).__name__, options, ShardKeywords)
        label_array = as_index_array("labels", labels)
        size = label_array.size
        if size < 3:
            raise ValueError(
                f"labels must hold at least 3 samples (a seed, a positive, a negative), got {size}."
            )
        # A batch of seeds_per_batch x (2 + negatives_per_seed) indices must fit in the dataset.
        self.seeds_per_batch = check_int("seeds_per_batch", seeds_per_batch, minimum=1, maximum=size // 3)
        self.negatives_per_seed = check_int(
            "negatives_per_seed", negatives_per_seed, minimum=1, maximum=size // self.seeds_per_batch - 2
        )
        self.skip_top = check_int("skip_top", skip_top, minimum=0)
        self.max_relative_similarity = check_max_relative_similarity(max_relative_similarity)
        self.search = check_search(search)
        group = 2 + self.negatives_per_seed
        super().__init__(label_array.size, self.seeds_per_batch * group, **options)
        self.labels = label_array
        classes, inverse, counts = np.unique(label_array, return_inverse=True, return_counts=True)
        if classes.size < 2:
            raise ValueError(f"labels must hold at least 2 classes for negatives, got {classes.size}.")
        self._by_class = np.argsort(inverse, kind="stable")
        self._class_of = inverse
        self._class_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._counts = counts
        self._pending: np.ndarray | None = None
        self._neighbours: np.ndarray | None = None
        self.last_skipped: dict[str, int] = {"rank_window": 0, "margin": 0}
        self._check_enough_batches()

    @property
    def num_global_batches(self) -> int:
        """``len(labels) // batch_size``: an epoch covers about the dataset once."""
        return self.num_indices // self.batch_size

    # ------------------------------------------------------------------------------------------ snapshot
    def update_neighbours(self, embeddings: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Compute every sample's nearest other-class samples from ``(N, D)`` embeddings (e.g. the table's
        rows); they apply from the next :meth:`set_epoch`. ``valid`` marks rows that hold an embedding."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.shape[:1] != (self.num_indices,):
            shape = (
                tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            )
            raise ValueError(f"embeddings must have one row per sample ({self.num_indices}), got {shape}.")
        self._pending, self.last_skipped = nearest_other_class(
            embeddings,
            torch.from_numpy(self.labels),
            self.negatives_per_seed,
            skip_top=self.skip_top,
            max_relative_similarity=self.max_relative_similarity,
            valid=valid,
            search=self.search,
        )

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; a snapshot handed over since the last call applies from this epoch on."""
        super().set_epoch(epoch)
        if self._pending is not None:
            self._neighbours, self._pending = self._pending, None

    def snapshot_fingerprint(self) -> str:
        """A SHA-256 of the neighbour lists the current epoch uses (``""`` before any)."""
        return "" if self._neighbours is None else hashlib.sha256(self._neighbours.tobytes()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the neighbour lists its batches are built from, for an exact resume."""
        return {"epoch": self.epoch, "neighbours": self._neighbours, "pending": self._pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.epoch = int(state["epoch"])
        self._neighbours, self._pending = state.get("neighbours"), state.get("pending")

    # ----------------------------------------------------------------------------------------- batches
    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks: ``(num_global_batches, seeds_per_batch * (2 + negatives))``."""
        rng = epoch_rng(self.seed, epoch, stream=2)
        count = self.num_global_batches * self.seeds_per_batch
        seeds = rng.permutation(self.num_indices)[:count]
        positives = self._positives(seeds, rng)
        negatives = self._random_negatives(seeds, rng)
        if self._neighbours is not None:
            mined = self._neighbours[seeds]
            negatives = np.where(mined >= 0, mined, negatives)
        groups = np.concatenate([seeds[:, None], positives[:, None], negatives], axis=1)
        return groups.reshape(self.num_global_batches, self.batch_size)

    def _positives(self, seeds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A random other sample of each seed's class (the seed itself in a class of one)."""
        cls = self._class_of[seeds]
        counts = self._counts[cls]
        offset = np.floor(rng.random(seeds.size) * np.maximum(counts - 1, 1)).astype(np.int64)
        candidates = self._by_class[self._class_start[cls] + offset]
        # Skip the seed itself: take the next slot in the class when the draw hit it.
        hit = (candidates == seeds) & (counts > 1)
        candidates[hit] = self._by_class[self._class_start[cls[hit]] + counts[hit] - 1]
        return candidates

    def _random_negatives(self, seeds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``negatives_per_seed`` random samples of other classes per seed (redrawn until they differ)."""
        draws = rng.integers(0, self.num_indices, size=(seeds.size, self.negatives_per_seed))
        same = self._class_of[draws] == self._class_of[seeds][:, None]
        while same.any():
            draws[same] = rng.integers(0, self.num_indices, size=int(same.sum()))
            same = self._class_of[draws] == self._class_of[seeds][:, None]
        return draws
