"""Samplers and SetSamplerEpoch on 2 real processes over gloo, through Composer's Trainer and launcher.

Run with ``python -m composer.cli.launcher -n 2 --master_port PORT -m pytest -m world_size tests``.
"""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.utils import dist
from torch.utils.data import DataLoader, IterableDataset

from composer_dynsample import PKBatchSampler, SetSamplerEpoch, TwoStreamBatchSampler
from tests.common import (
    BatchRecorder,
    IndexClassifier,
    assert_each_epoch_has_its_own_order,
    assert_mid_epoch_resume_replays_the_rest,
    assert_reverting_the_fix_is_caught,
    assert_set_sampler_epoch_repairs_the_reverted_fix,
    pk_run,
    recorded_fit,
)
from tests.distributed._helpers import shared_tmp_dir

pytestmark = pytest.mark.world_size(2)

LABELS = torch.arange(192) % 8  # 8 classes of 24: 16 global PK batches of 4 x 3, 8 per rank


def make_run(**kwargs):
    return pk_run(LABELS, seed=5, **kwargs)


def assert_disjoint_across_ranks(recorder: BatchRecorder, epochs: int) -> None:
    every_rank = dist.all_gather_object(recorder.batches)
    for epoch in range(epochs):
        per_rank = [{i for (e, _), b in batches.items() if e == epoch for i in b} for batches in every_rank]
        assert per_rank[0] and per_rank[1]
        assert not per_rank[0] & per_rank[1], f"epoch {epoch}: ranks share samples"


def test_sampler_defaults_to_the_process_group():
    _, sampler, _ = make_run(max_duration="1ba")
    fresh = PKBatchSampler(LABELS, 4, 3)
    assert (fresh.num_replicas, fresh.rank) == (2, dist.get_global_rank())
    assert (sampler.num_replicas, len(sampler)) == (2, 8)


def test_installed_composer_sets_epochs_and_shards_are_disjoint():
    sampler, recorder = recorded_fit(make_run)
    assert_each_epoch_has_its_own_order(recorder, sampler, epochs=3)
    assert_disjoint_across_ranks(recorder, epochs=3)


def test_reverting_the_fix_is_caught_on_two_ranks():
    assert_reverting_the_fix_is_caught(make_run)


def test_set_sampler_epoch_alone_repairs_the_reverted_trainer_on_two_ranks():
    recorder = assert_set_sampler_epoch_repairs_the_reverted_fix(make_run)
    assert_disjoint_across_ranks(recorder, epochs=3)


@pytest.mark.parametrize("revert", [False, True], ids=["installed", "reverted+callback"])
def test_mid_epoch_resume_on_two_ranks(revert):
    assert_mid_epoch_resume_replays_the_rest(make_run, shared_tmp_dir(), revert=revert)


def test_two_stream_sampler_in_the_trainer():
    sampler = TwoStreamBatchSampler(range(0, 120), range(120, 192), 10, 2, seed=3)
    trainer, _, recorder = make_run(sampler=sampler, callbacks=[SetSamplerEpoch()], max_duration="2ep")
    trainer.fit()
    assert len(sampler) == 6
    every_rank = dist.all_gather_object(recorder.batches)
    for epoch in range(2):
        primaries = [
            [i for (e, _), b in batches.items() if e == epoch for i in b[:10]] for batches in every_rank
        ]
        assert sorted(primaries[0] + primaries[1]) == list(range(120))
    assert_each_epoch_has_its_own_order(recorder, sampler, epochs=2)


def test_ranks_with_different_seeds_are_caught():
    sampler = PKBatchSampler(LABELS, 4, 3, seed=dist.get_global_rank())
    trainer, _, _ = make_run(sampler=sampler, callbacks=[SetSamplerEpoch()], max_duration="1ep")
    with pytest.raises(
        RuntimeError, match=r"ranks \[1\] disagree with rank 0 on .*seed: 0 on rank 0, 1 on rank 1"
    ):
        trainer.fit()


class Stream(IterableDataset):
    """An iterable dataset sharded by hand: Composer accepts it on many ranks, and nothing takes an epoch."""

    def __len__(self) -> int:
        return 48

    def __iter__(self):
        rank = dist.get_global_rank()
        for i in range(rank, 96, 2):
            yield i, int(LABELS[i])


def test_warns_once_when_nothing_takes_an_epoch():
    trainer = Trainer(
        model=IndexClassifier(LABELS.numel(), 8),
        train_dataloader=DataLoader(Stream(), batch_size=8),
        max_duration="2ep",
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
    )
    with pytest.warns(UserWarning, match="no batch_sampler or sampler with set_epoch") as caught:
        trainer.fit()
    assert sum("SetSamplerEpoch" in str(w.message) for w in caught) == 1


def test_sampler_built_for_one_rank_is_caught():
    sampler = PKBatchSampler(LABELS, 4, 3, num_replicas=1, rank=0)
    trainer, _, _ = make_run(sampler=sampler, callbacks=[SetSamplerEpoch()], max_duration="1ep")
    with pytest.raises(ValueError, match=r"built with num_replicas=1, rank=0, but it is rank 0 of 2"):
        trainer.fit()


def test_a_sampler_wrong_on_one_rank_only_fails_every_rank():
    # rank=0 pinned on both processes: only rank 1's sampler is wrong. Rank 1 used to raise alone while
    # rank 0 waited in the ranks' agreement check until the process group timed out.
    sampler = PKBatchSampler(LABELS, 4, 3, rank=0)
    trainer, _, _ = make_run(sampler=sampler, callbacks=[SetSamplerEpoch()], max_duration="1ep")
    match = (
        r"^SetSamplerEpoch, epoch 0: rank 1 cannot go on: its train sampler was built with num_replicas=2, "
    )
    with pytest.raises(ValueError, match=match + r"rank=0, but it is rank 1 of 2"):
        trainer.fit()
