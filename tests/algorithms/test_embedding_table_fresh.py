"""``EmbeddingTable``'s fresh rows: a budget per step, stalest first, and each snapshot's anchors and positives,
encoded by the model as it is then; checked against brute force, and exact on resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.algorithms.embedding_table.fresh_rows import FreshRows
from composer_dynsample.models.embed import embed_store
from tests.samplers.helpers import make_run


def test_the_stalest_rows_come_first_never_written_before_any_and_ties_in_row_order():
    written_at = torch.tensor([5, -1, 3, 3, 9, -1, 0, 3])
    expected = sorted(range(8), key=lambda row: (int(written_at[row]), row))
    assert FreshRows(5).stalest(written_at).tolist() == expected[:5]
    assert FreshRows(0).stalest(written_at).numel() == 0


def test_the_drift_is_one_minus_the_mean_cosine_of_the_rows_replaced():
    fresh = FreshRows(2)
    table = torch.tensor([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    written_at = torch.tensor([0, 4, -1])
    new = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    fresh.measure(table, written_at, torch.tensor([0, 1, 2]), new)  # row 2 was never written: not counted
    record = fresh.take_drift()
    assert record["fresh_rows_measured"] == 2
    assert record["fresh_drift"] == pytest.approx(1 - (math.sqrt(0.5) + 1.0) / 2)
    assert math.isnan(fresh.take_drift()["fresh_drift"])  # a new count starts


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_rows_encoded_each_step_are_the_stalest_and_the_current_models_eval_embeddings():
    trainer, _, _, _, table = make_run(table_options={"fresh_rows_per_step": 10})
    chosen = []
    real = table._fresh.stalest

    def checked(written_at):
        rows = real(written_at)
        stamps = written_at.tolist()
        assert rows.tolist() == sorted(range(len(stamps)), key=lambda row: (stamps[row], row))[:10]
        chosen.append(rows)
        return rows

    table._fresh.stalest = checked
    trainer.fit()
    assert len(chosen) == 36  # every step of 3 epochs of 12 batches
    # The last step's fresh rows are stamped after its update: the final model's eval embeddings.
    last = (table.written_at == 36).nonzero().view(-1)
    assert torch.equal(last.sort().values, chosen[-1].sort().values)
    data = trainer.state.train_dataloader.collate_fn.store
    expected = embed_store(trainer.state.model, data, rows=last)
    assert torch.allclose(table.rows[last], expected, atol=1e-6)
    record = table.history[-1]
    assert record["rows_encoded"] == 120 and 0 < record["fresh_drift"] < 2  # 10 rows x 12 steps
    assert record["fresh_rows_measured"] == 120


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_each_snapshot_ranks_its_batches_anchors_encoded_by_the_model_of_that_moment():
    trainer, sampler, _, _, table = make_run(table_options={"fresh_upcoming": True})
    checked = []
    encode, search = table._fresh.encode, sampler._search
    pending = {}

    def spied_encode(model, collate, rows, batch_size, dim):
        # The brute-force rows: the anchors and positives of the batches the snapshot applies to.
        epoch, segment = sampler._reading or (int(trainer.state.timestamp.epoch), 0)
        pairs = sampler._pair_batches.global_batches(epoch)[3 * segment : 3 * segment + 3]
        assert rows.tolist() == sorted(set(pairs.ravel().tolist()))
        pending["rows"] = rows
        pending["expected"] = embed_store(model, collate.store, rows=rows)
        return encode(model, collate, rows, batch_size, dim)

    def spied_search(embeddings, valid):
        rows = pending.pop("rows")
        assert torch.allclose(embeddings[rows], pending.pop("expected"), atol=1e-6)
        checked.append(rows.numel())
        return search(embeddings, valid)

    table._fresh.encode, sampler._search = spied_encode, spied_search
    trainer.fit()
    # Epoch 0's first snapshot comes at its batch 3 (nothing was written before); every later epoch
    # has its start's and 3 refreshes within it: 3 + 4 + 4 snapshots, each of 3 batches' 12 pairs.
    assert checked == [24] * 11
    assert table.history[-1]["rows_encoded"] == 4 * 24


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_mid_epoch_resume_with_fresh_rows_trains_the_same_batches_and_table(tmp_path):
    options = {"fresh_rows_per_step": 6, "fresh_upcoming": True}
    trainer, sampler, full, _, table = make_run(
        table_options=options, save_folder=str(tmp_path), save_interval="4ba"
    )
    trainer.fit()
    trainer.close()
    resumed_trainer, resumed_sampler, resumed, _, resumed_table = make_run(
        table_options=options, load_path=str(tmp_path / "ep1-ba16-rank0.pt")
    )
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[16:]
    assert resumed_table.fingerprint() == table.fingerprint()
    assert resumed_sampler.snapshot_log == sampler.snapshot_log
    # Every epoch's record (epoch 1 resumed at its batch 4): the same counts and drift, timings aside.
    for ours, theirs in zip(resumed_table.history, table.history, strict=True):
        for key in ("rows_encoded", "fresh_rows_measured", "staleness_mean"):
            assert ours[key] == theirs[key], key
        assert np.isclose(ours["fresh_drift"], theirs["fresh_drift"], rtol=1e-12)


def test_bad_fresh_options_are_named():
    with pytest.raises((ValueError, TypeError), match="fresh_rows_per_step"):
        EmbeddingTable(fresh_rows_per_step=-1)
    with pytest.raises((ValueError, TypeError), match="fresh_upcoming"):
        EmbeddingTable(fresh_upcoming="yes")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fresh_upcoming_all_encodes_every_row_so_each_snapshot_holds_the_current_models_lists():
    trainer, _, _, _, table = make_run(table_options={"fresh_upcoming": "all", "list_drift": True})
    encoded, encode = [], table._fresh.encode

    def spied(model, collate, rows, batch_size, dim):
        encoded.append(rows.numel())
        return encode(model, collate, rows, batch_size, dim)

    table._fresh.encode = spied
    trainer.fit()
    # Every snapshot re-encodes the 96 rows, then the list check encodes them once more: 11 snapshots.
    assert encoded == [96, 96] * 11
    checks = [check for record in table.history for check in record["list_drift"]]
    # The table's lists are then exactly the current model's (eval mode, the same search): overlap 1.
    assert [check["overlap_table"] for check in checks] == [1.0] * 11
    assert [check["top1_table"] for check in checks] == [1.0] * 11
    with pytest.raises(ValueError, match='fresh_upcoming must be true, false or "all"'):
        EmbeddingTable(fresh_upcoming="some")
