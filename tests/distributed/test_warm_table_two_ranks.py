"""``EmbeddingTable(warm_start=True)`` on 2 real processes over gloo: each rank encodes its share, both hold
the same rows, the first epoch's negatives are mined on both, and a mid-epoch resume is exact."""

from __future__ import annotations

import copy

import pytest
import torch
from composer import Callback
from composer.utils import dist

from composer_dynsample import EmbeddingModel, HardNegativeMining, PKBatchSampler, build_dataloader
from composer_dynsample.algorithms.embedding_table import EmbeddingTable, _training_set
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from tests.common import sgd_trainer
from tests.distributed._helpers import PAIRS, P, sampler, shared_tmp_dir, trainer_for

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


class AtFitStart(Callback):
    """The table's rows and fingerprint right after the table's FIT_START (callbacks run after algorithms)."""

    def __init__(self, table: EmbeddingTable) -> None:
        self.table, self.rows, self.fingerprint = table, None, None

    def fit_start(self, state, logger) -> None:
        self.rows, self.fingerprint = self.table.rows.clone(), self.table.fingerprint()


def test_each_rank_encodes_its_share_and_both_hold_the_direct_encoding(monkeypatch):
    dist.initialize_dist("cpu")
    encoded = []
    embed_store = _training_set.embed_store

    def counting(model, store, **options):
        encoded.append(len(options["rows"]))
        return embed_store(model, store, **options)

    monkeypatch.setattr(_training_set, "embed_store", counting)
    gen = torch.Generator().manual_seed(0)
    store = TensorStore(torch.randn(99, 8, generator=gen), torch.arange(99) % 9)  # shares of 50 and 49
    torch.manual_seed(0)  # the same starting weights on both ranks
    layers = [torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)]
    model = EmbeddingModel(torch.nn.Sequential(*layers))
    start = copy.deepcopy(model).eval()
    table = EmbeddingTable(warm_start=True, refresh_batch_size=16)
    probe = AtFitStart(table)
    loader = build_dataloader(
        IndexDataset(store.labels),
        PKBatchSampler(store.labels, 4, 4, seed=3),
        collate_fn=GatherCollate(store),
    )
    sgd_trainer(
        model, loader, lr=0.1, algorithms=[table], callbacks=[probe], max_duration="1ep", seed=0
    ).fit()
    assert encoded == [50 - dist.get_global_rank()]  # rows rank, rank + 2, ...: once each over the ranks
    fingerprints = dist.all_gather_object(probe.fingerprint)
    assert fingerprints[0] == fingerprints[1]
    with torch.no_grad():
        torch.testing.assert_close(probe.rows, start.embed(store.features), rtol=1e-5, atol=1e-6)
    assert table.warm_start_cost["rows_encoded"] == 99


def test_the_first_epoch_is_mined_on_both_ranks_and_a_mid_epoch_resume_is_exact():
    folder = shared_tmp_dir()
    batches, seen, table = sampler(), {}, EmbeddingTable(warm_start=True)
    options = {"save_folder": str(folder), "save_interval": "6ba"}
    trainer_for(batches, [HardNegativeMining("semi_hard"), table], seen, **options).fit()
    assert table.history[0]["sampler"]["no_embedding"] == 0  # 12 batches of 4 anchors a rank, all mined
    assert [record["rows_encoded"] for record in table.history] == [2 * PAIRS, 0, 0]
    mine = (batches.snapshot_fingerprint(), table.fingerprint(), [r["sampler"] for r in table.history])
    every_rank = dist.all_gather_object(mine)
    assert every_rank[0] == every_rank[1]
    # Batch 6 is epoch 0, batch 6: the warm snapshot's epoch, from the checkpoint; nothing is encoded again.
    resumed, resumed_seen, resumed_table = sampler(), {}, EmbeddingTable(warm_start=True)
    options = {"load_path": str(folder / "ep0-ba6-rank{rank}.pt")}
    trainer_for(resumed, [HardNegativeMining("semi_hard"), resumed_table], resumed_seen, **options).fit()
    assert resumed_seen["batches"] == [item for item in seen["batches"] if item[0] >= 6]
    assert len(resumed_seen["batches"]) == 3 * PAIRS // (2 * P) - 6
    assert resumed_table.fingerprint() == table.fingerprint()
    assert resumed_table.warm_start_cost["rows_encoded"] == 2 * PAIRS
