"""``MinedNegativesPKBatchSampler(refresh_every=N)``: negatives refreshed every N batches within an epoch,
from the table as it is when the DataLoader asks for the batch; exact on resume, with and without workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.samplers.helpers import check_guards, make_run, pairs_data, reference, sampler_for


def test_each_segment_takes_its_negatives_from_the_snapshot_searched_when_it_was_reached():
    labels, is_passage, texts, first = pairs_data(60, 3, duplicates=True)
    snapshots, calls = [], []

    def source():
        emb = torch.randn(120, 4, generator=torch.Generator().manual_seed(100 + len(snapshots)))
        snapshots.append(emb)
        calls.append(len(yielded))
        return emb, None

    sampler = sampler_for(labels, is_passage, texts, 3, 2, window=4, skip_top=1, refresh_every=6)
    sampler.snapshot_source = source
    sampler.update_neighbours(first)
    sampler.set_epoch(1)
    assert len(sampler) == 20  # 60 pairs / 3 per batch: segments of 6, 6, 6 and 2 batches
    yielded = []
    for batch in sampler:
        yielded.append(batch)
    assert calls == [6, 12, 18] and sampler.refreshes == 3  # when the iteration reached batches 6, 12, 18
    batches = np.asarray(yielded)
    assert np.array_equal(batches, sampler.global_batches(1))
    for segment, embeddings in enumerate([first, *snapshots]):
        expected = reference(embeddings, labels, is_passage, 4, 1, 0.95, texts)
        check_guards(batches[6 * segment : 6 * segment + 6], labels, is_passage, texts, 3, 2, expected)
    # The pairs are the epoch's, whatever the refreshes.
    plain = sampler_for(labels, is_passage, texts, 3, 2, window=4, skip_top=1)
    plain.update_neighbours(first)
    plain.set_epoch(1)
    assert np.array_equal(batches[:, :6], plain.global_batches(1)[:, :6])
    # A second pass over the epoch (a resumed one) searches nothing again and yields the same batches.
    assert np.array_equal(np.asarray(list(sampler)), batches) and len(snapshots) == 3
    restored = sampler_for(labels, is_passage, texts, 3, 2, window=4, skip_top=1, refresh_every=6)
    restored.load_state_dict(sampler.state_dict())
    restored.set_epoch(1)
    assert np.array_equal(np.asarray(list(restored)), batches)
    assert restored.snapshot_fingerprint() == sampler.snapshot_fingerprint() != plain.snapshot_fingerprint()
    # A new epoch starts without the old epoch's refreshes, but its fingerprint still tells samplers
    # whose refreshes differed apart (what the next epoch's agreement check across ranks compares).
    other = sampler_for(labels, is_passage, texts, 3, 2, window=4, skip_top=1, refresh_every=6)
    other.snapshot_source = lambda: (first, None)
    other.update_neighbours(first)
    other.set_epoch(1)
    list(other)
    for each in (sampler, other):
        each.update_neighbours(first)
        each.set_epoch(2)
    assert sampler.refreshes == 0 and sampler.snapshot_fingerprint() != other.snapshot_fingerprint()


def test_max_snapshots_also_caps_the_refreshes():
    labels, is_passage, texts, first = pairs_data(40, 4)
    calls = []
    sampler = sampler_for(labels, is_passage, texts, 2, 1, refresh_every=3, max_snapshots=2)
    sampler.snapshot_source = lambda: calls.append(1) or (first, None)
    sampler.update_neighbours(first)
    sampler.set_epoch(1)
    list(sampler)
    assert len(calls) == 1 and sampler.refreshes == 1


def test_an_elastic_resume_is_refused_with_refreshes():
    labels, is_passage, texts, _ = pairs_data(40, 5)
    sampler = sampler_for(labels, is_passage, texts, 2, 1, refresh_every=3)
    with pytest.raises(ValueError, match="resume on the number of ranks it was saved on"):
        sampler.resume_epoch(1, 4, 2)
    with pytest.raises(ValueError, match="refresh_every must be an integer >= 1, got 0"):
        sampler_for(labels, is_passage, texts, 2, 1, refresh_every=0)


# -------------------------------------------------------------------------- through the Trainer
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_refreshes_follow_the_loader_and_a_mid_epoch_resume_trains_the_same_batches(tmp_path, num_workers):
    trainer, sampler, full, searched_at, table = make_run(
        num_workers, save_folder=str(tmp_path / "ck"), save_interval="4ba"
    )
    trainer.fit()
    trainer.close()
    ahead = 2 * num_workers  # batches the loader asks for ahead of the step that trains
    # Epochs 1 and 2 refresh before their batches 3, 6 and 9: the loader asked for batch b after the
    # step of batch b - 1 - ahead wrote the table, or when the epoch's iteration began.
    expected = [12 * epoch + max(b - 1 - ahead, -1) for epoch in (1, 2) for b in (3, 6, 9)]
    assert searched_at[-6:] == expected
    # With workers, epoch 0 asks for its batch 3 before any row is written: nothing to search yet.
    assert [record["sampler"]["refreshes"] for record in table.history] == [3 - bool(num_workers), 3, 3]
    assert len(full.in_order()) == 36
    # Batch 16 is epoch 1, batch 4: its refreshes so far come back from the checkpoint, the later ones
    # are searched again at the same steps of the resumed run.
    resumed_trainer, resumed_sampler, resumed, resumed_at, _ = make_run(
        num_workers, load_path=str(tmp_path / "ck" / "ep1-ba16-rank0.pt")
    )
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[16:]
    assert resumed_sampler.snapshot_fingerprint() == sampler.snapshot_fingerprint()
    assert resumed_at == [step for step in expected if step >= 15]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_writes_staged_to_batch_end_train_and_resume_as_immediate_writes(tmp_path, num_workers):
    # On a GPU the table's rows are copied without waiting and written at BATCH_END (StagedWrites): the
    # sampler must still search the table as the immediate writes left it, and a resume be as exact.
    runs = {}
    for staged in (False, True):
        folder = tmp_path / str(staged)
        trainer, _, recorder, searched_at, table = make_run(
            num_workers, stage_writes=staged, save_folder=str(folder), save_interval="4ba"
        )
        trainer.fit()
        trainer.close()
        runs[staged] = (recorder.in_order(), searched_at, table.rows.clone(), table.written_at.clone())
    assert runs[True][:2] == runs[False][:2]
    assert torch.equal(runs[True][2], runs[False][2]) and torch.equal(runs[True][3], runs[False][3])
    resumed_trainer, _, resumed, _, resumed_table = make_run(
        num_workers, stage_writes=True, load_path=str(tmp_path / "True" / "ep1-ba16-rank0.pt")
    )
    resumed_trainer.fit()
    assert resumed.in_order() == runs[False][0][16:]
    assert torch.equal(resumed_table.rows, runs[False][2])


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_refresh_builds_only_the_segments_the_iteration_reaches(drop_last, monkeypatch):
    """Each segment's negatives are built once, from the snapshot in force there, never for segments a
    later refresh replaces (at 1,000,000 pairs the whole epoch's plan takes seconds: rebuilt at every
    refresh, it stalled the iteration quadratically). On 3 ranks, padded or not, the batches are
    ``rank_batches``'."""
    labels, is_passage, texts, first = pairs_data(62, 3)
    from composer_dynsample.samplers import _segment_plan

    built = []
    build = _segment_plan.plan_negatives
    monkeypatch.setattr(
        _segment_plan,
        "plan_negatives",
        lambda self, pairs, *rest: built.append(len(pairs)) or build(self, pairs, *rest),
    )
    for rank in range(3):
        sampler = sampler_for(
            labels,
            is_passage,
            texts,
            3,
            2,
            window=4,
            refresh_every=2,
            num_replicas=3,
            rank=rank,
            drop_last=drop_last,
        )
        sampler.snapshot_source = lambda: (
            torch.randn(124, 4, generator=torch.Generator().manual_seed(len(built))),
            None,
        )
        sampler.update_neighbours(first)
        sampler.set_epoch(1)
        built.clear()
        yielded = np.asarray(list(sampler))
        segments = -(-len(sampler) // 2)
        # One build per segment reached (a padded rank's last batch wraps to segment 0, built already).
        assert segments - 1 <= len(built) <= segments and sum(built) <= 3 * 2 * segments, built
        assert np.array_equal(yielded, sampler.rank_batches(1)) and sampler.refreshes == segments - 1
