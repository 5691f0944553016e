"""Hard-class batches on 2 real ranks: the table gives both ranks one snapshot; different snapshots are caught."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.utils import dist

from composer_dynsample import HardNegativeMining
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.data import TensorStore
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
from tests.distributed._helpers import store_trainer

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


def store() -> TensorStore:
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(480) % 20
    centres = torch.randn(20, 6, generator=gen) * 2
    return TensorStore(centres[labels] + torch.randn(480, 6, generator=gen), labels)


class IndexLog:
    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}


def trainer_for(sampler, algorithms, log: IndexLog | None = None) -> Trainer:
    from composer.core import Callback

    class Record(Callback):
        def after_dataloader(self, state, logger) -> None:
            if log is not None:
                log.seen.setdefault(int(state.timestamp.epoch), []).extend(state.batch["index"].tolist())

    return store_trainer(store(), sampler, algorithms, Record())


def test_the_table_gives_both_ranks_the_same_snapshot_and_disjoint_shards():
    sampler = HardClassPKBatchSampler(store().labels, 4, 3, seed=2)
    log = IndexLog()
    trainer_for(sampler, [HardNegativeMining("semi_hard"), EmbeddingTable()], log).fit()
    fingerprints = dist.all_gather_object(sampler.snapshot_fingerprint())
    assert fingerprints[0] == fingerprints[1] != ""
    every_rank = dist.all_gather_object(log.seen)
    for epoch in (1, 2):  # the hard-class epochs
        assert not set(every_rank[0][epoch]) & set(every_rank[1][epoch])


def test_ranks_with_different_snapshots_are_caught():
    sampler = HardClassPKBatchSampler(store().labels, 4, 3, seed=2)
    generator = torch.Generator().manual_seed(dist.get_global_rank())
    sampler.update_class_embeddings(torch.randn(20, 4, generator=generator))  # one per rank: a bug
    with pytest.raises(RuntimeError, match=r"ranks \[1\] disagree with rank 0 .*snapshot"):
        trainer_for(sampler, []).fit()
