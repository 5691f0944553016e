"""A process that opens many streaming data sets (a notebook, a test suite) holds descriptors in proportion to
them, not to their square: each data set's prefix is marked by its lock files as soon as it is built, so
Streaming's search for a free prefix never attaches to the shared memory of the ones before it."""

from __future__ import annotations

import gc
import os
import sys

import pytest

pytest.importorskip("streaming")

from composer_dynsample.data.streaming import close_readers, convert_to_mds, load_streaming
from tests.data.streaming.helpers import pairs_splits

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd"),
]


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_each_data_set_opened_adds_about_as_many_descriptors_as_the_first(tmp_path):
    convert_to_mds(pairs_splits(tmp_path, count=24), tmp_path / "mds", shard_size="4kb")
    added = []
    try:
        for index in range(8):  # a folder each: a reader each, with its own prefix
            gc.collect()  # files an earlier test left to the collector close now, not while counting
            before = _descriptors()
            load_streaming(str(tmp_path / "mds"), tmp_path / f"local-{index}")
            added.append(_descriptors() - before)
    finally:
        close_readers()
        gc.collect()
    # Attaching to every earlier prefix made each data set cost about 7 more than the one before (the
    # eighth about 7 x 7 more than the first). The first is left out: it also opens what every reader shares.
    assert max(added[1:]) <= min(added[1:]) + 8, added


def test_a_prefix_another_process_took_at_the_same_moment_is_tried_again(tmp_path, monkeypatch):
    """Two processes starting a StreamingDataset at once can pick one shared-memory prefix; the later one's
    registration fails with FileExistsError, and the reader tries again (the prefix is taken by then)."""
    import streaming

    convert_to_mds(pairs_splits(tmp_path, count=24), tmp_path / "mds", shard_size="4kb")
    real, calls = streaming.StreamingDataset, []

    def first_collides(**options):
        calls.append(options["local"])
        if len(calls) == 1:
            raise FileExistsError(17, "File exists", "/000001_locals")
        return real(**options)

    monkeypatch.setattr(streaming, "StreamingDataset", first_collides)
    try:
        splits = load_streaming(str(tmp_path / "mds"), tmp_path / "local")
    finally:
        close_readers()
        gc.collect()
    # the train split's reader, built on its second try
    assert splits.train.num_classes == 24 and calls[0] == calls[1]
