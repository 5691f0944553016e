"""SetSamplerEpoch and Composer's batch_sampler epoch fix, through a real Trainer on one process.

The regression tests for Composer's fix (issue #3123, v0.21.2) run three ways: the installed trainer
(the fix present) must pass; a trainer with the fix reverted must be caught by the same assertions;
the reverted trainer plus SetSamplerEpoch alone must pass again.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from composer import Trainer
from composer.core import DataSpec
from composer.loggers import InMemoryLogger
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader
from composer_dynsample.samplers.wiring import find_epoch_target
from tests.common import (
    IndexClassifier,
    assert_each_epoch_has_its_own_order,
    assert_mid_epoch_resume_replays_the_rest,
    assert_reverting_the_fix_is_caught,
    assert_set_sampler_epoch_repairs_the_reverted_fix,
    index_dataset,
    pk_run,
    recorded_fit,
)
from tests.distributed.elastic_run import make_trainer

LABELS = torch.arange(96) % 8  # 8 classes of 12 samples: 8 PK batches of 4 classes x 3 samples per epoch


def make_run(**kwargs):
    return pk_run(LABELS, seed=11, **kwargs)


def test_installed_composer_sets_the_batch_sampler_epoch():
    sampler, recorder = recorded_fit(make_run)
    assert len(sampler) == 8
    assert_each_epoch_has_its_own_order(recorder, sampler, epochs=3)


def test_reverting_the_fix_is_caught():
    assert_reverting_the_fix_is_caught(make_run)


def test_set_sampler_epoch_alone_repairs_the_reverted_trainer():
    assert_set_sampler_epoch_repairs_the_reverted_fix(make_run)


@pytest.mark.parametrize("revert", [False, True], ids=["installed", "reverted+callback"])
def test_mid_epoch_resume_yields_the_batches_of_the_uninterrupted_run(tmp_path, revert):
    resumed = assert_mid_epoch_resume_replays_the_rest(make_run, tmp_path, revert=revert)
    assert sorted(resumed.batches)[0] == (1, 2)


def test_logs_the_epoch_it_sets():
    in_memory = InMemoryLogger()
    trainer, _, _ = make_run(callbacks=[SetSamplerEpoch()], loggers=[in_memory], max_duration="2ep")
    trainer.fit()
    logged = [int(value) for _, value in in_memory.data["sampler/epoch"]]
    assert logged == [0, 0, 1]  # FIT_START and EPOCH_START of epoch 0, then EPOCH_START of epoch 1


class DuckSampler:
    """A batch sampler that is no DistributedSampler but has set_epoch: the callback must still reach it."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.n, self.batch_size, self.epoch, self.calls = n, batch_size, 0, []

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter([order[i : i + self.batch_size] for i in range(0, self.n, self.batch_size)])

    def __len__(self) -> int:
        return self.n // self.batch_size


def test_duck_typed_batch_sampler_gets_every_epoch():
    duck = DuckSampler(LABELS.numel(), 12)
    trainer = Trainer(
        model=IndexClassifier(LABELS.numel(), 8),
        train_dataloader=DataLoader(index_dataset(LABELS), batch_sampler=duck),
        device_train_microbatch_size=12,
        max_duration="3ep",
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
    )
    trainer.fit()
    assert sorted(set(duck.calls)) == [0, 1, 2]


def test_find_epoch_target_reaches_inside_batch_sampler_and_data_spec():
    data = index_dataset(LABELS)
    inner = DistributedSampler(data, num_replicas=1, rank=0)
    plain = DataLoader(data, batch_sampler=BatchSampler(inner, 4, drop_last=False))
    assert find_epoch_target(plain) is inner
    pk = PKBatchSampler(LABELS, 2, 2)
    assert find_epoch_target(DataSpec(build_dataloader(data, pk))) is pk
    assert find_epoch_target(DataLoader(data, batch_size=4)) is None


def test_plain_batch_sampler_loader_without_microbatch_size_gets_a_clear_error():
    sampler = PKBatchSampler(LABELS, 4, 3)
    trainer = Trainer(
        model=IndexClassifier(LABELS.numel(), 8),
        train_dataloader=DataLoader(index_dataset(LABELS), batch_sampler=sampler),
        max_duration="1ep",
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="device_train_microbatch_size=12") as raised:
        trainer.fit()
    assert "composer_dynsample.build_dataloader(dataset, batch_sampler)" in str(raised.value)
    assert "infer_microbatch_size" not in str(raised.value)  # the one other way is gone


