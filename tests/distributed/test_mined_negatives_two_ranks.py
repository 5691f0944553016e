"""Pair batches with mined corpus negatives on 2 real ranks: one snapshot, one plan, disjoint pair shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from composer.utils import dist

from composer_dynsample import HardNegativeMining
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.distributed import stable_hash
from tests.distributed._helpers import PAIRS, P, sampler, shared_tmp_dir, trainer_for

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


def test_the_table_gives_both_ranks_one_snapshot_one_plan_and_disjoint_pair_shards():
    batches, seen = sampler(), {}
    trainer_for(batches, [HardNegativeMining("semi_hard"), EmbeddingTable()], seen).fit()
    assert batches.guard_counts()["no_embedding"] < batches.num_global_batches * P  # mined, not all random
    mine = (batches.snapshot_fingerprint(), stable_hash(batches.global_batches(2)), batches.guard_counts())
    every_rank = dist.all_gather_object(mine)
    assert every_rank[0] == every_rank[1] and every_rank[0][0] != ""
    shards = dist.all_gather_object(seen)
    for epoch in (0, 1, 2):
        assert not set(shards[0][epoch]) & set(shards[1][epoch])


def test_the_same_snapshot_gives_the_same_plan_on_both_ranks():
    embeddings = torch.randn(2 * PAIRS, 5, generator=torch.Generator().manual_seed(7))  # equal on both ranks
    batches = sampler()
    batches.update_neighbours(embeddings)
    batches.set_epoch(1)
    plans = dist.all_gather_object((batches.snapshot_fingerprint(), batches.fingerprints(1)))
    assert plans[0] == plans[1]
    shards = dist.all_gather_object(np.asarray(list(batches))[:, : 2 * P].ravel().tolist())
    assert not set(shards[0]) & set(shards[1])


def test_ranks_with_different_snapshots_are_caught():
    batches = sampler()
    generator = torch.Generator().manual_seed(dist.get_global_rank())
    batches.update_neighbours(torch.randn(2 * PAIRS, 4, generator=generator))  # one per rank: a bug
    with pytest.raises(RuntimeError, match=r"ranks \[1\] disagree with rank 0 .*snapshot"):
        trainer_for(batches, []).fit()


@pytest.mark.parametrize(
    ("background", "every", "refreshes", "sampling"),
    # Inline: refreshes at batches 4 and 8 of the last epoch. In the background, every 3 batches: the
    # epoch start's search applies from batch 3, those started at batches 3 and 6 from 6 and 9. Sampled:
    # the window by softmax and the candidates above the positive dropped (absolute_margin 0).
    # Fresh: the table re-encodes 8 rows a step and each snapshot's anchors and positives first.
    [
        (False, 4, 2, {}),
        (True, 3, 3, {}),
        (False, 4, 2, {"sampling": "softmax", "absolute_margin": 0.0}),
        (True, 3, 3, {"fresh": {"fresh_rows_per_step": 8, "fresh_upcoming": True, "list_drift": True}}),
    ],
    ids=["inline", "background", "softmax_margin", "fresh"],
)
def test_refreshes_within_epochs_stay_identical_on_both_ranks_and_resume_exactly(
    background, every, refreshes, sampling
):
    sampling = dict(sampling)
    fresh = sampling.pop("fresh", {})
    folder = shared_tmp_dir()
    # 96 pairs, 4 a batch: 12 batches a rank and epoch.
    options = {"refresh_every": every, "refresh_in_background": background, "max_relative_similarity": None}
    options.update(sampling)
    batches, seen = sampler(**options), {}
    table = EmbeddingTable(**fresh)
    trainer_options = {"save_folder": str(folder), "save_interval": "18ba"}
    trainer_for(batches, [HardNegativeMining("semi_hard"), table], seen, **trainer_options).fit()
    assert batches.refreshes == refreshes
    drift = [
        [{k: v for k, v in c.items() if k != "seconds"} for c in r.get("list_drift", [])]
        for r in table.history
    ]
    mine = (batches.snapshot_fingerprint(), table.fingerprint(), [r["sampler"] for r in table.history], drift)
    every_rank = dist.all_gather_object(mine)
    assert every_rank[0] == every_rank[1]
    # Batch 18 is epoch 1, batch 6: inline after that epoch's first refresh, before its second; in the
    # background with the search started at batch 3 not joined yet.
    resumed, resumed_seen = sampler(**options), {}
    trainer_options = {"load_path": str(folder / "ep1-ba18-rank{rank}.pt")}
    resumed_table = EmbeddingTable(**fresh)
    trainer_for(
        resumed, [HardNegativeMining("semi_hard"), resumed_table], resumed_seen, **trainer_options
    ).fit()
    assert resumed_seen["batches"] == [item for item in seen["batches"] if item[0] >= 18]
    assert resumed.snapshot_fingerprint() == batches.snapshot_fingerprint()
    assert resumed.snapshot_log == batches.snapshot_log  # the refreshes' diagnostics, resumed too
    assert resumed_table.fingerprint() == table.fingerprint()
    if fresh:  # the drift of what the fresh encodings replaced: the same on both ranks, and measured
        assert table.history[-1]["fresh_rows_measured"] > 0
        assert sum(map(len, drift)) == len(batches.snapshot_log)  # a list check at every snapshot
