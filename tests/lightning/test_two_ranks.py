"""The Lightning callback on 2 CPU ranks under Lightning's own DDP launcher.

One subprocess (``python -m tests.lightning.ddp_run``) does every run on both ranks, and each rank writes
the batches it trained; the tests read them. Without the callback every epoch repeats the first one's
batches, since Lightning never sets a batch sampler's epoch; with Lightning's default
``use_distributed_sampler=True`` the fit fails with an error that says what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lightning.common import planned_batches

RUNS = ("early", "callback", "plain", "checkpointed", "resume-boundary", "resume-mid", "default", "mismatch")
REPO = Path(__file__).resolve().parents[2]
EPOCHS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """``{run: [rank 0's record, rank 1's record]}`` for every run of ddp_run.py."""
    out = tmp_path_factory.mktemp("lightning_ddp")
    launcher_env = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {key: value for key, value in os.environ.items() if key not in launcher_env}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "tests.lightning.ddp_run", str(out), *RUNS]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        run: [json.loads((out / run / f"rank{rank}.json").read_text()) for rank in (0, 1)] for run in RUNS
    }


def batches(record: dict[str, Any], epoch: int) -> list[list[int]]:
    return [indices for _, indices in record[str(epoch)]]


def test_each_rank_trains_its_share_of_the_planned_epoch(runs):
    for rank, record in enumerate(runs["callback"]):
        for epoch in EPOCHS:
            assert batches(record, epoch) == planned_batches(epoch, rank, world_size=2)


def test_epochs_differ_and_ranks_are_disjoint(runs):
    rank0, rank1 = runs["callback"]
    assert len({str(batches(rank0, epoch)) for epoch in EPOCHS}) == 3
    for epoch in EPOCHS:
        mine = {i for batch in batches(rank0, epoch) for i in batch}
        theirs = {i for batch in batches(rank1, epoch) for i in batch}
        assert mine and theirs and not mine & theirs


def test_without_the_callback_every_epoch_repeats_the_first(runs):
    for record in runs["plain"]:
        assert batches(record, 1) == batches(record, 0) == batches(record, 2)


def test_a_resume_at_an_epoch_boundary_trains_the_uninterrupted_batches(runs):
    for resumed, uninterrupted in zip(runs["resume-boundary"], runs["callback"]):
        assert sorted(resumed) == ["1", "2"]
        for epoch in (1, 2):
            assert batches(resumed, epoch) == batches(uninterrupted, epoch)


def test_a_resume_mid_epoch_trains_the_rest_of_the_epoch_once(runs):
    # The checkpoint after step 8: epoch 1 with 2 of its 6 batches per rank trained.
    for before, resumed, uninterrupted in zip(runs["checkpointed"], runs["resume-mid"], runs["callback"]):
        assert [batch_idx for batch_idx, _ in resumed["1"]] == [2, 3, 4, 5]
        assert batches(before, 1)[:2] + batches(resumed, 1) == batches(uninterrupted, 1)
        assert batches(resumed, 2) == batches(uninterrupted, 2)


def test_lightning_default_trainer_says_what_to_do(runs):
    for record in runs["default"]:
        message = record["error"]
        assert message.startswith("TypeError: PKBatchSampler cannot be rebuilt around a DistributedSampler")
        assert "use_distributed_sampler=False" in message
        assert "composer_dynsample.lightning.SetSamplerEpoch()" in message


def test_a_sampler_built_before_the_process_group_is_refused_on_every_rank(runs):
    # Rank 0 built it for 1 rank (no WORLD_SIZE yet), rank 1 as rank 0 of 2 (no RANK).
    for record in runs["early"]:
        message = record["error"]
        assert (
            "rank 0 cannot go on: its train sampler was built with num_replicas=1, rank=0, but it is rank 0 of 2"
            in message
        )
        assert "Build the sampler inside train_dataloader()" in message


def test_ranks_whose_samplers_differ_fail_together(runs):
    for record in runs["mismatch"]:
        assert (
            "SetSamplerEpoch, epoch 0: ranks [1] disagree with rank 0 on the train sampler's seed"
            in record["error"]
        )