def test_build_dataloader_makes_the_same_batch_sampler_train():
    sampler = PKBatchSampler(LABELS, 4, 3)
    trainer = Trainer(
        model=IndexClassifier(LABELS.numel(), 8),
        train_dataloader=build_dataloader(index_dataset(LABELS), sampler),
        max_duration="1ep",
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
    )
    trainer.fit()
    assert trainer.state.device_train_microbatch_size == 12
    assert int(trainer.state.timestamp.batch) == len(sampler)


def _as_written_by(checkpoint, world_size, out, **position):
    """A copy of a checkpoint whose SetSamplerEpoch state says it was written on ``world_size`` ranks."""
    state = torch.load(checkpoint, weights_only=False)
    (key,) = [key for key in state["state"]["callbacks"] if "SetSamplerEpoch" in key]
    state["state"]["callbacks"][key].update(world_size=world_size, **position)
    torch.save(state, out)
    return str(out)


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory):
    """An uninterrupted 1-rank run and its epoch-1 batch-2 checkpoint, rewritten as if 2 ranks had trained
    2 batches each of epoch 1 (its global batches 0-3)."""
    folder = tmp_path_factory.mktemp("full")
    trainer, _, full = make_run(callbacks=[SetSamplerEpoch()], save_folder=str(folder), save_interval="5ba")
    trainer.fit()
    trainer.close()
    two = _as_written_by(folder / "ep1-ba10-rank0.pt", 2, folder / "two.pt", epoch=1, global_batches_done=4)
    return full, two


def test_a_mid_epoch_resume_on_another_world_size_is_refused_for_other_samplers(tmp_path):
    def duck_run(**kwargs):
        loader = DataLoader(index_dataset(LABELS), batch_sampler=DuckSampler(LABELS.numel(), 12))
        return make_trainer(loader, device_train_microbatch_size=12, **kwargs)

    trainer, _ = duck_run(save_folder=str(tmp_path), save_interval="5ba")
    trainer.fit()
    trainer.close()
    two_ranks = _as_written_by(
        tmp_path / "ep1-ba10-rank0.pt", 2, tmp_path / "two.pt", epoch=1, global_batches_done=4
    )
    resumed, recorder = duck_run(load_path=two_ranks)
    with pytest.raises(
        ValueError,
        match=r"written by 2 rank\(s\) in the middle of epoch 1 .* this run has 1 rank.*DuckSampler",
    ):
        resumed.fit()
    assert recorder.batches == {}  # refused before a single batch


@pytest.mark.parametrize(("p", "seed"), [(2, 11), (4, 12)])
def test_a_mid_epoch_resume_with_another_sampler_is_refused(two_rank_checkpoint, p, seed):
    # Another batch size or seed builds another epoch: Composer's skip of 10 batches would then repeat
    # or skip samples of the interrupted epoch. Before, the run trained on silently.
    _, two_ranks = two_rank_checkpoint
    checkpoint = str(Path(two_ranks).parent / "ep1-ba10-rank0.pt")
    other = PKBatchSampler(LABELS, classes_per_batch=p, samples_per_class=3, seed=seed)
    resumed, _, recorder = make_run(sampler=other, callbacks=[SetSamplerEpoch()], load_path=checkpoint)
    changed = "batch_size 12 -> 6, global_batches 8 -> 16" if p == 2 else "seed 11 -> 12"
    with pytest.raises(ValueError, match=rf"middle of epoch 1 \(batch 2\).*differently \({changed}\)"):
        resumed.fit()
    assert recorder.batches == {}


def test_an_elastic_resume_without_spinning_is_refused_before_a_step(two_rank_checkpoint):
    # Without spinning, Composer trains the placeholders it should discard; before, this went unnoticed.
    _, two_ranks = two_rank_checkpoint
    resumed, _, _ = make_run(callbacks=[SetSamplerEpoch()], load_path=two_ranks, spin_dataloaders=False)
    with pytest.raises(
        ValueError, match=r"from a checkpoint of 2 rank.*needs Composer's spin_dataloaders=True"
    ):
        resumed.fit()
    assert int(resumed.state.timestamp.batch) == 10  # the checkpoint's batch: not one step was trained


