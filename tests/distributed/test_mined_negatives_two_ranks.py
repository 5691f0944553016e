"""Pair batches with mined corpus negatives on 2 real ranks: one snapshot, one plan, disjoint pair shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from composer import Trainer
from composer.utils import dist

from composer_dynsample import HardNegativeMining
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.data import TensorStore
from composer_dynsample.distributed import stable_hash
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from tests.distributed._helpers import shared_tmp_dir, store_trainer

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

PAIRS, P = 96, 4


def store() -> TensorStore:
    """96 pairs: an anchor near its positive, both near one of 12 topics (so other pairs are near too)."""
    gen = torch.Generator().manual_seed(0)
    topics = torch.randn(12, 6, generator=gen) * 2
    pairs = topics[torch.arange(PAIRS) % 12] + torch.randn(PAIRS, 6, generator=gen)
    features = pairs.repeat_interleave(2, dim=0) + 0.3 * torch.randn(2 * PAIRS, 6, generator=gen)
    return TensorStore(features, torch.arange(2 * PAIRS) // 2)


def sampler(seed: int = 2, **options) -> MinedNegativesPKBatchSampler:
    is_passage = torch.arange(2 * PAIRS) % 2 == 1
    return MinedNegativesPKBatchSampler(
        store().labels, P, 2, is_passage=is_passage, skip_top=1, window=4, seed=seed, **options
    )


def trainer_for(
    batches: MinedNegativesPKBatchSampler, algorithms, seen: dict | None = None, **trainer_options
) -> Trainer:
    from composer.core import Callback

    class Record(Callback):
        def after_dataloader(self, state, logger) -> None:
            if seen is not None:
                rows = state.batch["index"].tolist()
                seen.setdefault(int(state.timestamp.epoch), []).extend(rows[: 2 * P])
                seen.setdefault("batches", []).append((int(state.timestamp.batch), rows))

    return store_trainer(store(), batches, algorithms, Record(), **trainer_options)


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
    ("background", "every", "refreshes"),
    # Inline: refreshes at batches 4 and 8 of the last epoch. In the background, every 3 batches: the
    # epoch start's search applies from batch 3, those started at batches 3 and 6 from 6 and 9.
    [(False, 4, 2), (True, 3, 3)],
    ids=["inline", "background"],
)
def test_refreshes_within_epochs_stay_identical_on_both_ranks_and_resume_exactly(
    background, every, refreshes
):
    folder = shared_tmp_dir()
    # 96 pairs, 4 a batch: 12 batches a rank and epoch.
    options = {"refresh_every": every, "refresh_in_background": background, "max_relative_similarity": None}
    batches, seen = sampler(**options), {}
    table = EmbeddingTable()
    trainer_options = {"save_folder": str(folder), "save_interval": "18ba"}
    trainer_for(batches, [HardNegativeMining("semi_hard"), table], seen, **trainer_options).fit()
    assert batches.refreshes == refreshes
    mine = (batches.snapshot_fingerprint(), table.fingerprint(), [r["sampler"] for r in table.history])
    every_rank = dist.all_gather_object(mine)
    assert every_rank[0] == every_rank[1]
    # Batch 18 is epoch 1, batch 6: inline after that epoch's first refresh, before its second; in the
    # background with the search started at batch 3 not joined yet.
    resumed, resumed_seen = sampler(**options), {}
    trainer_options = {"load_path": str(folder / "ep1-ba18-rank{rank}.pt")}
    algorithms = [HardNegativeMining("semi_hard"), EmbeddingTable()]
    trainer_for(resumed, algorithms, resumed_seen, **trainer_options).fit()
    assert resumed_seen["batches"] == [item for item in seen["batches"] if item[0] >= 18]
    assert resumed.snapshot_fingerprint() == batches.snapshot_fingerprint()
