"""Ranks that build their train sampler differently fail on every rank, on 2 real processes over gloo.

Run with ``python -m composer.cli.launcher -n 2 --master_port PORT -m pytest tests/distributed/...``.
Each case is a rank-1-only difference that used to train silently on overlapping shards: rank 1 raises
the same one-line error as rank 0, and neither waits for the other.
"""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist, get_device

from composer_dynsample import HardClassPKBatchSampler, NeighbourBatchSampler, PKBatchSampler, SetSamplerEpoch
from composer_dynsample.distributed import RankMismatchError, check_ranks_agree
from tests.common import pk_run

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

# 16 classes of 32: P x K 4 x 4 and 8 x 2 both give 32 global batches of 16, 16 per rank.
LABELS = torch.arange(512) % 16


def rank() -> int:
    if not dist.is_initialized():  # the first Trainer of the session has not run yet
        dist.initialize_dist(get_device(None))
    return dist.get_global_rank()


def fit_with(sampler) -> None:
    trainer, _, _ = pk_run(LABELS, seed=0, sampler=sampler, callbacks=[SetSamplerEpoch()], max_duration="1ep")
    trainer.fit()


def messages_of_every_rank(error: pytest.ExceptionInfo) -> list[str]:
    return dist.all_gather_object(str(error.value))


def test_a_p_by_k_sampler_of_another_shape_on_one_rank_fails_both():
    shape = (4, 4) if rank() == 0 else (8, 2)
    sampler = PKBatchSampler(LABELS, *shape)
    assert (len(sampler), sampler.batch_size) == (16, 16)  # the old (seed, length) check saw no difference
    with pytest.raises(RankMismatchError, match=r"ranks \[1\] disagree with rank 0 on .*options") as error:
        fit_with(sampler)
    message = str(error.value)
    assert "classes_per_batch: 4 on rank 0, 8 on rank 1" in message
    assert "samples_per_class: 4 on rank 0, 2 on rank 1" in message and "\n" not in message
    every_rank = messages_of_every_rank(error)
    assert every_rank[0] == every_rank[1]


def test_permuted_labels_on_one_rank_fail_both():
    labels = (
        LABELS if rank() == 0 else LABELS[torch.randperm(512, generator=torch.Generator().manual_seed(1))]
    )
    with pytest.raises(
        RankMismatchError, match=r"disagree with rank 0 on the train sampler's labels, plan"
    ) as error:
        fit_with(PKBatchSampler(labels, 4, 4))
    assert "options" not in str(error.value).split(":")[1]
    every_rank = messages_of_every_rank(error)
    assert every_rank[0] == every_rank[1]


def test_another_seed_on_one_rank_fails_both():
    with pytest.raises(RankMismatchError, match=r"on the train sampler's seed, options, plan") as error:
        fit_with(PKBatchSampler(LABELS, 4, 4, seed=rank()))
    assert "seed: 0 on rank 0, 1 on rank 1" in str(error.value)
    every_rank = messages_of_every_rank(error)
    assert every_rank[0] == every_rank[1]


def test_a_hard_fraction_on_one_rank_fails_both_before_any_snapshot():
    # Before centroids the batches are P x K's on both ranks: only the options tell the samplers apart.
    sampler = HardClassPKBatchSampler(LABELS, 4, 4, hard_fraction=0.5 if rank() == 0 else 0.25)
    with pytest.raises(RankMismatchError, match=r"hard_fraction: 0\.5 on rank 0, 0\.25 on rank 1"):
        fit_with(sampler)


def test_neighbour_snapshots_that_differ_fail_both():
    sampler = NeighbourBatchSampler(LABELS, 4, 2)
    generator = torch.Generator().manual_seed(rank())  # one table per rank: a bug
    sampler.update_neighbours(torch.randn(512, 4, generator=generator))
    with pytest.raises(RankMismatchError, match=r"on the train sampler's plan, snapshot"):
        fit_with(sampler)


def test_identical_samplers_agree_and_train():
    sampler = NeighbourBatchSampler(LABELS, 4, 2, seed=3)
    sampler.update_neighbours(torch.randn(512, 4, generator=torch.Generator().manual_seed(0)))
    fit_with(sampler)
    assert sampler.snapshot_fingerprint() != ""


def test_check_ranks_agree_names_the_differing_details_on_every_rank():
    details = {"same": 1, "lr": 0.1 if rank() == 0 else 0.2}
    with pytest.raises(
        ValueError,
        match=r"^run: ranks \[1\] disagree with rank 0 on settings \(lr: 0\.1 on rank 0, 0\.2 on rank 1\)\. Fix it\.$",
    ):
        check_ranks_agree(
            {"settings": repr(details)},
            subject="run",
            advice="Fix it.",
            details=lambda: details,
            error=ValueError,
        )
    check_ranks_agree({"settings": "same", "count": 3}, subject="run", advice="")


def test_a_local_error_travels_in_the_same_gather():
    local = "the sampler here is broken" if rank() == 1 else None
    with pytest.raises(RankMismatchError, match=r"^run: rank 1 cannot go on: the sampler here is broken$"):
        check_ranks_agree({"x": 1}, subject="run", advice="", local_error=local)