def test_a_mid_epoch_resume_from_two_ranks_trains_the_rest_of_the_epoch_once(two_rank_checkpoint):
    full, two_ranks = two_rank_checkpoint
    resumed, sampler, recorder = make_run(callbacks=[SetSamplerEpoch()], load_path=two_ranks)
    resumed.fit()
    assert recorder.epoch(1) == full.epoch(1)[4:]
    assert [key for key in sorted(recorder.batches) if key[0] == 1] == [(1, 2), (1, 3), (1, 4), (1, 5)]
    assert recorder.epoch(2) == full.epoch(2) and len(sampler) == 8


def test_an_epoch_cut_by_train_subset_num_batches_is_not_resumed_elastically(two_rank_checkpoint):
    _, two_ranks = two_rank_checkpoint
    resumed, _, recorder = make_run(
        callbacks=[SetSamplerEpoch()], load_path=two_ranks, train_subset_num_batches=6
    )
    with pytest.raises(ValueError, match=r"this run has 1 rank.*train_subset_num_batches=6 cuts the epoch"):
        resumed.fit()
    assert recorder.batches == {}


def test_an_elastically_resumed_epoch_saves_its_global_position_for_the_next_resume(
    tmp_path, two_rank_checkpoint
):
    full, two_ranks = two_rank_checkpoint
    first, _, first_part = make_run(
        callbacks=[SetSamplerEpoch()],
        load_path=two_ranks,
        save_folder=str(tmp_path),
        save_interval="1ba",
        max_duration="12ba",
    )
    first.fit()
    first.close()
    state = torch.load(tmp_path / "ep1-ba12-rank0.pt", weights_only=False)["state"]["callbacks"]
    (saved,) = [value for key, value in state.items() if "SetSamplerEpoch" in key]
    layout = {"seed": 11, "batch_size": 12, "global_batches": 8}
    sampler = find_epoch_target(first.state.train_dataloader)
    layout.update({key: sampler.fingerprints(1)[key] for key in ("labels", "plan")})
    assert saved == {"world_size": 1, "epoch": 1, "global_batches_done": 6, "sampler": layout}
    second, _, second_part = make_run(
        callbacks=[SetSamplerEpoch()], load_path=str(tmp_path / "ep1-ba12-rank0.pt")
    )
    second.fit()
    assert first_part.epoch(1) + second_part.epoch(1) == full.epoch(1)[4:]
    assert second_part.epoch(2) == full.epoch(2)


def test_an_epoch_boundary_resume_on_another_world_size_is_exact(tmp_path):
    trainer, _, full = make_run(callbacks=[SetSamplerEpoch()], save_folder=str(tmp_path), save_interval="1ep")
    trainer.fit()
    trainer.close()
    two_ranks = _as_written_by(tmp_path / "ep1-ba8-rank0.pt", 2, tmp_path / "from-two-ranks.pt")
    resumed, _, recorder = make_run(callbacks=[SetSamplerEpoch()], load_path=two_ranks)
    resumed.fit()
    assert recorder.in_order() == full.in_order()[8:]


def test_build_dataloader_rejects_arguments_the_batch_sampler_owns():
    with pytest.raises(ValueError, match=r"\['shuffle'\] cannot be combined with a batch_sampler"):
        build_dataloader(index_dataset(LABELS), PKBatchSampler(LABELS, 2, 2), shuffle=True)
    numpy_sized = PKBatchSampler(LABELS, 2, 2)
    numpy_sized.batch_size = np.int64(4)
    assert build_dataloader(index_dataset(LABELS), numpy_sized).batch_size == 4
    with pytest.raises(TypeError, match="must have an integer batch_size"):
        build_dataloader(index_dataset(LABELS), [[0, 1]])


def test_no_warning_on_one_rank_without_an_epoch_target():
    trainer = Trainer(
        model=IndexClassifier(LABELS.numel(), 8),
        train_dataloader=DataLoader(index_dataset(LABELS), batch_size=12),
        max_duration="1ep",
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="SetSamplerEpoch")
        trainer.fit()
