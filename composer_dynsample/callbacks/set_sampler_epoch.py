"""Keep the train dataloader's sampler epoch in step on every rank, at every epoch start and on resume.

:class:`SetSamplerEpoch` sets the epoch and checks that the ranks agree; it composes the two other units a
user would otherwise add beside it: :class:`~composer_dynsample.callbacks.elastic_resume.ElasticResume` (a
mid-epoch resume on another number of ranks) and the loader's wiring checks of
:mod:`composer_dynsample.samplers.wiring`.
"""

from __future__ import annotations

import warnings
from typing import Any

from composer.core import Callback, State
from composer.loggers import Logger

from composer_dynsample.callbacks.elastic_resume import ElasticResume
from composer_dynsample.distributed import get_rank, get_world_size
from composer_dynsample.samplers.base import (
    SupportsSetEpoch,
    check_sampler_agreement,
    no_epoch_target_message,
    sampler_world_error,
)
from composer_dynsample.samplers.wiring import (
    check_dataset_length,
    check_microbatch_size,
    check_train_loader,
    dataset_length,
    find_epoch_target,
)
from composer_dynsample.validation import check_bool

__all__ = ["SetSamplerEpoch", "find_epoch_target"]


class SetSamplerEpoch(Callback):
    """Keep the train sampler's epoch in step on every rank, check that the ranks agree, and guard resumes.

    Composer's trainer already calls ``set_epoch`` on a ``DistributedSampler`` it finds as the train
    dataloader's ``sampler`` or ``batch_sampler`` (the batch sampler since v0.21.2), which covers this
    package's batch samplers (:class:`~composer_dynsample.samplers.DistributedBatchSampler` subclasses).
    For them this callback's value is the all-rank agreement check and the resume guard; for everything
    else it sets the epoch itself: any batch sampler or sampler with a ``set_epoch`` method (duck-typed),
    the sampler inside a plain ``BatchSampler``, the dataloader inside a ``DataSpec``, and a run resumed
    mid-epoch, where ``Event.EPOCH_START`` does not fire (it also acts at ``Event.FIT_START``). Setting the
    same epoch twice is harmless, so it runs safely beside Composer's own call.

    At fit start and every epoch start on more than one rank the ranks compare, in one small collective,
    what defines the epoch: its number, the sampler's seed and number of batches and, for a
    :class:`~composer_dynsample.samplers.DistributedBatchSampler`, hashes of its labels, of its type and
    options and of the epoch's global batches (its plan, which a model-aware sampler builds from its
    snapshot), and a model-aware sampler's snapshot. When they differ every rank raises the same one-line
    :class:`~composer_dynsample.distributed.RankMismatchError` (a ``ValueError`` and a ``RuntimeError``)
    naming what differs (labels, options with their values, plan, seed...) and the ranks; ranks that
    disagree train on overlapping or mismatched data, or hang. A rank whose sampler was built for another
    world says so in the same collective, so every rank raises and none waits. The plan costs one more
    ``global_batches`` per epoch. It warns once when a multi-rank run's train dataloader has nothing that
    takes an epoch, and logs the epoch it set as ``sampler/epoch``.

    It saves the world size and how many of the epoch's global batches were trained in the checkpoint,
    and resumes elastically: a run resumed mid-epoch on another number of ranks trains each remaining
    global batch of the interrupted epoch exactly once (rank ``r`` of ``W`` takes remaining batches ``r,
    r + W, ...``; a remainder smaller than ``W`` follows the sampler's ``drop_last``: dropped, or padded
    from the epoch's start), and the following epochs are the normal ones. Composer discards the first
    ``timestamp.batch_in_epoch`` batches of each rank on resume, counted in the old world's per-rank
    batches, so the sampler yields that many one-index placeholders first and the trainer's
    ``dataloader_len`` covers them for that epoch. This needs Composer's default
    ``spin_dataloaders=True`` and a :class:`~composer_dynsample.samplers.DistributedBatchSampler`
    without ``train_subset_num_batches``; any other sampler resumed mid-epoch on another number of ranks
    gets a ``ValueError`` naming both world sizes, and so does ``spin_dataloaders=False``, at the first
    batch (before any training step), since a callback cannot read that setting before. The checkpoint
    also records the sampler's seed, batch size, number of batches and the hashes of its labels and of the
    epoch's plan; a mid-epoch resume with other values (on any number of ranks) builds another epoch and is
    refused with a ``ValueError``. A resume
    at an epoch boundary is exact on any number of ranks.

    Wiring mistakes are refused where they can first be known, each in one line naming the fix
    (:mod:`composer_dynsample.samplers.wiring`): at ``FIT_START`` a batch sampler given as ``sampler=`` and a
    sampler built on more labels than the dataset has samples; at every
    ``EPOCH_START`` a dataset whose length changed since the fit started (its sampler would draw past its
    end, or never draw its new samples); and at a mid-epoch resume a checkpoint whose epoch had other
    labels or another plan (other data of the same batch count), as the command line refuses other data.
    Microbatches (``device_train_microbatch_size``) that cut every P x K batch into single classes are left
    to Composer: a classifier trains on them. What loses its negatives there refuses them itself:
    :class:`~composer_dynsample.HardNegativeMining` and an :class:`~composer_dynsample.EmbeddingTable` that
    feeds a sampler.

    With a ``DataLoader(batch_sampler=...)`` (``batch_size=None``) and no ``device_train_microbatch_size``,
    Composer would fail with a bare ``AssertionError`` at the first batch; at ``FIT_START`` this callback
    raises a ``ValueError`` that says what to set instead (:func:`~composer_dynsample.build_dataloader`
    builds a loader that needs nothing).

    Args:
        check_ranks (bool): Check that all ranks agree at fit start and every epoch start. Default: ``True``.

    Example:
        >>> from composer import Trainer
        >>> from composer_dynsample import SetSamplerEpoch
        >>> trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ep",
        ...                   callbacks=[SetSamplerEpoch()])  # doctest: +SKIP
    """

    def __init__(self, check_ranks: bool = True) -> None:
        self.check_ranks = check_bool("check_ranks", check_ranks)
        self._warned_missing = False
        self._resume = ElasticResume()
        self._dataset_length: int | None = None  # at FIT_START: an epoch over another length is refused

    def fit_start(self, state: State, logger: Logger) -> None:
        check_microbatch_size(state.train_dataloader, state.device_train_microbatch_size)
        check_train_loader(state.train_dataloader)
        self._dataset_length = dataset_length(state.train_dataloader)
        self._resume.fit_start(state)
        self._set_epoch(state, logger)

    def state_dict(self) -> dict[str, Any]:
        """The world size and how many of the current epoch's global batches are trained, for a resume."""
        return self._resume.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume.load_state_dict(state)

    def after_dataloader(self, state: State, logger: Logger) -> None:
        self._resume.after_dataloader(state)

    def epoch_start(self, state: State, logger: Logger) -> None:
        check_dataset_length(state.train_dataloader, self._dataset_length, int(state.timestamp.epoch))
        self._set_epoch(state, logger)
        self._resume.epoch_start(state)

    def _set_epoch(self, state: State, logger: Logger) -> None:
        epoch = int(state.timestamp.epoch)
        target = find_epoch_target(state.train_dataloader)
        if target is not None:
            target.set_epoch(epoch)
            logger.log_metrics({"sampler/epoch": epoch})
        elif get_world_size() > 1 and not self._warned_missing:
            self._warned_missing = True
            warnings.warn(
                no_epoch_target_message(get_world_size()),
                UserWarning,
                stacklevel=2,
            )
        if self.check_ranks and get_world_size() > 1:
            check_sampler_agreement(target, epoch, _sampler_world_error(target))


def _sampler_world_error(target: SupportsSetEpoch | None) -> str | None:
    """Why a sampler was built for another world (say, ``num_replicas=1`` under the launcher), or ``None``."""
    return sampler_world_error(
        target,
        get_world_size(),
        get_rank(),
        "Leave num_replicas and rank unset (they default to the launcher's WORLD_SIZE and RANK).",
    )
