"""P x K batches: every batch holds exactly P distinct classes with K samples each."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from composer_dynsample.samplers.base import DistributedBatchSampler, ShardKeywords, as_index_array, epoch_rng
from composer_dynsample.validation import check_bool, check_choice, check_int, is_int

__all__ = ["PKBatchSampler", "PKKeywords"]

SmallClassPolicy = Literal["drop", "replace"]


class PKKeywords(ShardKeywords, total=False):
    """The keywords of :class:`PKBatchSampler` after its three arguments, as a subclass hands them on (its
    ``**options: Unpack[PKKeywords]``, PEP 692): their meaning and defaults are the PK sampler's."""

    small_classes: SmallClassPolicy
    require_positive_pairs: bool


_SMALL_CLASS_POLICIES = ("drop", "replace")


class PKBatchSampler(DistributedBatchSampler):
    """Distributed batch sampler of P classes x K samples, sharded by whole batches.

    Each epoch, every class is shuffled and cut into chunks of K samples (the last ``n_c mod K`` samples
    of a class of ``n_c`` sit the epoch out, a different few each epoch). The chunks are arranged into
    batches of P chunks of P different classes, the batches are shuffled, and rank ``r`` of ``W`` takes
    batches ``r, r + W, ...`` (see :class:`DistributedBatchSampler`). Within a batch the K samples of a
    class are contiguous. The order is a pure function of ``(seed, epoch)`` and the rank.

    Within an epoch no sample appears twice, on one rank or across ranks, unless ``small_classes=
    "replace"`` draws it more than once or ``drop_last=False`` pads. Every sample is used once per epoch
    when every class size is a multiple of K, the number of chunks is a multiple of ``P x W``, and no
    class has more chunks than there are batches; a class with more chunks than that (one class
    dominating the data) contributes one chunk to every batch and sits the rest out.

    The number of batches depends only on the class sizes, so ``len(sampler)`` is the same for every
    epoch and every rank.

    Args:
        labels (Sequence[int] | numpy.ndarray | torch.Tensor): The class of every dataset index, 1-D integers.
        classes_per_batch (int): P, the number of distinct classes in a batch, at least 2.
        samples_per_class (int): K, the number of samples of each class in a batch, at least 2 (a batch of
            P x 1 holds no positive pair; see ``require_positive_pairs``) and at most the number of samples.
        num_replicas (int, optional): The number of ranks. Default: the process group's world size, else
            the launcher's ``WORLD_SIZE``, else ``1`` (see :class:`DistributedBatchSampler`).
        rank (int, optional): This process's rank. Default: the process group's rank, else ``RANK``, else ``0``.
        seed (int): The seed of every epoch's order; must be identical on every rank. Default: ``0``.
        small_classes (str): What to do with a class of fewer than K samples: ``"drop"`` leaves it out
            (with a warning at construction), ``"replace"`` draws K of its samples with replacement, one
            chunk per epoch. Default: ``"drop"``.
        drop_last (bool): Even out the batch count across ranks by dropping the last batches (``True``) or
            by repeating batches from the start of the epoch (``False``). Default: ``True``.
        require_positive_pairs (bool): Refuse ``samples_per_class=1``, whose batches never hold two samples
            of one class, so that pair and triplet losses and the miners find nothing. Pass ``False`` for a
            loss that needs no pairs (proxy losses, ArcFace) or that takes its positives from elsewhere (a
            cross-batch memory). Default: ``True``.

    Example:
        >>> labels = [0, 0, 1, 1, 2, 2, 3, 3]
        >>> sampler = PKBatchSampler(labels, classes_per_batch=2, samples_per_class=2, seed=0)
        >>> len(sampler), sampler.batch_size
        (2, 4)
        >>> batches = list(sampler)
        >>> sorted(i for batch in batches for i in batch)
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> all(len({labels[i] for i in batch}) == 2 for batch in batches)
        True
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        classes_per_batch: int,
        samples_per_class: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        small_classes: SmallClassPolicy = "drop",
        drop_last: bool = True,
        require_positive_pairs: bool = True,
    ) -> None:
        label_array = as_index_array("labels", labels)
        if label_array.size == 0:
            raise ValueError("labels must not be empty.")
        self.require_positive_pairs = check_bool("require_positive_pairs", require_positive_pairs)
        self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, minimum=2)
        self.samples_per_class = _check_samples_per_class(
            samples_per_class, label_array.size, self.require_positive_pairs
        )
        self.small_classes: SmallClassPolicy = check_choice(
            "small_classes", small_classes, _SMALL_CLASS_POLICIES
        )  # type: ignore[assignment]
        super().__init__(
            label_array.size,
            self.classes_per_batch * self.samples_per_class,
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            drop_last=drop_last,
        )

        p, k = self.classes_per_batch, self.samples_per_class
        self.classes, class_of_index, counts = np.unique(label_array, return_inverse=True, return_counts=True)
        # Indices grouped by class, in index order; each epoch shuffles within these groups.
        self._by_class = np.argsort(class_of_index, kind="stable")
        self._class_of_sorted = class_of_index[self._by_class]
        self._class_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._counts = counts

        small = counts < k
        chunks = np.where(small, 1 if small_classes == "replace" else 0, counts // k)
        if int((chunks > 0).sum()) < p:
            raise ValueError(
                _unsatisfiable(p, k, counts, chunks, self.small_classes, 2 if require_positive_pairs else 1)
            )
        if small.any() and small_classes == "drop":
            warnings.warn(
                f"{int(small.sum())} of {counts.size} classes have fewer than samples_per_class={k} samples "
                "and are left out; pass small_classes='replace' to sample them with replacement.",
                UserWarning,
                stacklevel=2,
            )
        single = int((counts == 1).sum()) if small_classes == "replace" and k > 1 else 0
        if single:
            warnings.warn(
                f"{single} of {counts.size} classes have a single sample: with small_classes='replace' each of "
                f"their batches holds that one index {k} times (samples_per_class), a positive pair of a sample "
                "with itself, which trains nothing; leave them out (small_classes='drop') or give them more "
                "samples.",
                UserWarning,
                stacklevel=2,
            )
        self._is_small = small
        self._chunks, self._num_batches = _cap_chunks(chunks, p)
        self._check_enough_batches()

    @property
    def num_global_batches(self) -> int:
        """The number of P x K batches in one epoch over all ranks."""
        return self._num_batches

    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's P x K batches over all ranks, shape ``(num_global_batches, P * K)``."""
        p, k, n = self.classes_per_batch, self.samples_per_class, self._num_batches
        rng = epoch_rng(self.seed, epoch)
        # Shuffle within classes: class ids are integers, so adding noise in [0, 1) keeps the class blocks.
        shuffled = self._by_class[np.argsort(self._class_of_sorted + rng.random(self._by_class.size))]

        # Lay the chunks out class by class in a random class order; chunk t goes to batch t mod n.
        # A class's chunks are contiguous and at most n of them, so they land in n distinct batches.
        class_order = rng.permutation(self._chunks.size)
        class_order = class_order[self._chunks[class_order] > 0]
        per_class = self._chunks[class_order]
        chunk_class = np.repeat(class_order, per_class)[: n * p]
        first_chunk = np.repeat(np.cumsum(per_class) - per_class, per_class)[: n * p]
        chunk_in_class = np.arange(chunk_class.size) - first_chunk

        offsets = np.arange(k)
        positions = self._class_start[chunk_class, None] + chunk_in_class[:, None] * k + offsets
        small = self._is_small[chunk_class]
        if small.any():
            # A class smaller than K: K draws with replacement from its own block.
            draws = np.floor(rng.random((int(small.sum()), k)) * self._counts[chunk_class[small], None])
            positions[small] = self._class_start[chunk_class[small], None] + draws.astype(np.int64)
        samples = shuffled[positions]  # (n * p, k)

        batches = samples.reshape(p, n, k).transpose(1, 0, 2).reshape(n, p * k)
        return batches[rng.permutation(n)]


