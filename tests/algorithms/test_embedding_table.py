"""``EmbeddingTable``: rows written by the forward pass, against references, through the Trainer and on resume."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.loggers import InMemoryLogger

from composer_dynsample import EmbeddingModel, HardNegativeMining, PKBatchSampler, build_dataloader
from composer_dynsample.algorithms.embedding_table import EmbeddingTable, class_centroids, write_rows
from composer_dynsample.checkpoints import CheckpointError
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("seed", range(5))
def test_write_rows_equals_a_sequential_write(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, written = torch.zeros(20, 3), torch.full((20,), -1)
    expected_rows, expected_written = rows.clone(), written.clone()
    for step in range(6):
        indices = torch.randint(-1, 20, (15,), generator=gen)  # repeats, and -1 as padding
        embeddings = torch.randn(15, 3, generator=gen)
        write_rows(rows, written, indices, embeddings, step)
        for i, embedding in zip(indices.tolist(), embeddings):
            if i >= 0:
                expected_rows[i], expected_written[i] = embedding, step
    assert torch.equal(rows, expected_rows) and torch.equal(written, expected_written)


def test_class_centroids_equal_a_loop():
    gen = torch.Generator().manual_seed(0)
    rows, labels = torch.randn(30, 4, generator=gen), torch.randint(0, 5, (30,), generator=gen)
    written = torch.where(torch.rand(30, generator=gen) < 0.7, 3, -1)
    centroids, counts = class_centroids(rows, written, labels, 6)
    for c in range(6):
        members = rows[(labels == c) & (written >= 0)]
        assert int(counts[c]) == len(members)
        expected = members.mean(0) if len(members) else torch.zeros(4)
        assert torch.allclose(centroids[c], expected, atol=1e-6)


def make_trainer(
    tmp_path, *, algorithms, lr=0.0, duration="1ep", load_path=None, loggers=(), items=64, **kwargs
):
    gen = torch.Generator().manual_seed(0)
    store = TensorStore(torch.randn(items, 8, generator=gen), torch.arange(items) % 8)
    torch.manual_seed(0)
    model = EmbeddingModel(torch.nn.Linear(8, 4))
    sampler = PKBatchSampler(store.labels, 4, 4, seed=1)
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=GatherCollate(store))
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=torch.optim.SGD(model.parameters(), lr=lr),
        algorithms=list(algorithms),
        loggers=list(loggers),
        max_duration=duration,
        save_folder=str(tmp_path / "checkpoints") if load_path is None else None,
        save_interval="1ep",
        load_path=load_path,
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    return trainer, store, sampler, model


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_forward_pass_writes_every_visited_row(tmp_path, dtype):
    table = EmbeddingTable(dtype=dtype)
    trainer, store, sampler, model = make_trainer(tmp_path, algorithms=[table])
    trainer.fit()
    with torch.no_grad():
        expected = model.embed(store.features)  # lr=0: the weights every forward pass used
    last_step = torch.full((64,), -1)
    for step, batch in enumerate(sampler.rank_batches(0).tolist(), start=0):
        last_step[batch] = step
    visited = last_step >= 0
    assert table.rows is not None and table.rows.dtype == getattr(torch, dtype) and table.num_items == 64
    tolerance = 1e-3 if dtype == "float16" else 1e-6
    assert torch.allclose(table.rows[visited].float(), expected[visited], atol=tolerance)
    assert torch.equal(table.written_at, last_step)  # the batch counter before the step's increment
    assert bool((table.rows[~visited] == 0).all())


def test_the_table_reads_the_embeddings_of_a_mined_batch(tmp_path):
    table = EmbeddingTable()
    trainer, store, _, model = make_trainer(tmp_path, algorithms=[HardNegativeMining("semi_hard"), table])
    trainer.fit()
    visited = table.written_at >= 0
    with torch.no_grad():
        assert torch.allclose(table.rows[visited], model.embed(store.features)[visited], atol=1e-6)


def test_resume_restores_the_table_exactly(tmp_path):
    straight, *_ = make_trainer(tmp_path / "a", algorithms=[EmbeddingTable()], lr=0.1, duration="3ep")
    straight.fit()
    first, *_ = make_trainer(tmp_path / "b", algorithms=[EmbeddingTable()], lr=0.1, duration="2ep")
    first.fit()
    checkpoint = str(tmp_path / "b" / "checkpoints" / "latest-rank0.pt")
    resumed_table = EmbeddingTable()
    resumed, *_ = make_trainer(
        tmp_path / "c", algorithms=[resumed_table], lr=0.1, duration="3ep", load_path=checkpoint
    )
    assert resumed_table.rows is not None  # restored from the checkpoint before training
    resumed.fit()
    (straight_table,) = [a for a in straight.state.algorithms if isinstance(a, EmbeddingTable)]
    assert torch.equal(resumed_table.written_at, straight_table.written_at)
    assert torch.equal(resumed_table.rows, straight_table.rows)
    assert resumed_table.fingerprint() == straight_table.fingerprint()


@pytest.mark.parametrize("num_items", [None, 32])
def test_a_resume_on_another_training_set_is_refused(tmp_path, num_items):
    # Without num_items the size is read off the dataset at FIT_START, after Composer loaded the 64-row
    # table: the mismatch went unnoticed (or raised an IndexError in a model-aware sampler).
    first, *_ = make_trainer(tmp_path / "b", algorithms=[EmbeddingTable()])
    first.fit()
    checkpoint = str(tmp_path / "b" / "checkpoints" / "latest-rank0.pt")
    with pytest.raises(CheckpointError, match="embedding table has 64 rows, this run's training set 32"):
        table = EmbeddingTable(num_items=num_items)
        resumed, *_ = make_trainer(
            tmp_path / "c", algorithms=[table], duration="2ep", load_path=checkpoint, items=32
        )
        resumed.fit()


def test_refresh_re_embeds_old_rows_in_eval_mode_and_logs_its_cost(tmp_path):
    logger = InMemoryLogger()
    table = EmbeddingTable(refresh_interval="1ep", refresh_max_age=0)
    trainer, store, _, model = make_trainer(tmp_path, algorithms=[table], duration="2ep", loggers=[logger])
    trainer.fit()
    assert table.written_at is not None and bool(
        (table.written_at >= 0).all()
    )  # unvisited rows refreshed too
    with torch.no_grad():
        assert torch.allclose(table.rows, model.embed(store.features), atol=1e-6)
    refreshed = [value for _, value in logger.data["embedding_table/refreshed_rows"]]
    assert refreshed == [64.0]  # epoch 1 only: every row was older than 0 batches
    assert logger.data["embedding_table/refresh_seconds"][0][1] >= 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"num_items": 0}, "num_items must be an integer >= 1"),
        ({"refresh_interval": "10ba"}, "refresh_interval must be a Composer time string such as '2ep'"),
        ({"refresh_max_age": -1}, "refresh_max_age must be an integer >= 0"),
        ({"index_key": ""}, "index_key must be a non-empty string"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EmbeddingTable(**kwargs)


def test_a_table_smaller_than_the_data_and_a_batch_without_indices_are_named(tmp_path):
    trainer, *_ = make_trainer(tmp_path / "small", algorithms=[EmbeddingTable(num_items=10)])
    with pytest.raises(IndexError, match="outside a table of 10 rows"):
        trainer.fit()
    with pytest.raises(ValueError, match="the batch has no 'sample_id' tensor"):
        make_trainer(tmp_path / "key", algorithms=[EmbeddingTable(index_key="sample_id")])[0].fit()


def test_staleness_at_every_epoch_end_equals_the_ages_of_the_written_rows(tmp_path):
    # 64 rows, 4 batches an epoch of 16: every row is written once an epoch, at a batch of its own.
    logger = InMemoryLogger()
    table = EmbeddingTable()
    trainer, _, sampler, _ = make_trainer(
        tmp_path, algorithms=[table], lr=0.1, duration="3ep", loggers=[logger]
    )
    trainer.fit()
    assert [record["epoch"] for record in table.history] == [1, 2, 3]
    written = torch.full((64,), -1)
    for epoch, record in enumerate(table.history):
        for batch_in_epoch, batch in enumerate(sampler.rank_batches(epoch).tolist()):
            written[batch] = 4 * epoch + batch_in_epoch
        ages = (record["step"] - written[written >= 0]).double()
        assert record["step"] == 4 * (epoch + 1)
        assert record["rows_written"] == int((written >= 0).sum())
        assert record["staleness_mean"] == pytest.approx(float(ages.mean()))
        assert record["staleness_max"] == float(ages.max())
    logged = [value for _, value in logger.data["embedding_table/staleness_max"]]
    assert logged == [record["staleness_max"] for record in table.history]
    # The history is part of the checkpoint: a resumed run reports every epoch.
    resumed_table = EmbeddingTable()
    resumed, *_ = make_trainer(
        tmp_path / "c",
        algorithms=[resumed_table],
        lr=0.1,
        duration="4ep",
        load_path=str(tmp_path / "checkpoints" / "latest-rank0.pt"),
    )
    resumed.fit()
    assert resumed_table.history[:3] == table.history and resumed_table.history[3]["epoch"] == 4


def test_an_empty_table_reports_no_staleness():
    assert EmbeddingTable().staleness(5)["rows_written"] == 0.0
