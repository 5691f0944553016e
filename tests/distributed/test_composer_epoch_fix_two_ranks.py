"""A regression test of Composer's batch-sampler epoch fix to copy into your own suite, on 2 ranks over gloo.

Composer before v0.21.2 never called ``set_epoch`` on the train dataloader's ``batch_sampler``, so a P x K
batch sampler trained epoch 0's batches in every epoch. This file trains a plain ``ComposerModel`` of its
own for 3 epochs on P x K batches with that bug put back (``reverted_batch_sampler_fix()``) and shows that:

- without ``SetSamplerEpoch`` every epoch repeats epoch 0's batches, on each rank;
- with ``SetSamplerEpoch`` each epoch trains its own order, and the ranks' shards are disjoint;
- the installed Composer (nothing reverted) gives each epoch its own order too.

It needs nothing from this repository's tests: copy it, drop the ``world_size`` marker if your suite has
none, and run it on 2 CPU processes with Composer's launcher::

    python -m composer.cli.launcher -n 2 --master_port 29611 \
        -m pytest -q tests/distributed/test_composer_epoch_fix_two_ranks.py

(this repository's ``conftest.py`` collects a test marked ``world_size(2)`` only on 2 ranks). The samplers
read the rank from the launcher's environment, and the ``Trainer`` joins the gloo process group.
"""

from __future__ import annotations

import pytest
import torch
from composer import Callback, Trainer
from composer.models import ComposerModel
from composer.utils import dist
from torch.utils.data import TensorDataset

from composer_dynsample import PKBatchSampler, SetSamplerEpoch
from composer_dynsample.samplers.dataloader import build_dataloader
from composer_dynsample.testing import reverted_batch_sampler_fix

pytestmark = pytest.mark.world_size(2)

EPOCHS = 3
CLASSES, PER_CLASS, DIM = 8, 12, 4  # 96 samples: 8 global P x K batches of 4 classes x 3, 4 per rank


class TinyClassifier(ComposerModel):
    """Your own model: a linear classifier on ``(features, label, index)`` batches."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, batch):
        features, _, _ = batch
        return self.head(features)

    def loss(self, outputs, batch):
        return torch.nn.functional.cross_entropy(outputs, batch[1])


class BatchIndices(Callback):
    """Which samples each train batch holds, by epoch: ``epochs[e]`` lists epoch ``e``'s batches."""

    def __init__(self) -> None:
        self.epochs: dict[int, list[list[int]]] = {}

    def after_dataloader(self, state, logger) -> None:
        self.epochs.setdefault(int(state.timestamp.epoch), []).append(state.batch[2].tolist())


def fit(callbacks=()) -> tuple[PKBatchSampler, BatchIndices]:
    """Train ``TinyClassifier`` for 3 epochs on P x K batches: ``(sampler, recorder)``."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    features = torch.randn(labels.numel(), DIM, generator=generator)
    # Each item is (features, label, index): the index lets the test see which samples a batch holds.
    dataset = TensorDataset(features, labels, torch.arange(labels.numel()))
    sampler = PKBatchSampler(labels, classes_per_batch=4, samples_per_class=3, seed=7)
    recorder = BatchIndices()
    torch.manual_seed(0)
    model = TinyClassifier()
    trainer = Trainer(
        model=model,
        train_dataloader=build_dataloader(dataset, sampler),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_duration=f"{EPOCHS}ep",
        device_train_microbatch_size=sampler.batch_size,
        callbacks=[recorder, *callbacks],
        progress_bar=False,
    )
    trainer.fit()
    trainer.close()
    return sampler, recorder


def assert_each_epoch_has_its_own_order(sampler: PKBatchSampler, recorder: BatchIndices) -> None:
    for epoch in range(EPOCHS):
        assert recorder.epochs[epoch] == sampler.rank_batches(epoch).tolist(), f"epoch {epoch}: not its order"
    orders = [recorder.epochs[epoch] for epoch in range(EPOCHS)]
    assert all(orders[i] != orders[j] for i in range(EPOCHS) for j in range(i)), "two epochs share an order"


def assert_ranks_are_disjoint(recorder: BatchIndices) -> None:
    every_rank = dist.all_gather_object(recorder.epochs)
    for epoch in range(EPOCHS):
        rank0, rank1 = ({i for batch in epochs[epoch] for i in batch} for epochs in every_rank)
        assert rank0 and rank1 and not rank0 & rank1, f"epoch {epoch}: the ranks share samples"


def test_without_set_sampler_epoch_every_epoch_repeats_epoch_0():
    with reverted_batch_sampler_fix():
        sampler, recorder = fit()
    assert (sampler.num_replicas, dist.get_world_size()) == (2, 2)
    epoch_0 = sampler.rank_batches(0).tolist()
    assert recorder.epochs[0] == epoch_0
    for epoch in range(1, EPOCHS):
        assert recorder.epochs[epoch] == epoch_0, f"epoch {epoch} got its own order: is the revert in place?"
    assert sampler.rank_batches(1).tolist() != epoch_0  # the sampler has another order for epoch 1


def test_set_sampler_epoch_gives_each_epoch_its_own_order():
    with reverted_batch_sampler_fix():
        sampler, recorder = fit(callbacks=[SetSamplerEpoch()])
    assert_each_epoch_has_its_own_order(sampler, recorder)
    assert_ranks_are_disjoint(recorder)


def test_the_installed_composer_gives_each_epoch_its_own_order():
    sampler, recorder = fit()
    assert_each_epoch_has_its_own_order(sampler, recorder)
    assert_ranks_are_disjoint(recorder)