def _cap_chunks(chunks: np.ndarray, p: int) -> tuple[np.ndarray, int]:
    """Each class's chunks per epoch capped at the epoch's number of batches, and that number.

    No batch may hold two chunks of one class, so a class contributes at most one chunk per batch: cap
    every class at the number of batches and recount until the two agree (a few rounds at most).
    """
    num_batches = int(chunks.sum()) // p
    while True:
        capped = np.minimum(chunks, num_batches)
        recount = int(capped.sum()) // p
        if recount == num_batches:
            return capped, num_batches
        num_batches = recount


def _check_samples_per_class(value: object, num_samples: int, require_positive_pairs: bool) -> int:
    """K: at most the number of samples, and at least 2 unless ``require_positive_pairs`` is off."""
    smallest = 2 if require_positive_pairs else 1
    if is_int(value) and int(value) == 1 and require_positive_pairs:  # type: ignore[arg-type]
        raise ValueError(
            "samples_per_class=1 gives batches of P classes x 1 sample, which never hold a positive pair: "
            "pair and triplet losses and every miner find nothing to train on. Use samples_per_class >= 2, "
            "or pass require_positive_pairs=False for a loss that needs no pairs (a proxy or ArcFace loss) "
            "or that finds its positives elsewhere (a cross-batch memory)."
        )
    return check_int("samples_per_class", value, minimum=smallest, maximum=max(num_samples, smallest))  # type: ignore[return-value]


