"""The base for distributed batch samplers whose order is a pure function of (seed, epoch, rank).

Composer accepts a map-style ``DataLoader`` on more than one rank only when its ``sampler`` or its
``batch_sampler`` is a :class:`torch.utils.data.DistributedSampler`, and for such a ``batch_sampler``
the trainer calls ``set_epoch`` itself (Composer >= 0.21.2). :class:`DistributedBatchSampler` is that
kind of object: a ``DistributedSampler`` subclass that yields lists of indices.

Sharding is by whole batches: the epoch's global batch sequence is built from ``(seed, epoch)`` alone,
and rank ``r`` of ``W`` takes global batches ``r, r + W, r + 2W, ...``. Every rank therefore yields the
same number of batches, shards are disjoint, and two ranks never have to agree on anything but the seed
and the epoch.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol, TypedDict, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler

from composer_dynsample.distributed import check_ranks_agree, get_rank, get_world_size, stable_hash
from composer_dynsample.validation import as_labels, check_bool, check_int, is_int

__all__ = [
    "AGREEMENT_KEYS",
    "DistributedBatchSampler",
    "ShardKeywords",
    "SupportsSetEpoch",
    "agreement_values",
    "check_sampler_agreement",
    "class_positions",
    "epoch_rng",
    "no_epoch_target_message",
    "sampler_world_error",
]


@runtime_checkable
class SupportsSetEpoch(Protocol):
    """Anything whose order depends on the epoch: samplers and batch samplers with ``set_epoch``."""

    def set_epoch(self, epoch: int) -> None: ...


def epoch_rng(seed: int, epoch: int, stream: int = 0) -> np.random.Generator:
    """Return the random generator of one epoch, a pure function of its arguments.

    ``numpy``'s ``SeedSequence`` hashes the whole entropy list, so ``(seed, epoch)`` pairs never alias
    the way ``seed + epoch`` does (seed 1 epoch 0 and seed 0 epoch 1 give unrelated streams).

    Args:
        seed (int): The sampler's seed.
        epoch (int): The epoch.
        stream (int): Separates independent random streams of the same epoch. Default: ``0``.

    Example:
        >>> a = epoch_rng(0, 3).permutation(5)
        >>> b = epoch_rng(0, 3).permutation(5)
        >>> bool((a == b).all())
        True
    """
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), int(stream)])


def _resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill ``num_replicas``/``rank`` from the process group or the launcher's environment, else ``(1, 0)``."""
    world = check_int("num_replicas", get_world_size() if num_replicas is None else num_replicas, minimum=1)
    rank = check_int("rank", get_rank() if rank is None else rank, minimum=0, maximum=world - 1)
    return world, rank  # type: ignore[return-value]


