"""Resume an epoch interrupted on another number of ranks, each remaining global batch trained once.

:class:`ElasticResume` is the resume unit :class:`~composer_dynsample.SetSamplerEpoch` composes: it saves the
world size and the epoch's position in the checkpoint, and on a mid-epoch resume on another number of ranks
tells a :class:`~composer_dynsample.samplers.DistributedBatchSampler` which global batches remain (rank ``r``
of ``W`` takes remaining batches ``r, r + W, ...``), preceded by the one-index placeholders Composer discards.
It refuses, in one line, a resume it cannot make exact: another sampler, ``train_subset_num_batches``, a
sampler that builds the epoch differently (other labels, seed, batch size or plan), and a placeholder about to
be trained (``spin_dataloaders=False``).
"""

from __future__ import annotations

import logging
from typing import Any

from composer.core import State

from composer_dynsample.batches import batch_rows
from composer_dynsample.distributed import get_world_size
from composer_dynsample.samplers.base import DistributedBatchSampler, ResumePlan, SupportsSetEpoch
from composer_dynsample.samplers.wiring import find_epoch_target

__all__ = ["ElasticResume"]

log = logging.getLogger(__name__)


class ElasticResume:
    """The resume state of the train sampler's epoch: saved with the checkpoint, applied at ``FIT_START``."""

    def __init__(self) -> None:
        self._saved: dict[str, Any] = {}
        self._state: State | None = None
        self.plan: ResumePlan | None = None  # the epoch resumed elastically, while it lasts
        self._check_first_batch = 0  # after an elastic resume: the batch size a real first batch has

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

    def epoch_start(self, state: State) -> None:
        """Past the resumed epoch, the sampler's epochs are the normal ones again."""
        if self.plan is not None and self.plan.epoch != int(state.timestamp.epoch):
            self.plan = None
            state.dataloader_len = -1  # the epoch's full length again

    def _global_batches_done(self, epoch: int, batch_in_epoch: int) -> int:
        """The number of the epoch's global batches trained when this rank is at ``batch_in_epoch``."""
        plan = self.plan
        if plan is not None and plan.epoch == epoch:  # the first plan.skip batches were placeholders
            return plan.done + (batch_in_epoch - plan.skip) * get_world_size()
        return batch_in_epoch * get_world_size()

    def fit_start(self, state: State) -> None:
        """Resume an epoch interrupted on another number of ranks without repeating or skipping a sample.

        Composer discards the first ``batch_in_epoch`` batches each rank yields on resume; that is exact
        only when the checkpoint's world size is this run's. Otherwise the sampler is told which of the
        epoch's global batches are trained and yields ``batch_in_epoch`` placeholders for the trainer to
        discard, then this rank's share of the rest.
        """
        self._state = state
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
        self.plan = ResumePlan(epoch, done, skip)
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

    def after_dataloader(self, state: State) -> None:
        """After an elastic resume, refuse to train a placeholder: Composer did not discard them."""
        size, self._check_first_batch = self._check_first_batch, 0
        plan = self.plan  # set with _check_first_batch
        if size > 1 and plan is not None and batch_rows(state) == 1:
            raise ValueError(
                f"SetSamplerEpoch: epoch {plan.epoch} was resumed mid-way on {get_world_size()} "
                f"rank(s) from a checkpoint of {self._saved.get('world_size')} rank(s), and the trainer is "
                f"about to train the first of the {plan.skip} one-index placeholder batches "
                "it should discard. This resume needs Composer's spin_dataloaders=True (the default) and no "
                "'train' entry in state.dataset_resumption. Resume with spin_dataloaders=True, on "
                f"{self._saved.get('world_size')} rank(s), or from a checkpoint saved at an epoch boundary."
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
