"""``MinedNegativesPKBatchSampler(refresh_in_background=True)``: each refresh searched beside training, on
a copy of the rows taken at a fixed batch, and applied one segment later; exact on resume."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tests.samplers.helpers import check_guards, make_run, pairs_data, reference, sampler_for

# 60 pairs, 3 a batch: 20 batches an epoch, segments of 6, 6, 6 and 2 batches. In the background a search
# started at batch 6 applies from batch 12, one started at 12 from 18; one started at 18 would apply from
# 24, past the epoch's end, so it is not started.
P, N, R = 3, 2, 6
OPTIONS = {"window": 4, "skip_top": 1, "refresh_every": R}


def rows(seed: int) -> torch.Tensor:
    return torch.randn(120, 4, generator=torch.Generator().manual_seed(seed))


def data():
    return pairs_data(60, 3, duplicates=True)


def background(labels, is_passage, texts, **options):
    return sampler_for(labels, is_passage, texts, P, N, refresh_in_background=True, **OPTIONS, **options)


def iterate(sampler, source, epoch: int, handed_over: torch.Tensor | None = None) -> np.ndarray:
    """One epoch of ``sampler`` (after the epoch start hands over ``handed_over``); ``source(batch)`` gives
    the rows its refresh reads when the iteration reaches ``batch``."""
    yielded: list[list[int]] = []
    sampler.snapshot_source = lambda: source(len(yielded))
    if handed_over is not None:
        sampler.update_neighbours(handed_over)
    sampler.set_epoch(epoch)
    for batch in sampler:
        yielded.append(batch)
    return np.asarray(yielded)


def test_background_batches_are_the_inline_ones_one_segment_later():
    labels, is_passage, texts, first = data()
    frozen, asked_at = {}, []

    def table(batch):  # a new state of the table each time it is read
        asked_at.append(batch)
        frozen[len(asked_at)] = rows(100 + len(asked_at))
        return frozen[len(asked_at)], None

    ours = background(labels, is_passage, texts)
    ours.update_neighbours(first)  # the run's first snapshot: searched inline, as without the option
    assert ours._pending is not None and not ours._background.busy()
    epoch_one = iterate(ours, table, 1)
    assert asked_at == [6, 12] and ours.refreshes == 2  # the ones applied from batches 12 and 18
    handed_over = rows(7)
    epoch_two = iterate(ours, table, 2, handed_over)
    assert asked_at == [6, 12, 6, 12] and ours.refreshes == 3  # the epoch start's, from batch 6
    # An inline sampler whose refresh at batch k * R reads the rows the background one read at (k - 1) * R.
    inline = sampler_for(labels, is_passage, texts, P, N, **OPTIONS)
    inline.update_neighbours(first)
    shifted = {(1, 6): None, (1, 12): frozen[1], (1, 18): frozen[2]}
    shifted.update({(2, 6): handed_over, (2, 12): frozen[3], (2, 18): frozen[4]})

    def replay(epoch):
        return lambda batch: None if shifted[epoch, batch] is None else (shifted[epoch, batch], None)

    assert np.array_equal(iterate(inline, replay(1), 1), epoch_one)
    assert np.array_equal(iterate(inline, replay(2), 2, frozen[2]), epoch_two)
    # The epoch's first segment takes the previous epoch's last snapshot, the next one the epoch start's.
    for part, embeddings in ((epoch_two[:6], frozen[2]), (epoch_two[6:12], handed_over)):
        check_guards(
            part,
            labels,
            is_passage,
            texts,
            P,
            N,
            reference(embeddings, labels, is_passage, 4, 1, 0.95, texts),
        )
    expected = reference(handed_over, labels, is_passage, 4, 1, 0.95, texts).dropped.sum(axis=0).tolist()
    assert list(ours.last_skipped.values()) == expected  # the epoch start's search, counted when joined


def test_the_search_runs_in_another_thread_beside_the_iteration_and_a_late_one_is_waited_for():
    labels, is_passage, texts, first = data()
    ours, plain = background(labels, is_passage, texts), background(labels, is_passage, texts)
    for sampler in (ours, plain):
        sampler.update_neighbours(first)
        sampler.set_epoch(1)
        sampler.snapshot_source = lambda: (rows(5), None)
    release, started, threads, done = threading.Event(), threading.Event(), [], []
    search = ours._search

    def slow(*args):
        threads.append(threading.current_thread())
        started.set()
        assert release.wait(30)
        time.sleep(0.3)
        found = search(*args)
        done.append(time.monotonic())
        return found

    ours._search = slow
    batches = iter(ours)
    yielded = [next(batches) for _ in range(12)]  # batches 0 to 11: the search from batch 6 is still held
    assert started.is_set() and not done
    assert threads[0] is not threading.main_thread() and threads[0].daemon
    release.set()
    asked = time.monotonic()
    yielded.append(next(batches))  # batch 12 waits for the search it applies
    assert done and done[0] >= asked + 0.25 and time.monotonic() >= done[0]
    yielded.extend(batches)
    assert len(threads) == 2  # the search from batch 12; none from batch 18
    assert np.array_equal(np.asarray(yielded), np.asarray(list(plain)))


def test_the_rows_searched_are_a_copy_taken_at_the_batch_it_starts():
    labels, is_passage, texts, first = data()
    live, seen = rows(11), {}

    def table(batch):  # the live rows, as EmbeddingTable hands them over
        seen[batch] = live.clone()
        return live, None

    ours = background(labels, is_passage, texts)
    ours.update_neighbours(first)
    release, search = threading.Event(), ours._search
    ours._search = lambda *args: release.wait(30) and search(*args)
    ours.snapshot_source = lambda: table(len(yielded))
    ours.set_epoch(1)
    batches, yielded = iter(ours), []
    yielded.extend(next(batches) for _ in range(7))  # batch 6 started a search (held)
    live.copy_(rows(12))  # the forward pass writes the table while it runs
    release.set()
    yielded.extend(batches)
    inline = sampler_for(labels, is_passage, texts, P, N, **OPTIONS)
    inline.update_neighbours(first)
    shifted = {6: None, 12: seen[6], 18: seen[12]}
    assert not torch.equal(seen[6], seen[12])
    found = iterate(inline, lambda b: None if shifted[b] is None else (shifted[b], None), 1)
    assert np.array_equal(found, np.asarray(yielded))


# Stopped with a search running: the epoch start's (after batch 2), or the one from batch 6 or from 12.
@pytest.mark.parametrize("stop", [3, 8, 13])
def test_a_state_dict_taken_with_a_search_in_flight_resumes_the_same_batches_without_searching_again(stop):
    labels, is_passage, texts, first = data()
    ours = background(labels, is_passage, texts)
    ours.update_neighbours(first)
    iterate(ours, lambda b: (rows(200 + b), None), 1)
    searches, search = [], ours._search
    ours._search = lambda *args: time.sleep(0.2) or search(*args)
    ours.snapshot_source = lambda: (rows(300 + len(yielded)), None)
    ours.update_neighbours(rows(8))
    ours.set_epoch(2)
    batches, yielded = iter(ours), []
    yielded.extend(next(batches) for _ in range(stop))
    assert ours._background.busy()
    state = ours.state_dict()  # waits for the search and keeps it under the segment it applies from
    assert not ours._background.busy()
    yielded.extend(batches)
    resumed = background(labels, is_passage, texts)
    resumed.load_state_dict(state)
    resumed._search = lambda *args: searches.append(len(again)) or search(*args)
    resumed.snapshot_source = lambda: (rows(300 + len(again)), None)
    resumed.set_epoch(2)
    again = []
    for batch in resumed:
        again.append(batch)
    assert again == yielded
    assert searches == [b for b in (6, 12) if b > stop]  # the stored segments are not searched again
    assert resumed.snapshot_fingerprint() == ours.snapshot_fingerprint() and resumed.refreshes == 3


def test_a_snapshot_handed_over_and_saved_before_its_epoch_applies_in_the_resumed_one():
    labels, is_passage, texts, first = data()
    ours = background(labels, is_passage, texts)
    ours.update_neighbours(first)
    iterate(ours, lambda b: (rows(400 + b), None), 1)
    ours.update_neighbours(rows(9))
    resumed = background(labels, is_passage, texts)
    resumed.load_state_dict(ours.state_dict())
    resumed.set_epoch(1)  # an earlier epoch (Composer spins them on resume) leaves it for the next
    source = lambda b: (rows(500 + b), None)  # noqa: E731
    assert np.array_equal(iterate(resumed, source, 2), iterate(ours, source, 2))


def test_an_error_in_the_background_search_is_raised_at_its_batch_in_one_line():
    labels, is_passage, texts, first = data()
    ours = background(labels, is_passage, texts)
    ours.update_neighbours(first)
    ours.set_epoch(1)
    ours.snapshot_source = lambda: (rows(5), None)

    def broken(*args):
        raise MemoryError("no room for the similarities\nsecond line")

    ours._search = broken
    batches = iter(ours)
    for _ in range(12):
        next(batches)
    with pytest.raises(RuntimeError) as error:
        next(batches)
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value.__cause__, MemoryError)
    assert message.startswith(
        "MinedNegativesPKBatchSampler: the background refresh of epoch 1, segment 2 failed: MemoryError: "
        "no room for the similarities (refresh_in_background=False"
    )


def test_refresh_in_background_needs_refresh_every():
    labels, is_passage, texts, _ = data()
    with pytest.raises(ValueError, match=r"^refresh_in_background=True .* set refresh_every=N as well"):
        sampler_for(labels, is_passage, texts, P, N, refresh_in_background=True)
    with pytest.raises(ValueError, match="refresh_in_background must be true or false, got 'yes'"):
        sampler_for(labels, is_passage, texts, P, N, refresh_every=R, refresh_in_background="yes")


# -------------------------------------------------------------------------- through the Trainer
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_through_the_trainer_a_resume_with_a_search_in_flight_trains_the_same_batches(tmp_path, num_workers):
    trainer, sampler, full, searched_at, table = make_run(
        num_workers, True, save_folder=str(tmp_path / "ck"), save_interval="4ba"
    )
    trainer.fit()
    trainer.close()
    ahead = 2 * num_workers
    # Searches start when the loader asks for batches 3 and 6 (the one from 9 would apply past the end).
    expected = [12 * epoch + max(b - 1 - ahead, -1) for epoch in (0, 1, 2) for b in (3, 6)]
    assert searched_at == expected
    # Epoch 0's first snapshot is searched inline; later epochs apply the epoch start's from batch 3.
    assert [record["sampler"]["refreshes"] for record in table.history] == [2 - bool(num_workers), 3, 3]
    # Batch 16 is epoch 1, batch 4: the search started at batch 3 (or 6, with workers) is still running.
    resumed_trainer, resumed_sampler, resumed, resumed_at, _ = make_run(
        num_workers, True, load_path=str(tmp_path / "ck" / "ep1-ba16-rank0.pt")
    )
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[16:]
    assert resumed_sampler.snapshot_fingerprint() == sampler.snapshot_fingerprint()
    assert resumed_at == [step for step in expected if step >= 15]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_config_sets_it_on_the_sampler(tmp_path):
    pytest.importorskip("tokenizers")
    from composer_dynsample.config import ConfigError, build_run, load_config
    from composer_dynsample.samplers.wiring import find_epoch_target
    from tests.config.helpers import pairs_config
    from tests.data.text.helpers import write_pairs

    sampler_section = {"name": "mined_negatives", "pairs_per_batch": 4, "negatives_per_anchor": 1}
    config = pairs_config(
        write_pairs(tmp_path / "pairs.jsonl", 60),
        tmp_path / "cache",
        sampler=sampler_section,
        algorithms={"embedding_table": {}},
    )
    overrides = ["sampler.refresh_every=2", "sampler.refresh_in_background=true"]
    run = build_run(load_config(config, overrides), tmp_path / "run")
    sampler = find_epoch_target(run.trainer.state.train_dataloader)
    assert sampler.refresh_in_background is True and sampler.options()["refresh_in_background"] is True
    with pytest.raises(ConfigError, match="set refresh_every=N as well"):
        build_run(load_config(config, overrides[1:]), tmp_path / "run2")