def as_index_array(name: str, values: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """Convert 1-D integer input (list, array or tensor) to an int64 numpy array, or raise a clear error."""
    return as_labels(name, values)  # type: ignore[return-value]


def class_positions(classes: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each label's position in the sorted ``classes`` (a sampler's ``classes``: what class centroids are
    indexed by), as int64, and the labels that are none of ``classes`` (sorted, each once).

    Example:
        >>> positions, unknown = class_positions(np.array([3, 7, 9]), np.array([9, 3, 5, 7]))
        >>> positions.tolist(), unknown.tolist()
        ([2, 0, 1, 1], [5])
    """
    classes, labels = np.asarray(classes), np.asarray(labels)
    positions = np.searchsorted(classes, labels).clip(max=max(classes.size - 1, 0))
    found = classes[positions] == labels if classes.size else np.zeros(labels.shape, dtype=bool)
    return positions.astype(np.int64), np.unique(labels[~found])


class _Sized:
    """Stands in for the dataset ``DistributedSampler.__init__`` wants; only its length is used."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class ShardKeywords(TypedDict, total=False):
    """The keywords a batch sampler hands to :class:`DistributedBatchSampler` as they are (its ``**options:
    Unpack[ShardKeywords]``, PEP 692): ``num_replicas``, ``rank``, ``seed`` and ``drop_last``, their meaning
    and defaults as there."""

    num_replicas: int | None
    rank: int | None
    seed: int
    drop_last: bool


class ResumePlan(NamedTuple):
    """An epoch resumed part-way: its first ``done`` global batches are trained, ``skip`` batches are discarded."""

    epoch: int
    done: int
    skip: int


class DistributedBatchSampler(DistributedSampler, abc.ABC):
    """A ``DistributedSampler`` that yields lists of indices: one rank's share of the epoch's batches.

    Subclasses implement :meth:`global_batches`, the epoch's batch sequence as a 2-D array (one row a
    batch), a pure function of ``(seed, epoch)``; the number of rows must not depend on the epoch. This
    class shards the rows by rank, evens out the count across ranks and implements the sampler contract
    that Composer, PyTorch and Lightning expect: ``batch_size``, ``__len__``, ``set_epoch``, ``epoch``,
    ``seed``, ``num_replicas`` and ``rank``.

    Args:
        num_indices (int): The number of dataset indices the sampler draws from (``len(dataset)``).
        batch_size (int): The number of indices in every batch.
        num_replicas (int, optional): The number of ranks. Default: the default process group's world
            size, else the launcher's ``WORLD_SIZE`` (so a sampler built before the Trainer initialises
            the process group is right), else ``1``.
        rank (int, optional): This process's rank. Default: the process group's rank, else ``RANK``, else ``0``.
        seed (int): The seed of every epoch's order; identical on every rank. Default: ``0``.
        drop_last (bool): When the number of global batches is not a multiple of ``num_replicas``,
            ``True`` drops the last few so every rank gets ``n // W`` batches and shards stay disjoint;
            ``False`` pads by repeating batches from the start of the epoch so every rank gets
            ``ceil(n / W)`` and no batch is lost. Default: ``True``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> DistributedBatchSampler:
        # PyTorch Lightning (use_distributed_sampler=True, its default) rebuilds a batch sampler as
        # cls(DistributedSampler, batch_size=..., drop_last=...); Python's own error would only say
        # "unexpected keyword argument 'batch_size'".
        if args and isinstance(args[0], Sampler) and "batch_size" in kwargs:
            raise TypeError(
                f"{cls.__name__} cannot be rebuilt around a {type(args[0]).__name__}: PyTorch Lightning does "
                "that to inject a DistributedSampler when use_distributed_sampler=True (the default), but "
                f"{cls.__name__} shards its batches by rank itself. Pass use_distributed_sampler=False to "
                "lightning.pytorch.Trainer (or to Fabric.setup_dataloaders) and add "
                "composer_dynsample.lightning.SetSamplerEpoch() to the Trainer's callbacks."
            )
        return super().__new__(cls)

    def __init__(
        self,
        num_indices: int,
        batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        num_replicas, rank = _resolve_world(num_replicas, rank)
        seed = check_int("seed", seed)
        super().__init__(
            _Sized(num_indices),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=True,
            seed=int(seed),
            drop_last=check_bool("drop_last", drop_last),
        )
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_indices = num_indices
        self._resume: ResumePlan | None = None
        self._labels_hash: int | None = None

    @property
    @abc.abstractmethod
    def num_global_batches(self) -> int:
        """The number of batches in one epoch over all ranks (the same for every epoch)."""

    @abc.abstractmethod
    def global_batches(self, epoch: int) -> np.ndarray:
        """The epoch's batches over all ranks: an int64 array of shape ``(num_global_batches, batch_size)``."""

    def _check_enough_batches(self) -> None:
        """Raise when the epoch has fewer batches than ranks (some rank would get none).

        Subclasses call it last in their constructor: it also hashes the labels, now that they are in place.
        """
        self._labels_hash = self._hash_labels()
        if self.drop_last and self.num_global_batches < self.num_replicas:
            raise ValueError(
                f"An epoch has {self.num_global_batches} batches of {self.batch_size} indices, fewer than "
                f"num_replicas={self.num_replicas}: with drop_last=True some rank would get no batch. "
                "Use more data, smaller batches, fewer ranks or drop_last=False."
            )
        if self.num_global_batches < 1:
            raise ValueError(
                f"An epoch has no batch of {self.batch_size} indices: use more data or smaller batches."
            )

    def options(self) -> dict[str, object]:
        """The sampler's type and settings: what, besides the labels and the epoch, decides its batches.

        Every public attribute that holds a number, a string, a boolean or ``None`` (the constructor's
        options, such as ``classes_per_batch``, ``seed`` and ``drop_last``), except ``rank`` and ``epoch``,
        and ``"type"``, the class's qualified name. Ranks that build one run's sampler have equal options.

        Example:
            >>> from composer_dynsample import PKBatchSampler
            >>> options = PKBatchSampler([0, 0, 1, 1], classes_per_batch=2, samples_per_class=2).options()
            >>> options["type"], options["classes_per_batch"], options["seed"]
            ('composer_dynsample.samplers.pk.PKBatchSampler', 2, 0)
        """
        settings: dict[str, object] = {"type": f"{type(self).__module__}.{type(self).__qualname__}"}
        for name, value in sorted(vars(self).items()):
            scalar = value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating))
            if scalar and not name.startswith("_") and name not in ("rank", "epoch"):
                settings[name] = value
        return settings

    def fingerprints(self, epoch: int | None = None) -> dict[str, str]:
        """Hashes (16 hex digits) of what defines an epoch's batches: equal on ranks that train the same epoch.

        ``"labels"``: the data the sampler draws from, hashed once when it is built (the arrays it holds
        then that have one entry per dataset index, such as each index's label, and its public arrays,
        such as the classes or the index streams). ``"options"``: :meth:`options`. ``"plan"``: the
        epoch's global batches, :meth:`global_batches` (default: the current epoch), which a model-aware
        sampler builds from its snapshot too. Computing the plan costs one :meth:`global_batches`.

        Example:
            >>> from composer_dynsample import PKBatchSampler
            >>> first, second = (PKBatchSampler([0, 0, 1, 1] * 2, 2, 2, seed=s) for s in (0, 1))
            >>> first.fingerprints(0)["labels"] == second.fingerprints(0)["labels"]
            True
            >>> first.fingerprints(0)["plan"] == second.fingerprints(0)["plan"]
            False
        """
        hashes = {
            "labels": self.labels_hash(),
            "options": stable_hash(repr(sorted(self.options().items()))),
            "plan": stable_hash(self.global_batches(self.epoch if epoch is None else epoch)),
        }
        return {name: f"{value:016x}" for name, value in hashes.items()}

    def labels_hash(self) -> int:
        """The hash of the data the sampler draws from (:meth:`fingerprints`' ``"labels"``), computed once."""
        if self._labels_hash is None:  # a subclass that does not call _check_enough_batches
            self._labels_hash = self._hash_labels()
        return self._labels_hash

    def _hash_labels(self) -> int:
        """The hash of the arrays held now with one entry per dataset index, and of the public arrays."""
        arrays = [
            (name, value)
            for name, value in sorted(vars(self).items())
            if isinstance(value, np.ndarray)
            and value.ndim >= 1
            and (value.shape[0] == self.num_indices or not name.startswith("_"))
        ]
        return stable_hash([part for name, value in arrays for part in (name, value)])

    def __len__(self) -> int:
        """The number of batches this rank yields per epoch; identical on every rank.

        In an epoch planned by :meth:`resume_epoch`: the batches to skip plus this rank's share of the rest.
        """
        plan = self._active_resume()
        if plan is None:
            return self._per_rank(self.num_global_batches)
        return plan.skip + self._per_rank(max(self.num_global_batches - plan.done, 0))

    def _per_rank(self, total: int) -> int:
        """The number of batches each rank gets out of ``total`` global batches, by the ``drop_last`` rule."""
        return total // self.num_replicas if self.drop_last else -(-total // self.num_replicas)

    def resume_epoch(self, epoch: int, global_batches_done: int, batches_to_skip: int) -> None:
        """Plan an epoch resumed part-way, possibly on another number of ranks than it started on.

        The epoch's global batch sequence depends on ``(seed, epoch)`` only, so what was trained before
        the interruption is its first ``global_batches_done`` batches, whatever the world size was. In
        ``epoch`` this sampler then yields ``batches_to_skip`` one-index placeholder batches (the ones
        the trainer discards on resume, Composer's ``timestamp.batch_in_epoch``), followed by this rank's
        share of the remaining global batches: rank ``r`` of ``W`` takes remaining batches
        ``r, r + W, ...``, and ``drop_last`` decides what happens to a remainder smaller than ``W``
        (dropped, or padded with batches from the start of the epoch). Other epochs are unaffected.

        Args:
            epoch (int): The interrupted epoch.
            global_batches_done (int): How many of the epoch's global batches were trained already.
            batches_to_skip (int): How many batches the trainer discards before training on this rank.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        done = check_int("global_batches_done", global_batches_done, minimum=0)
        skip = check_int("batches_to_skip", batches_to_skip, minimum=0)
        self._resume = ResumePlan(epoch, done, skip)

    def _active_resume(self) -> ResumePlan | None:
        plan = self._resume
        return plan if plan is not None and plan.epoch == self.epoch else None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose order the next iteration yields. Calling it twice with one epoch is harmless."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    def rank_batches(self, epoch: int | None = None) -> np.ndarray:
        """This rank's batches of an epoch (default: the current one) as a ``(len(self), batch_size)`` array."""
        epoch = self.epoch if epoch is None else epoch
        batches = self.global_batches(epoch)
        if batches.shape[0] != self.num_global_batches:  # a subclass bug, not a user error
            raise RuntimeError(
                f"{type(self).__name__}.global_batches returned {batches.shape[0]} batches, "
                f"expected {self.num_global_batches}."
            )
        return self._shard(batches, 0, self._per_rank(batches.shape[0]))

    def _shard(self, batches: np.ndarray, start: int, per_rank: int) -> np.ndarray:
        """This rank's ``per_rank`` batches of ``batches[start:]``, padded from the epoch's start if short."""
        needed = per_rank * self.num_replicas
        rest = batches[start:]
        if needed > rest.shape[0]:
            # Pad by wrapping around, as DistributedSampler(drop_last=False) does.
            repeats = -(-(needed - rest.shape[0]) // batches.shape[0])
            rest = np.concatenate([rest] + [batches] * repeats, axis=0)
        return rest[self.rank : needed : self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        plan = self._active_resume()
        if plan is None:
            yield from self.rank_batches().tolist()
            return
        batches = self.global_batches(self.epoch)
        placeholder = [int(batches[0, 0])]  # loaded and discarded by the trainer: one index is enough
        for _ in range(plan.skip):
            yield placeholder
        yield from self._shard(batches, plan.done, len(self) - plan.skip).tolist()

    def _warn_overlap(self, message: str) -> None:
        warnings.warn(message, UserWarning, stacklevel=3)


#: What every rank's train sampler must agree on at an epoch, in the order the ranks compare them.
AGREEMENT_KEYS = ("epoch", "seed", "batches", "labels", "options", "plan", "snapshot")


def agreement_values(target: SupportsSetEpoch | None, epoch: int) -> dict[str, object]:
    """What every rank's train sampler must agree on at ``epoch``; the same keys for every sampler.

    The epoch, the seed and the number of batches of any sampler; a package sampler adds the hashes of
    its labels, its type and options, and the epoch's global batches (:meth:`DistributedBatchSampler.
    fingerprints`); a model-aware sampler its snapshot (``snapshot_fingerprint``), which the plan also
    reflects. The Composer and the Lightning ``SetSamplerEpoch`` compare these across ranks.
    """
    seed = getattr(target, "seed", -1)
    try:
        length = len(target)  # type: ignore[arg-type]
    except TypeError:
        length = -1
    fingerprint = getattr(target, "snapshot_fingerprint", None)
    hashes = target.fingerprints(epoch) if isinstance(target, DistributedBatchSampler) else {}
    values = {
        "epoch": epoch,
        "seed": int(seed) if is_int(seed) else -1,
        "batches": length,
        "labels": hashes.get("labels", ""),
        "options": hashes.get("options", ""),
        "plan": hashes.get("plan", ""),
        "snapshot": str(fingerprint()) if callable(fingerprint) else "",
    }
    return {key: values[key] for key in AGREEMENT_KEYS}


def sampler_world_error(
    target: SupportsSetEpoch | None, world_size: int, rank: int, advice: str
) -> str | None:
    """Why ``target`` was built for another world than ``rank`` of ``world_size``, or ``None``."""
    num_replicas, built_rank = getattr(target, "num_replicas", None), getattr(target, "rank", None)
    if num_replicas is None or built_rank is None or (num_replicas, built_rank) == (world_size, rank):
        return None
    return (
        f"its train sampler was built with num_replicas={num_replicas}, rank={built_rank}, but it is rank "
        f"{rank} of {world_size}, so its shard would overlap the other ranks'. {advice}"
    )


def no_epoch_target_message(world_size: int) -> str:
    """The warning of a ``SetSamplerEpoch`` whose train dataloader holds nothing with ``set_epoch``."""
    return (
        "SetSamplerEpoch: the train dataloader has no batch_sampler or sampler with set_epoch; on "
        f"{world_size} ranks every epoch repeats the same order. Use a distributed batch "
        "sampler such as composer_dynsample.PKBatchSampler."
    )


def check_sampler_agreement(target: SupportsSetEpoch | None, epoch: int, world_error: str | None) -> None:
    """Raise the same error on every rank when the ranks' train samplers build different epochs.

    The ranks compare :func:`agreement_values` (the epoch, the seed, the number of batches, the hashes of
    the labels, of the sampler's type and options and of the epoch's plan, and a model-aware sampler's
    snapshot) in one gather: a rank whose sampler is wrong on its own (``world_error``, from
    :func:`sampler_world_error`, or a sampler failing to build the plan) says so in the same gather, so
    every rank raises and none waits for the others. The Composer and the Lightning ``SetSamplerEpoch``
    call it at every epoch start.

    Args:
        target (SupportsSetEpoch, optional): This rank's train sampler.
        epoch (int): The epoch starting.
        world_error (str, optional): Why ``target`` was built for another world, or ``None``.
    """
    local_error = world_error
    values: dict[str, object] = dict.fromkeys(AGREEMENT_KEYS, "")
    if local_error is None:
        try:
            values = agreement_values(target, epoch)
        except (ValueError, RuntimeError, TypeError) as error:
            local_error = f"its train sampler failed to build epoch {epoch}: {type(error).__name__}: {error}"
    check_ranks_agree(
        values,
        subject=f"SetSamplerEpoch, epoch {epoch}",
        on="the train sampler's ",
        advice="Every rank must build its train sampler from the same labels, with the same type, seed and "
        "options, or the ranks train on overlapping data and hang when their batch counts differ.",
        details=target.options if isinstance(target, DistributedBatchSampler) else None,
        local_error=local_error,
    )
