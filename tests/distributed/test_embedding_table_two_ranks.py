"""``EmbeddingTable`` on 2 real processes over gloo: every rank holds the same table, with every rank's rows."""

from __future__ import annotations

import pytest
import torch
from composer import Callback, Trainer
from composer.utils import dist

from composer_dynsample import EmbeddingModel, PKBatchSampler, build_dataloader
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from composer_dynsample.distributed import all_gather_rows, broadcast_buffers, unwrap_model
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


def _fit(model, store, sampler, table, duration, callbacks=()) -> None:
    """Train ``model`` with the table for ``duration`` at lr 0: the weights stay, BatchNorm statistics move."""
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=GatherCollate(store))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=optimizer,
        algorithms=[table],
        callbacks=list(callbacks),
        max_duration=duration,
        progress_bar=False,
        seed=0,
    ).fit()


@pytest.mark.parametrize("refresh", [False, True])
def test_the_table_is_identical_on_every_rank_and_holds_every_ranks_rows(tmp_path, refresh):
    dist.initialize_dist("cpu")
    gen = torch.Generator().manual_seed(0)
    store = TensorStore(torch.randn(96, 8, generator=gen), torch.arange(96) % 8)
    torch.manual_seed(0)  # the same initial weights on both ranks; lr=0 keeps them
    model = EmbeddingModel(torch.nn.Linear(8, 4))
    sampler = PKBatchSampler(store.labels, 4, 4, seed=3)
    table = EmbeddingTable(refresh_interval="1ep" if refresh else None)
    _fit(model, store, sampler, table, "2ep" if refresh else "1ep")
    # Both ranks' tables are byte-identical.
    digest = torch.tensor(list(bytes.fromhex(table.fingerprint())), dtype=torch.int64)
    digests = all_gather_rows(digest)
    assert torch.equal(digests[0], digests[1])
    # Every row a rank trained on is in the table: the global batches of epoch 0, over both ranks.
    visited = torch.zeros(96, dtype=torch.bool)
    visited[torch.as_tensor(sampler.global_batches(0)[: len(sampler) * 2]).view(-1)] = True
    with torch.no_grad():
        expected = model.embed(store.features)
    written = table.written_at >= 0
    if refresh:
        assert bool(written.all())
    else:
        assert torch.equal(written, visited)
    assert torch.allclose(table.rows[written], expected[written], atol=1e-6)


class AfterRefresh(Callback):
    """At epoch 1's start, after the table's refresh: the table and rank 0's model in eval mode."""

    def __init__(self, table: EmbeddingTable, store: TensorStore) -> None:
        self.table, self.store, self.seen = table, store, None

    def epoch_start(self, state, logger) -> None:
        if int(state.timestamp.epoch) != 1:
            return
        model = unwrap_model(state.model)
        broadcast_buffers(model)  # a no-op when the refresh already used rank 0's statistics
        model.eval()
        with torch.no_grad():
            expected = model.embed(self.store.features)
        model.train()
        self.seen = (self.table.rows.clone(), expected)


def test_the_refresh_embeds_with_rank_0s_batchnorm_statistics():
    # Each rank's training forward updates its own BatchNorm statistics; the refresh used them for its
    # share of the rows, so rank 1's rows came from statistics that no checkpoint holds (a resume then
    # refreshed differently). It now embeds with rank 0's, as the evaluation does.
    dist.initialize_dist("cpu")
    gen = torch.Generator().manual_seed(0)
    store = TensorStore(torch.randn(96, 8, generator=gen), torch.arange(96) % 8)
    torch.manual_seed(0)
    model = EmbeddingModel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    )
    table = EmbeddingTable(refresh_interval="1ep")
    probe = AfterRefresh(table, store)
    _fit(model, store, PKBatchSampler(store.labels, 4, 4, seed=3), table, "2ep", callbacks=[probe])
    rows, expected = probe.seen
    assert torch.allclose(rows, expected, atol=1e-6)


def test_a_node_file_table_is_one_copy_both_ranks_see_and_trains_as_in_memory():
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir(prefix="dynsample-node-table-")
    gen = torch.Generator().manual_seed(0)
    store = TensorStore(torch.randn(96, 8, generator=gen), torch.arange(96) % 8)
    tables = {}
    for name, options in (("memory", {}), ("node", {"storage_dir": str(folder / "table")})):
        torch.manual_seed(0)
        model = EmbeddingModel(torch.nn.Linear(8, 4))
        tables[name] = EmbeddingTable(refresh_interval="1ep", **options)
        _fit(model, store, PKBatchSampler(store.labels, 4, 4, seed=3), tables[name], "2ep")
    memory, node = tables["memory"], tables["node"]
    assert torch.equal(node.rows, memory.rows) and node.fingerprint() == memory.fingerprint()
    names = dist.all_gather_object(node.rows.untyped_storage().filename)
    assert names[0] == names[1] and names[0] is not None  # one file (unlinked since) for the node's ranks
    dist.barrier()
    if dist.get_global_rank() == 1:
        node.rows[0] = 7.0  # written by rank 1 only ...
    dist.barrier()
    assert bool((node.rows[0] == 7.0).all())  # ... and seen by rank 0: one copy of the table per node
