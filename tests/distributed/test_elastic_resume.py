"""Elastic resume through Composer's Trainer: a checkpoint written mid-epoch on 2 ranks resumed on 1, and
the other way round, trains every global batch of the interrupted epoch exactly once.

Each test records the dataset indices every rank trains before and after the resume; the 1-rank part
runs in a separate process started by rank 0 (tests/distributed/elastic_run.py).
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from composer.utils import dist
from torch.utils.data import DataLoader, DistributedSampler

from tests.common import index_dataset
from tests.distributed._helpers import shared_tmp_dir
from tests.distributed.elastic_run import (
    LABELS,
    epoch_batches,
    make_sampler,
    make_trainer,
    run_on_one_rank,
    train,
)

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


def _on_rank_zero(run, **kwargs):
    """``run(**kwargs)`` on rank 0, its result on every rank; its failure fails every rank instead of a hang."""
    box = [None]
    if dist.get_global_rank() == 0:
        try:
            box = [("ok", run(**kwargs))]
        except Exception as error:  # re-raised on every rank below
            box = [("error", repr(error))]
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status != "ok":
        raise AssertionError(f"the 1-rank run failed on rank 0: {value}")
    return value


def _union(every_rank: list[dict], epoch: int) -> Counter[tuple[int, ...]]:
    """The batches every rank trained in one epoch, together."""
    return sum((epoch_batches(batches, epoch) for batches in every_rank), Counter())


def _global(
    epoch: int, start: int = 0, stop: int | None = None, mixed: bool = False
) -> Counter[tuple[int, ...]]:
    """The uninterrupted epoch's global batches ``start:stop`` (a pure function of seed and epoch)."""
    batches = make_sampler(mixed=mixed).global_batches(epoch)[start:stop].tolist()
    return Counter(tuple(batch) for batch in batches)


@pytest.mark.parametrize("mixed", [False, True], ids=["one_source", "two_sources"])
def test_a_two_rank_checkpoint_resumed_on_one_rank_trains_the_rest_of_the_epoch_once(mixed):
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir()
    # 8 batches per rank and epoch: batch 10 is epoch 1, 2 batches per rank in, global batches 0-3 trained.
    before = dist.all_gather_object(train("10ba", mixed=mixed, save_folder=str(folder), save_interval="10ba"))
    load_path = str(folder / "ep1-ba10-rank0.pt")
    after = _on_rank_zero(
        run_on_one_rank, out=folder / "after.json", max_duration="3ep", load_path=load_path, mixed=mixed
    )
    _global_of = functools.partial(_global, mixed=mixed)
    assert _union(before, 0) == _global_of(0)
    assert _union(before, 1) == _global_of(1, 0, 4)
    assert epoch_batches(after, 1) == _global_of(1, 4)  # the other 12, each once
    if mixed:  # every batch, before and after the resume, from one source (one half of the indices)
        trained = [batch for batches in [*before, after] for batch in batches.values()]
        assert all(len({index >= len(LABELS) // 2 for index in batch}) == 1 for batch in trained)
    assert sorted(key for key in after if key[0] == 1) == [(1, b) for b in range(2, 14)]
    assert epoch_batches(after, 2) == _global_of(2)  # then a normal 1-rank epoch


@pytest.mark.parametrize("drop_last", [True, False], ids=["drop_last", "pad"])
def test_a_one_rank_checkpoint_resumed_on_two_ranks_trains_the_rest_of_the_epoch_once(drop_last):
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir()
    # 16 batches per epoch on 1 rank: batch 23 is epoch 1 with its global batches 0-6 trained.
    before = _on_rank_zero(
        run_on_one_rank,
        out=folder / "before.json",
        max_duration="23ba",
        drop_last=drop_last,
        save_folder=str(folder),
        save_interval="23ba",
    )
    after = dist.all_gather_object(
        train("3ep", drop_last=drop_last, load_path=str(folder / "ep1-ba23-rank0.pt"))
    )
    assert epoch_batches(before, 1) == _global(1, 0, 7)
    resumed_epoch = _union(after, 1)
    # 9 global batches remain for 2 ranks: drop_last drops the last one, padding repeats the epoch's first.
    expected = _global(1, 7, 15) if drop_last else _global(1, 7) + _global(1, 0, 1)
    assert resumed_epoch == expected
    assert [sum(epoch_batches(b, 1).values()) for b in after] == ([4, 4] if drop_last else [5, 5])
    for rank, batches in enumerate(after):  # then normal 2-rank epochs: rank r takes r, r + 2, ...
        normal = make_sampler().global_batches(2)[rank::2].tolist()
        assert epoch_batches(batches, 2) == Counter(tuple(batch) for batch in normal)


def test_a_mid_epoch_checkpoint_of_another_world_size_is_refused_for_other_samplers_on_every_rank():
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir()

    def plain_run(**kwargs):
        data = index_dataset(LABELS)
        return make_trainer(
            DataLoader(data, batch_size=12, sampler=DistributedSampler(data, seed=5)), **kwargs
        )

    trainer, _ = plain_run(save_folder=str(folder), save_interval="10ba")
    trainer.fit()
    trainer.close()
    if dist.get_global_rank() == 0:  # as if one rank had trained 2 batches of epoch 1 (8 batches per rank)
        state = torch.load(folder / "ep1-ba10-rank0.pt", weights_only=False)
        (key,) = [key for key in state["state"]["callbacks"] if "SetSamplerEpoch" in key]
        state["state"]["callbacks"][key].update(world_size=1, epoch=1, global_batches_done=2)
        torch.save(state, folder / "one-rank.pt")
    dist.barrier()
    resumed, recorder = plain_run(load_path=str(folder / "one-rank.pt"))
    with pytest.raises(
        ValueError, match=r"written by 1 rank\(s\) in the middle of epoch 1 .* this run has 2 rank"
    ):
        resumed.fit()
    assert recorder.batches == {}
    dist.barrier()  # both ranks got here: neither waits in a collective