def _unsatisfiable(
    p: int, k: int, counts: np.ndarray, chunks: np.ndarray, small_classes: str, smallest_k: int
) -> str:
    """Why no P x K batch can be formed, and the values of P and K that would work."""
    if counts.size < 2:
        return f"a P x K batch needs at least 2 classes, but the labels hold {counts.size}."
    eligible = int((chunks > 0).sum())
    options = [f"classes_per_batch in [2, {eligible}]"] if eligible >= 2 else []
    if small_classes == "replace":
        problem = f"the labels hold only {counts.size} classes"
    else:
        sizes = np.sort(counts)[::-1]
        uniform = eligible == 0 and bool(sizes[0] == sizes[-1])
        if uniform:  # every class the same size, smaller than K: K must be that size
            noun = "sample" if sizes[0] == 1 else "samples"
            problem = f"every one of the {counts.size} classes has exactly {sizes[0]} {noun}"
        else:
            problem = (
                f"only {eligible} of {counts.size} classes have {k} samples or more (small_classes='drop')"
            )
        largest_k = int(sizes[p - 1]) if counts.size >= p else 0  # the P-th largest class
        if largest_k >= smallest_k:
            options.append(
                _k_choice(smallest_k, largest_k) + f" ({p} classes have that many)" * (not uniform)
            )
        if counts.size >= p:
            options.append("small_classes='replace'" + (" (which repeats samples in a batch)" * uniform))
        if not options:
            options.append(_p_and_k(sizes, smallest_k))
    return f"classes_per_batch={p} x samples_per_class={k} cannot be satisfied: {problem}; use {' or '.join(options)}."


def _k_choice(smallest: int, largest: int) -> str:
    """``samples_per_class=2``, or ``samples_per_class in [2, 5]``."""
    return (
        f"samples_per_class={largest}"
        if smallest == largest
        else f"samples_per_class in [{smallest}, {largest}]"
    )


def _p_and_k(sizes: np.ndarray, smallest_k: int) -> str:
    """A P and a K that work together when changing one of them alone does not (``sizes`` largest first)."""
    if int(sizes[1]) < smallest_k:
        return f"small_classes='replace' with classes_per_batch in [2, {sizes.size}]"
    if sizes[0] == sizes[-1]:
        return f"classes_per_batch in [2, {sizes.size}] with {_k_choice(smallest_k, int(sizes[0]))}"
    return f"classes_per_batch=2 with {_k_choice(smallest_k, int(sizes[1]))}"
