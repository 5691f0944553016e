"""Keep the train dataloader's sampler epoch in step on every rank, at every epoch start and on resume."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from composer.core import Callback, DataSpec, State
from composer.loggers import Logger

from composer_dynsample.distributed import all_gather_rows, get_rank, get_world_size
from composer_dynsample.samplers.base import SupportsSetEpoch

__all__ = ["SetSamplerEpoch", "find_epoch_target"]

log = logging.getLogger(__name__)


def find_epoch_target(dataloader: Any) -> SupportsSetEpoch | None:
    """Find what takes the epoch in a dataloader: its batch sampler, the sampler inside it, or its sampler.

    Duck-typed: anything with a ``set_epoch`` method qualifies, not only ``DistributedSampler``. A
    Composer :class:`~composer.core.DataSpec` is unwrapped to its dataloader.

    Args:
        dataloader: A ``DataLoader``, a ``DataSpec`` or any object with ``batch_sampler``/``sampler``.

    Returns:
        The object whose ``set_epoch`` to call, or ``None`` when nothing takes an epoch.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
        >>> data = TensorDataset(torch.arange(8))
        >>> sampler = DistributedSampler(data, num_replicas=1, rank=0)
        >>> find_epoch_target(DataLoader(data, sampler=sampler, batch_size=2)) is sampler
        True
        >>> find_epoch_target(DataLoader(data, batch_size=2)) is None
        True
    """
    if isinstance(dataloader, DataSpec):
        dataloader = dataloader.dataloader
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    candidates = (
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(dataloader, "sampler", None),
    )
    for candidate in candidates:
        if isinstance(candidate, SupportsSetEpoch):
            return candidate
    return None


class SetSamplerEpoch(Callback):
    """Call ``set_epoch`` on the train dataloader's batch sampler (or sampler) at every epoch start and on resume.

    Composer's trainer sets the epoch only on a ``DistributedSampler`` it finds as the dataloader's
    ``batch_sampler`` or ``sampler`` (the batch sampler since v0.21.2). This callback covers the rest:
    any batch sampler or sampler with a ``set_epoch`` method (duck-typed), the sampler inside a plain
    ``BatchSampler``, the dataloader inside a ``DataSpec``, and a run resumed mid-epoch, where
    ``Event.EPOCH_START`` does not fire (it also acts at ``Event.FIT_START``). Setting the same epoch
    twice is harmless, so it runs safely beside Composer's own call.

    At every epoch start on more than one rank it gathers ``(epoch, sampler seed, number of batches)``
    from every rank in one small collective and raises a ``RuntimeError`` naming the ranks that
    disagree; ranks that disagree train on overlapping or mismatched data, or hang. It warns once when a
    multi-rank run's train dataloader has nothing that takes an epoch, and logs the epoch it set as
    ``sampler/epoch``.

    With a ``DataLoader(batch_sampler=...)`` (``batch_size=None``) and no ``device_train_microbatch_size``,
    Composer would fail with a bare ``AssertionError`` at the first batch; at ``FIT_START`` this callback
    raises a ``ValueError`` that says what to set instead (or, with ``infer_microbatch_size=True``, sets
    the microbatch size to the batch sampler's ``batch_size``, Composer's own default for loaders with a
    ``batch_size``).

    Args:
        check_ranks (bool): Check that all ranks agree at every epoch start. Default: ``True``.
        infer_microbatch_size (bool): When the Trainer has no ``device_train_microbatch_size`` and the loader
            reports no ``batch_size``, use the batch sampler's ``batch_size`` instead of raising. Default:
            ``False``.

    Example:
        >>> from composer import Trainer
        >>> from composer_dynsample import SetSamplerEpoch
        >>> trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ep",
        ...                   callbacks=[SetSamplerEpoch()])  # doctest: +SKIP
    """

    def __init__(self, check_ranks: bool = True, infer_microbatch_size: bool = False) -> None:
        self.check_ranks = check_ranks
        self.infer_microbatch_size = infer_microbatch_size
        self._warned_missing = False

    def fit_start(self, state: State, logger: Logger) -> None:
        self._check_microbatch_size(state)
        self._set_epoch(state, logger)

    def epoch_start(self, state: State, logger: Logger) -> None:
        self._set_epoch(state, logger)

    def _set_epoch(self, state: State, logger: Logger) -> None:
        epoch = int(state.timestamp.epoch)
        target = find_epoch_target(state.train_dataloader)
        if target is not None:
            target.set_epoch(epoch)
            logger.log_metrics({"sampler/epoch": epoch})
        elif get_world_size() > 1 and not self._warned_missing:
            self._warned_missing = True
            warnings.warn(
                "SetSamplerEpoch: the train dataloader has no batch_sampler or sampler with set_epoch; on "
                f"{get_world_size()} ranks every epoch repeats the same order. Use a distributed batch "
                "sampler such as composer_dynsample.PKBatchSampler.",
                UserWarning,
                stacklevel=2,
            )
        if self.check_ranks and get_world_size() > 1:
            _check_sampler_world(target)
            _check_ranks_agree(state, epoch, target)

    def _check_microbatch_size(self, state: State) -> None:
        if state.device_train_microbatch_size is not None:
            return
        loader = state.train_dataloader
        if isinstance(loader, DataSpec):
            loader = loader.dataloader
        batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if self.infer_microbatch_size and isinstance(batch_size, int):
            state.device_train_microbatch_size = batch_size
            log.info(
                "SetSamplerEpoch: device_train_microbatch_size set to the batch sampler's batch_size=%d",
                batch_size,
            )
            return
        raise ValueError(
            "The train dataloader reports batch_size=None (a DataLoader built with batch_sampler=...) and the "
            "Trainer has no device_train_microbatch_size, so Composer cannot size its microbatches. Pass "
            f"device_train_microbatch_size={batch_size if isinstance(batch_size, int) else '<per-rank batch size>'} "
            "to the Trainer, build the loader with composer_dynsample.build_dataloader(dataset, batch_sampler), "
            "or use SetSamplerEpoch(infer_microbatch_size=True)."
        )


def _check_sampler_world(target: SupportsSetEpoch | None) -> None:
    """Raise when a sampler was built for another world (say, with ``num_replicas=1`` under the launcher)."""
    num_replicas, rank = getattr(target, "num_replicas", None), getattr(target, "rank", None)
    if num_replicas is None or rank is None:
        return
    if (num_replicas, rank) != (get_world_size(), get_rank()):
        raise ValueError(
            f"SetSamplerEpoch: the train sampler was built with num_replicas={num_replicas}, rank={rank}, but "
            f"this process is rank {get_rank()} of {get_world_size()}; its shard would overlap the other "
            "ranks'. Leave num_replicas and rank unset (they default to the launcher's WORLD_SIZE and RANK)."
        )


def _check_ranks_agree(state: State, epoch: int, target: SupportsSetEpoch | None) -> None:
    """Raise on every rank when the ranks disagree on (epoch, sampler seed, number of batches)."""
    seed = getattr(target, "seed", -1)
    try:
        length = len(target)  # type: ignore[arg-type]
    except TypeError:
        length = -1
    mine = torch.tensor([epoch, int(seed) if isinstance(seed, int) else -1, length], dtype=torch.int64)
    rows = all_gather_rows(state.device.tensor_to_device(mine)).cpu()
    if bool((rows == rows[0]).all()):
        return
    names = ("epoch", "seed", "batches")
    table = "; ".join(
        f"rank {rank}: " + ", ".join(f"{name}={int(value)}" for name, value in zip(names, row))
        for rank, row in enumerate(rows.tolist())
    )
    disagreeing = [rank for rank, row in enumerate(rows) if not bool((row == rows[0]).all())]
    raise RuntimeError(
        f"SetSamplerEpoch: ranks {disagreeing} disagree with rank 0 on the train sampler's (epoch, seed, "
        f"number of batches): {table}. Every rank must build its sampler with the same seed and data, "
        "or ranks train on overlapping data and hang when their batch counts differ."
    )
