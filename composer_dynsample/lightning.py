"""PyTorch Lightning support: keep the batch sampler's epoch in step on every rank, and on resume.

Lightning calls ``set_epoch`` on a train dataloader's ``sampler`` and on ``batch_sampler.sampler``, never
on the batch sampler itself, so with this package's batch samplers (which must run with
``use_distributed_sampler=False``: they shard themselves) every epoch would repeat the first one's
batches. :class:`SetSamplerEpoch` is the Lightning counterpart of the Composer callback
:class:`composer_dynsample.callbacks.SetSamplerEpoch`. This module is the only one that imports
Lightning (the ``[lightning]`` extra).

Example:
    >>> import lightning.pytorch as pl
    >>> from composer_dynsample.lightning import SetSamplerEpoch
    >>> trainer = pl.Trainer(strategy="ddp", max_epochs=3, use_distributed_sampler=False,
    ...                      callbacks=[SetSamplerEpoch()])  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as error:  # the optional extra
    raise ImportError(
        "composer_dynsample.lightning needs PyTorch Lightning: pip install 'composer-dynsample[lightning]'."
    ) from error

from composer_dynsample.samplers.base import (
    DistributedBatchSampler,
    SupportsSetEpoch,
    check_sampler_agreement,
    no_epoch_target_message,
    sampler_world_error,
)
from composer_dynsample.validation import check_bool, is_int

__all__ = ["SetSamplerEpoch"]


class SetSamplerEpoch(pl.Callback):
    """Set the train batch sampler's epoch at every epoch start and on resume; check that the ranks agree.

    At ``on_train_epoch_start`` it calls ``set_epoch(trainer.current_epoch)`` on every train dataloader's
    ``batch_sampler`` if it has one, else on the sampler inside it, else on its ``sampler`` (duck-typed:
    anything with ``set_epoch``). Then, on every rank, it compares the epoch, the seed, the number of
    batches and the hashes of the labels, options and epoch plan of each rank's sampler in one small
    collective, and raises on every rank when they differ or when a sampler was built for another world
    (say, before Lightning started the process group: build the sampler inside ``train_dataloader()``).

    On resume it acts at ``on_train_start``, before the first batch: Lightning creates the train iterator
    before any hook, and with ``num_workers > 0`` that iterator has already drawn its first batches from
    the sampler's previous epoch, so the callback restarts it. A resume from a checkpoint saved at an
    epoch boundary then trains exactly the batches of the uninterrupted run, on any number of ranks. A
    checkpoint saved mid-epoch (``ModelCheckpoint(every_n_train_steps=...)``) records the epoch and the
    batches each rank trained; resumed on the same number of ranks with one train dataloader, a package
    sampler (:class:`~composer_dynsample.samplers.DistributedBatchSampler`) yields the rest of the
    interrupted epoch, each remaining batch once, where Lightning alone would restart the epoch's order.
    A mid-epoch resume on another number of ranks, or with another seed, batch size or number of batches,
    raises a ``ValueError``.

    Args:
        check_ranks (bool): Check that all ranks agree at every epoch start. Default: ``True``.

    Example:
        >>> import lightning.pytorch as pl
        >>> from composer_dynsample.lightning import SetSamplerEpoch
        >>> trainer = pl.Trainer(strategy="ddp", use_distributed_sampler=False,
        ...                      callbacks=[SetSamplerEpoch()])  # doctest: +SKIP
        >>> # model.train_dataloader() returns DataLoader(dataset, batch_sampler=PKBatchSampler(labels, 8, 4))
        >>> trainer.fit(model)  # doctest: +SKIP
    """

    def __init__(self, check_ranks: bool = True) -> None:
        self.check_ranks = check_bool("check_ranks", check_ranks)
        self._trainer: pl.Trainer | None = None
        self._saved: dict[str, Any] = {}
        self._warned_missing = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the batches each rank trained in it and the world size, for a resume."""
        trainer = self._trainer
        if trainer is None:
            return {}
        saved: dict[str, Any] = {
            "world_size": trainer.world_size,
            "epoch": trainer.current_epoch,
            "batches_done": trainer.fit_loop.epoch_loop.batch_progress.current.processed,
        }
        targets = _epoch_targets(trainer.train_dataloader)
        if len(targets) == 1 and isinstance(targets[0], DistributedBatchSampler):
            saved["sampler"] = _sampler_layout(targets[0])
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = dict(state_dict)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        saved, self._saved = self._saved, {}
        targets, changed = self._set_epoch(trainer)
        if len(targets) == 1 and saved:
            changed |= _resume_mid_epoch(trainer, targets[0], saved)
        if changed:  # the iterator Lightning created before this hook may have drawn the old order
            _restart_train_iterators(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._set_epoch(trainer)

    def _set_epoch(self, trainer: pl.Trainer) -> tuple[list[SupportsSetEpoch], bool]:
        """Set the epoch of the train samplers and check the ranks agree; whether some epoch changed."""
        epoch = trainer.current_epoch
        targets = _epoch_targets(trainer.train_dataloader)
        if not targets and trainer.world_size > 1 and not self._warned_missing:
            self._warned_missing = True
            warnings.warn(
                no_epoch_target_message(trainer.world_size),
                UserWarning,
                stacklevel=2,
            )
        changed = any(getattr(target, "epoch", None) != epoch for target in targets)
        for target in targets:
            target.set_epoch(epoch)
            if self.check_ranks:
                check_sampler_agreement(target, epoch, _sampler_world_error(trainer, target))
        return targets, changed


def _epoch_targets(dataloaders: Any) -> list[SupportsSetEpoch]:
    """What takes the epoch in each train dataloader: its batch sampler, the sampler inside it, or its sampler.

    ``trainer.train_dataloader`` is one dataloader, a list, tuple or dict of them, or ``None``.
    """
    if isinstance(dataloaders, Mapping):
        dataloaders = list(dataloaders.values())
    if isinstance(dataloaders, (list, tuple)):
        return [target for loader in dataloaders for target in _epoch_targets(loader)]
    batch_sampler = getattr(dataloaders, "batch_sampler", None)
    for candidate in (
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(dataloaders, "sampler", None),
    ):
        if isinstance(candidate, SupportsSetEpoch):
            return [candidate]
    return []


def _sampler_layout(target: DistributedBatchSampler) -> dict[str, int]:
    """What decides an epoch's global batches besides the data: seed, batch size and batch count."""
    return {"seed": target.seed, "batch_size": target.batch_size, "global_batches": target.num_global_batches}


def _resume_mid_epoch(trainer: pl.Trainer, target: SupportsSetEpoch, saved: Mapping[str, Any]) -> bool:
    """Plan the rest of an epoch interrupted mid-way; whether there was one to plan.

    Lightning resumes such an epoch at the batch after the last one trained (``batch_idx`` goes on) and
    takes ``len(dataloader) - batches_done`` more batches from a new iterator; the sampler yields this
    rank's share of the epoch's global batches not trained yet, exactly that many on the same world size.
    """
    epoch, done = trainer.current_epoch, saved.get("batches_done")
    if saved.get("epoch") != epoch or not isinstance(target, DistributedBatchSampler) or not is_int(done):
        return False
    if not 0 < done < len(target):
        return False
    where = f"the checkpoint was saved in the middle of epoch {epoch} (after batch {done} of {len(target)})"
    world = saved.get("world_size")
    if world != trainer.world_size:
        raise ValueError(
            f"SetSamplerEpoch: {where} on {world} rank(s), and this run has {trainer.world_size}: Lightning "
            "counts the batches trained per rank, so the rest of the epoch cannot be shared out again without "
            f"repeating or skipping samples. Resume on {world} rank(s), or from a checkpoint saved at an epoch "
            "boundary (ModelCheckpoint(every_n_epochs=1))."
        )
    layout, now = saved.get("sampler"), _sampler_layout(target)
    if layout is not None and dict(layout) != now:
        changes = ", ".join(
            f"{key} {layout.get(key)} -> {value}" for key, value in now.items() if layout.get(key) != value
        )
        raise ValueError(
            f"SetSamplerEpoch: {where}, and this run's train sampler builds that epoch differently ({changes}), "
            "so the rest of it cannot be trained without repeating or skipping samples. Resume with the "
            "sampler settings of the checkpoint, or from a checkpoint saved at an epoch boundary."
        )
    target.resume_epoch(epoch, int(done) * int(world), 0)
    return True


def _restart_train_iterators(trainer: pl.Trainer) -> None:
    """Make Lightning's train iterator draw again from the samplers as they are now.

    Lightning creates it before the first hook of a fit, and a ``DataLoader`` with worker processes draws
    its first batches at creation, from the sampler's previous epoch (Lightning issue 21938). Lightning
    keeps no public handle on it: ``fit_loop._combined_loader`` is the loader its fetcher iterates.
    """
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    if combined is None or not callable(getattr(combined, "reset", None)):
        warnings.warn(
            "SetSamplerEpoch: this Lightning version keeps the train iterator where the callback cannot restart "
            "it; with num_workers > 0 the first epoch after a resume may repeat another epoch's order.",
            UserWarning,
            stacklevel=3,
        )
        return
    combined.reset()  # shuts down workers holding batches of the old order
    iter(combined)


def _sampler_world_error(trainer: pl.Trainer, target: SupportsSetEpoch) -> str | None:
    """Why a sampler was built for another world (say, before Lightning started the process group)."""
    return sampler_world_error(
        target,
        trainer.world_size,
        trainer.global_rank,
        "Build the sampler inside train_dataloader() (of the LightningModule or LightningDataModule), where "
        "Lightning has started the process group, or pass num_replicas=trainer.world_size, "
        "rank=trainer.global_rank.",
    )
