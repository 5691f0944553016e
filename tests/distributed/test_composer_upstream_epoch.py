"""Composer's own regression test of its batch-sampler epoch fix (``test_set_dataloaders_to_cur_epoch``, added
with the fix in Composer PR #3124), ported to a ``PKBatchSampler`` with ``SetSamplerEpoch`` added, under
Composer's own settings: a ``ComposerClassifier`` and ``device_train_microbatch_size`` half the batch (each
microbatch one class of the P x K batch, which a classifier trains on). On 1 rank and, under
``composer -n 2``, on 2; with the installed Composer and with its fix reverted
(:func:`composer_dynsample.testing.reverted_batch_sampler_fix`): the sampler ends at the last epoch.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from composer import Trainer
from composer.models import ComposerClassifier
from torch.utils.data import DataLoader, TensorDataset

from composer_dynsample import PKBatchSampler, SetSamplerEpoch
from composer_dynsample.testing import reverted_batch_sampler_fix

CLASSES, PER_CLASS, DIM = 4, 8, 8  # 32 samples; P x K batches of 2 classes x 4 on each rank

WORLD_SIZES = [1, pytest.param(2, marks=pytest.mark.world_size(2))]


def fit(max_duration: int, *, callback: bool) -> PKBatchSampler:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(CLASSES * PER_CLASS, DIM, generator=generator)
    labels = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    sampler = PKBatchSampler(labels, classes_per_batch=2, samples_per_class=4, seed=0)
    loader = DataLoader(TensorDataset(features, labels), batch_sampler=sampler)
    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(DIM, CLASSES)), num_classes=CLASSES)
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        max_duration=f"{max_duration}ep",
        device_train_microbatch_size=4,  # half the batch of 8: one class per microbatch
        callbacks=[SetSamplerEpoch()] if callback else [],
        progress_bar=False,
    )
    trainer.fit()
    assert trainer.state.train_dataloader.batch_sampler is sampler
    return sampler


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("max_duration", [1, 2])
@pytest.mark.parametrize("reverted", [False, True], ids=["composer", "fix_reverted"])
def test_set_dataloaders_to_cur_epoch(world_size, max_duration, reverted):
    with reverted_batch_sampler_fix() if reverted else contextlib.nullcontext():
        sampler = fit(max_duration, callback=True)
    assert sampler.epoch == max_duration - 1  # epochs count from 0


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_port_fails_on_the_reverted_fix_without_the_callback(world_size):
    """The same test without SetSamplerEpoch finds the bug Composer's fix removed: the epoch stays 0."""
    with reverted_batch_sampler_fix():
        assert fit(2, callback=False).epoch == 0
    assert fit(2, callback=False).epoch == 1  # the installed Composer sets it itself
