"""``EmbeddingTable(list_drift=True)``: at each snapshot, the table's candidate lists (and the first snapshot's)
against those of every row encoded afresh by the model of that moment; checked against brute force, a run
that trains exactly as without it, and exact on resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.algorithms.embedding_table.list_drift import list_overlap
from composer_dynsample.models.embed import embed_store
from composer_dynsample.samplers._candidates import CorpusCandidates
from tests.samplers.helpers import make_run


def _found(ranked: np.ndarray, kept: np.ndarray, searched: np.ndarray) -> CorpusCandidates:
    return CorpusCandidates(ranked, kept, np.zeros((len(ranked), 4), np.int64), searched)


def _brute_overlap(held: CorpusCandidates, current: CorpusCandidates) -> tuple[float, float, int]:
    overlaps, firsts = [], []
    for anchor in range(len(current.ranked)):
        if not (held.searched[anchor] and current.searched[anchor]):
            continue
        now = [int(r) for r, k in zip(current.ranked[anchor], current.kept[anchor]) if k]
        then = [int(r) for r, k in zip(held.ranked[anchor], held.kept[anchor]) if k]
        if not now:
            continue
        overlaps.append(sum(row in set(then) for row in now) / len(now))
        firsts.append(bool(then) and then[0] == now[0])
    return (
        (sum(overlaps) / len(overlaps), sum(firsts) / len(firsts), len(overlaps))
        if overlaps
        else (None, None, 0)
    )


def test_the_overlap_of_lists_equals_brute_force_on_random_lists():
    rng = np.random.default_rng(0)
    for _ in range(20):
        anchors, width = 30, 6
        lists = [np.stack([rng.permutation(12)[:width] for _ in range(anchors)]) for _ in range(2)]
        kept = [rng.random((anchors, width)) < 0.7 for _ in range(2)]
        searched = [rng.random(anchors) < 0.9 for _ in range(2)]
        held, current = (_found(lists[i], kept[i], searched[i]) for i in range(2))
        overlap, top1, count = list_overlap(held, current)
        expected = _brute_overlap(held, current)
        assert count == expected[2]
        assert overlap == pytest.approx(expected[0]) and top1 == pytest.approx(expected[1])


def test_lists_without_a_common_searched_anchor_have_no_overlap():
    ranked = np.array([[1, 2]])
    none = list_overlap(
        _found(ranked, np.ones((1, 2), bool), np.array([False])),
        _found(ranked, np.ones((1, 2), bool), np.array([True])),
    )
    assert np.isnan(none[0]) and np.isnan(none[1]) and none[2] == 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_each_snapshot_is_compared_with_the_lists_of_the_current_models_fresh_rows():
    trainer, sampler, _, _, table = make_run(table_options={"list_drift": True})
    store = trainer.state.train_dataloader.collate_fn.store
    check, expected = table._drift.check, []

    def spied(sampler_, rows, valid, encode, *, epoch, step):
        # Brute force: every row embedded by the model as it is now, searched by the sampler's own search.
        fresh = embed_store(trainer.state.model, store, rows=torch.arange(rows.shape[0]))
        held, current = sampler.search_corpus(rows, valid), sampler.search_corpus(fresh, None)
        expected.append(_brute_overlap(held, current))
        if len(expected) == 1:
            expected.append(_brute_overlap(held, current))  # the first snapshot's lists are the table's
        else:
            expected.append(_brute_overlap(first[0], current))
        first.append(held)
        return check(sampler_, rows, valid, encode, epoch=epoch, step=step)

    first: list[CorpusCandidates] = []
    table._drift.check = spied
    trainer.fit()
    records = [record for epoch in table.history for record in epoch["list_drift"]]
    # One check per snapshot: epoch 0's first at its batch 3, then each later epoch's start and 3 refreshes.
    assert len(records) == 11 == len(sampler.snapshot_log)
    for record, table_lists, first_lists in zip(records, expected[0::2], expected[1::2], strict=True):
        assert record["overlap_table"] == pytest.approx(table_lists[0])
        assert record["top1_table"] == pytest.approx(table_lists[1])
        assert record["overlap_first"] == pytest.approx(first_lists[0])
        assert record["anchors"] == table_lists[2] and record["rows_encoded"] == 96
    assert records[0]["overlap_first"] == records[0]["overlap_table"]
    assert all(0 <= r["overlap_table"] <= 1 and 0 <= r["top1_first"] <= 1 for r in records)
    assert records[-1]["overlap_table"] < 1  # the model moved since the rows were written


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_diagnostic_changes_nothing_the_run_trains():
    runs = []
    for options in ({}, {"list_drift": True}):
        trainer, sampler, seen, _, table = make_run(table_options=options)
        trainer.fit()
        weights = torch.cat([p.detach().flatten() for p in trainer.state.model.parameters()])
        runs.append((seen.in_order(), table.fingerprint(), sampler.snapshot_log, weights))
    assert runs[0][:3] == runs[1][:3]
    assert torch.equal(runs[0][3], runs[1][3])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_mid_epoch_resume_keeps_the_first_lists_and_the_records(tmp_path):
    options = {"list_drift": True}
    trainer, _, _, _, table = make_run(table_options=options, save_folder=str(tmp_path), save_interval="4ba")
    trainer.fit()
    trainer.close()
    resumed_trainer, _, _, _, resumed = make_run(
        table_options=options, load_path=str(tmp_path / "ep1-ba16-rank0.pt")
    )
    resumed_trainer.fit()
    drop = ("seconds",)
    for ours, theirs in zip(resumed.history, table.history, strict=True):
        assert [{k: v for k, v in r.items() if k not in drop} for r in ours["list_drift"]] == [
            {k: v for k, v in r.items() if k not in drop} for r in theirs["list_drift"]
        ]


def test_a_bad_list_drift_option_is_named():
    with pytest.raises((ValueError, TypeError), match="list_drift"):
        EmbeddingTable(list_drift="yes")
