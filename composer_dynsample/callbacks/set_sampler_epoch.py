"""Keep the train dataloader's sampler epoch in step on every rank, at every epoch start and on resume."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from composer.core import Callback, DataSpec, State
from composer.loggers import Logger

from composer_dynsample.batches import batch_rows
from composer_dynsample.distributed import get_rank, get_world_size
from composer_dynsample.samplers.base import (
    DistributedBatchSampler,
    ResumePlan,
    SupportsSetEpoch,
    check_sampler_agreement,
    no_epoch_target_message,
    sampler_world_error,
)
from composer_dynsample.samplers.wiring import (
    check_dataset_length,
    check_train_loader,
    dataset_length,
    find_epoch_target,
)
from composer_dynsample.validation import check_bool, is_int

__all__ = ["SetSamplerEpoch", "find_epoch_target"]

log = logging.getLogger(__name__)


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
        self._saved: dict[str, Any] = {}
        self._state: State | None = None
        self._resumed: ResumePlan | None = None
        self._check_first_batch = 0  # after an elastic resume: the batch size a real first batch has
        self._dataset_length: int | None = None  # at FIT_START: an epoch over another length is refused

    def fit_start(self, state: State, logger: Logger) -> None:
        self._state = state
        self._check_microbatch_size(state)
        check_train_loader(state.train_dataloader)
        self._dataset_length = dataset_length(state.train_dataloader)
        self._resume_elastically(state)
        self._set_epoch(state, logger)

    def state_dict(self) -> dict[str, Any]:
        """The world size and how many of the current epoch's global batches are trained, for a resume."""
        saved: dict[str, Any] = {"world_size": get_world_size()}
        if self._state is not None:
            epoch, batch = int(self._state.timestamp.epoch), int(self._state.timestamp.batch_in_epoch)
            saved.update(epoch=epoch, global_batches_done=self._global_batches_done(epoch, batch))
            layout = _sampler_layout(find_epoch_target(self._state.train_dataloader), epoch)
            if layout is not None:
                saved["sampler"] = layout
        return saved

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved = dict(state)

    def _global_batches_done(self, epoch: int, batch_in_epoch: int) -> int:
        """The number of the epoch's global batches trained when this rank is at ``batch_in_epoch``."""
        plan = self._resumed
        if plan is not None and plan.epoch == epoch:  # the first plan.skip batches were placeholders
            return plan.done + (batch_in_epoch - plan.skip) * get_world_size()
        return batch_in_epoch * get_world_size()

    def _resume_elastically(self, state: State) -> None:
        """Resume an epoch interrupted on another number of ranks without repeating or skipping a sample.

        Composer discards the first ``batch_in_epoch`` batches each rank yields on resume; that is exact
        only when the checkpoint's world size is this run's. Otherwise the sampler is told which of the
        epoch's global batches are trained and yields ``batch_in_epoch`` placeholders for the trainer to
        discard, then this rank's share of the rest.
        """
        epoch, skip = int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch)
        saved_world = self._saved.get("world_size")
        if saved_world is None or skip == 0:
            return
        self._check_same_sampler(state, epoch, skip)
        done = self._saved.get("global_batches_done") if self._saved.get("epoch") == epoch else None
        done = skip * int(saved_world) if done is None else int(done)
        if done == skip * get_world_size():  # Composer's own skip is exact
            return
        target = find_epoch_target(state.train_dataloader)
        if not isinstance(target, DistributedBatchSampler):
            reason = f"the train dataloader's sampler is a {type(target).__name__}"
        elif state.dataloader_len is not None and int(state.dataloader_len) != len(target):
            reason = f"train_subset_num_batches={int(state.dataloader_len)} cuts the epoch"
        else:
            reason = None
        if reason is not None:
            raise ValueError(
                f"SetSamplerEpoch: the checkpoint was written by {saved_world} rank(s) in the middle of epoch "
                f"{epoch} (batch {skip} of the epoch), and this run has {get_world_size()} rank(s): only a "
                "composer_dynsample DistributedBatchSampler over whole epochs can resume it without repeating "
                f"or skipping samples, and {reason}. Resume on {saved_world} rank(s), or from a checkpoint "
                "saved at an epoch boundary (save_interval in epochs)."
            )
        target.set_epoch(epoch)
        target.resume_epoch(epoch, done, skip)
        self._resumed = ResumePlan(epoch, done, skip)
        self._check_first_batch = target.batch_size
        state.dataloader_len = -1  # -1: Composer reads len(dataloader) again, now with the placeholders
        log.info(
            "SetSamplerEpoch: epoch %d resumed on %d rank(s) after %d of its global batches on %d rank(s)",
            epoch,
            get_world_size(),
            done,
            saved_world,
        )

    def _check_same_sampler(self, state: State, epoch: int, skip: int) -> None:
        """Refuse a mid-epoch resume whose sampler builds another epoch than the one interrupted."""
        saved = self._saved.get("sampler")
        now = _sampler_layout(find_epoch_target(state.train_dataloader), epoch)
        if saved is None or now is None or self._saved.get("epoch") != epoch:
            return
        differs = [key for key, value in now.items() if key in saved and saved[key] != value]
        if not differs:
            return
        if any(key in _LAYOUT_NUMBERS for key in differs) and "plan" in differs:
            differs.remove("plan")  # another batch size or seed builds another plan: said by the numbers
        described = ", ".join(
            f"{key} {saved[key]} -> {now[key]}" if key in _LAYOUT_NUMBERS else _LAYOUT_HASHES[key]
            for key in differs
        )
        raise ValueError(
            f"SetSamplerEpoch: the checkpoint was written in the middle of epoch {epoch} (batch {skip}), and this "
            f"run's train sampler builds that epoch differently ({described}), so the rest of it cannot be "
            "trained without repeating or skipping samples. Resume with the sampler settings of the "
            "checkpoint, or from a checkpoint saved at an epoch boundary (save_interval in epochs)."
        )

    def after_dataloader(self, state: State, logger: Logger) -> None:
        """After an elastic resume, refuse to train a placeholder: Composer did not discard them."""
        size, self._check_first_batch = self._check_first_batch, 0
        plan = self._resumed  # set with _check_first_batch
        if size > 1 and plan is not None and batch_rows(state) == 1:
            raise ValueError(
                f"SetSamplerEpoch: epoch {plan.epoch} was resumed mid-way on {get_world_size()} "
                f"rank(s) from a checkpoint of {self._saved.get('world_size')} rank(s), and the trainer is "
                f"about to train the first of the {plan.skip} one-index placeholder batches "
                "it should discard. This resume needs Composer's spin_dataloaders=True (the default) and no "
                "'train' entry in state.dataset_resumption. Resume with spin_dataloaders=True, on "
                f"{self._saved.get('world_size')} rank(s), or from a checkpoint saved at an epoch boundary."
            )

    def epoch_start(self, state: State, logger: Logger) -> None:
        check_dataset_length(state.train_dataloader, self._dataset_length, int(state.timestamp.epoch))
        self._set_epoch(state, logger)
        if self._resumed is not None and self._resumed.epoch != int(state.timestamp.epoch):
            self._resumed = None
            state.dataloader_len = -1  # the epoch's full length again

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

    def _check_microbatch_size(self, state: State) -> None:
        if state.device_train_microbatch_size is not None:
            return
        loader = state.train_dataloader
        if isinstance(loader, DataSpec):
            loader = loader.dataloader
        batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        raise ValueError(
            "The train dataloader reports batch_size=None (a DataLoader built with batch_sampler=...) and the "
            "Trainer has no device_train_microbatch_size, so Composer cannot size its microbatches. Build the "
            "loader with composer_dynsample.build_dataloader(dataset, batch_sampler), or pass "
            f"device_train_microbatch_size={batch_size if is_int(batch_size) else '<per-rank batch size>'} "
            "to the Trainer."
        )


def _sampler_world_error(target: SupportsSetEpoch | None) -> str | None:
    """Why a sampler was built for another world (say, ``num_replicas=1`` under the launcher), or ``None``."""
    return sampler_world_error(
        target,
        get_world_size(),
        get_rank(),
        "Leave num_replicas and rank unset (they default to the launcher's WORLD_SIZE and RANK).",
    )


_LAYOUT_NUMBERS = ("seed", "batch_size", "global_batches")
#: The hashes of an epoch's layout, and what a difference means.
_LAYOUT_HASHES = {
    "labels": "the sampler's labels differ (other data)",
    "plan": "the epoch's global batches differ (other data or options)",
}


def _sampler_layout(target: SupportsSetEpoch | None, epoch: int) -> dict[str, Any] | None:
    """What decides an epoch's global batches of a package sampler: seed, batch size, batch count, and the
    hashes of its labels and of the epoch's plan (a resume on other data of the same batch count)."""
    if not isinstance(target, DistributedBatchSampler):
        return None
    hashes = target.fingerprints(epoch)
    return {
        "seed": target.seed,
        "batch_size": target.batch_size,
        "global_batches": target.num_global_batches,
        "labels": hashes["labels"],
        "plan": hashes["plan"],
    }
