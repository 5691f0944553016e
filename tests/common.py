"""Small models, recorders and the runs with Composer's fix reverted, shared by the Trainer tests.

The revert is the package's own :func:`~composer_dynsample.testing.reverted_batch_sampler_fix`, importable
from here too.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from composer import Trainer
from composer.core import Callback, State
from composer.loggers import Logger
from composer.models import ComposerModel
from torch.utils.data import TensorDataset

from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader
from composer_dynsample.testing import reverted_batch_sampler_fix


class IndexClassifier(ComposerModel):
    """Classifies dataset indices through a fixed random feature table: enough to run real training steps."""

    def __init__(self, num_indices: int, num_classes: int, dim: int = 8) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("table", torch.randn(num_indices, dim, generator=generator))
        self.head = torch.nn.Linear(dim, num_classes)

    def forward(self, batch):
        index, _ = batch
        return self.head(self.table[index])

    def loss(self, outputs, batch):
        return torch.nn.functional.cross_entropy(outputs, batch[1])


def index_dataset(labels: torch.Tensor) -> TensorDataset:
    """An index-only dataset: every item is (index, label)."""
    return TensorDataset(torch.arange(labels.numel()), labels)


class BatchRecorder(Callback):
    """Records the dataset indices of every train batch, keyed by (epoch, batch in epoch)."""

    def __init__(self) -> None:
        self.batches: dict[tuple[int, int], list[int]] = {}

    def after_dataloader(self, state: State, logger: Logger) -> None:
        key = (int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch))
        self.batches[key] = state.batch[0].tolist()

    def epoch(self, epoch: int) -> list[list[int]]:
        return [batch for (e, _), batch in sorted(self.batches.items()) if e == epoch]

    def in_order(self) -> list[list[int]]:
        return [batch for _, batch in sorted(self.batches.items())]


class IndexRecorder(BatchRecorder):
    """BatchRecorder for GatherCollate's dict batches: the sample indices are under "index"."""

    def after_dataloader(self, state, logger) -> None:
        key = (int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch))
        self.batches[key] = state.batch["index"].tolist()


def assert_each_epoch_has_its_own_order(recorder: BatchRecorder, sampler, epochs: int) -> None:
    """The batches trained on in epoch e are the sampler's order for epoch e, and epochs differ."""
    for epoch in range(epochs):
        expected = sampler.rank_batches(epoch).tolist()
        assert recorder.epoch(epoch) == expected, f"epoch {epoch} trained on another epoch's order"
    assert recorder.epoch(0) != recorder.epoch(1), "epochs 0 and 1 trained on the same order"


def sgd_trainer(model: torch.nn.Module, train_dataloader, *, lr: float, **trainer_options) -> Trainer:
    """A Trainer of ``model`` on ``train_dataloader`` with plain SGD at ``lr`` and no progress bar;
    ``trainer_options`` (algorithms, callbacks, max_duration, seed, ...) as the Trainer's."""
    return Trainer(
        model=model,
        train_dataloader=train_dataloader,
        optimizers=torch.optim.SGD(model.parameters(), lr=lr),
        progress_bar=False,
        **trainer_options,
    )


def pk_run(
    labels: torch.Tensor, seed: int, *, sampler=None, callbacks=(), max_duration="3ep", **trainer_kwargs
):
    """``(trainer, sampler, recorder)``: an IndexClassifier on ``labels`` with a BatchRecorder, its batches
    from ``sampler`` or else P x K batches of 4 classes x 3 samples drawn with ``seed``."""
    sampler = sampler or PKBatchSampler(labels, classes_per_batch=4, samples_per_class=3, seed=seed)
    recorder = BatchRecorder()
    trainer = Trainer(
        model=IndexClassifier(labels.numel(), int(labels.max()) + 1),
        train_dataloader=build_dataloader(index_dataset(labels), sampler),
        max_duration=max_duration,
        callbacks=[recorder, *callbacks],
        progress_bar=False,
        **trainer_kwargs,
    )
    return trainer, sampler, recorder


def recorded_fit(make_run, *, revert: bool = False, **kwargs) -> tuple[PKBatchSampler, BatchRecorder]:
    """Fit ``make_run(**kwargs)``, with Composer's batch_sampler fix reverted if ``revert``: ``(sampler, recorder)``."""
    with reverted_batch_sampler_fix() if revert else contextlib.nullcontext():
        trainer, sampler, recorder = make_run(**kwargs)
        trainer.fit()
    return sampler, recorder


def assert_reverting_the_fix_is_caught(make_run) -> None:
    """With Composer's fix reverted, the 3 epochs' batches are caught as not each epoch's own order."""
    sampler, recorder = recorded_fit(make_run, revert=True)
    with pytest.raises(AssertionError, match="trained on"):
        assert_each_epoch_has_its_own_order(recorder, sampler, epochs=3)


def assert_set_sampler_epoch_repairs_the_reverted_fix(make_run) -> BatchRecorder:
    """With the fix reverted and SetSamplerEpoch added, each of 3 epochs trains its own order."""
    sampler, recorder = recorded_fit(make_run, revert=True, callbacks=[SetSamplerEpoch()])
    assert_each_epoch_has_its_own_order(recorder, sampler, epochs=3)
    return recorder


def assert_mid_epoch_resume_replays_the_rest(make_run, folder: Path, *, revert: bool) -> BatchRecorder:
    """Run 3 epochs of 8 batches with SetSamplerEpoch, saving every 5 batches into ``folder``, then resume
    from batch 10 (epoch 1, batch 2 of 8: mid-epoch, where EPOCH_START does not fire) and check that the
    resumed run trains exactly the uninterrupted run's last 14 batches. Returns the resumed run's recorder."""
    with reverted_batch_sampler_fix() if revert else contextlib.nullcontext():
        trainer, _, full = make_run(
            callbacks=[SetSamplerEpoch()], save_folder=str(folder), save_interval="5ba"
        )
        trainer.fit()
        trainer.close()
        resumed_trainer, _, resumed = make_run(
            callbacks=[SetSamplerEpoch()], load_path=str(folder / "ep1-ba10-rank0.pt")
        )
        resumed_trainer.fit()
    assert len(full.in_order()) == 24
    assert resumed.in_order() == full.in_order()[10:]
    return resumed
