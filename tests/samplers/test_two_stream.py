"""Properties of TwoStreamBatchSampler over stream sizes and simulated world sizes 1 to 8."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_dynsample import TwoStreamBatchSampler
from tests.samplers.helpers import all_ranks_or_none, assert_same_batches

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def two_stream_setups(draw):
    num_primary = draw(st.integers(1, 80))
    num_secondary = draw(st.integers(1, 40))
    primary_bs = draw(st.integers(1, max(1, num_primary)))
    secondary_bs = draw(st.integers(1, min(12, num_secondary)))
    world = draw(st.integers(1, 8))
    perm = np.random.default_rng(draw(st.integers(0, 2**16))).permutation(num_primary + num_secondary)
    return (
        perm[:num_primary],
        perm[num_primary:],
        primary_bs,
        secondary_bs,
        world,
        draw(st.integers(0, 2**31)),
    )


def build(setup, drop_last=True):
    primary, secondary, pb, sb, world, seed = setup
    options = {"num_replicas": world, "seed": seed, "drop_last": drop_last}
    return all_ranks_or_none(
        lambda r: TwoStreamBatchSampler(primary, secondary, pb, sb, rank=r, **options), world
    )


@SETTINGS
@given(two_stream_setups(), st.integers(0, 4))
def test_batches_are_primary_then_secondary_and_primary_used_once(setup, epoch):
    primary, secondary, pb, sb, world, _ = setup
    samplers = build(setup)
    if samplers is None:
        assert len(primary) // pb < world  # the only reason to refuse
        return
    primary_set, secondary_set = set(primary.tolist()), set(secondary.tolist())
    used_primary = []
    for sampler in samplers:
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == (len(primary) // pb) // world
        for batch in batches:
            assert len(batch) == sampler.batch_size == pb + sb
            assert set(batch[:pb]) <= primary_set
            assert set(batch[pb:]) <= secondary_set
            used_primary.extend(batch[:pb])
    # Exactly once: no repeats, and everything but the dropped remainder is used.
    assert len(used_primary) == len(set(used_primary))
    assert len(used_primary) == ((len(primary) // pb) // world) * world * pb


@SETTINGS
@given(two_stream_setups())
def test_secondary_cycles_evenly_and_reshuffles(setup):
    """Over the epoch's secondary stream, counts differ by at most one: whole cycles plus a partial one."""
    primary, secondary, pb, sb, _, seed = setup
    sampler = TwoStreamBatchSampler(primary, secondary, pb, sb, num_replicas=1, rank=0, seed=seed)
    stream = sampler.global_batches(0)[:, pb:].reshape(-1)
    counts = np.array([np.sum(stream == i) for i in secondary])
    assert counts.max() - counts.min() <= 1
    # Each complete cycle is a permutation of the secondary indices.
    size = len(secondary)
    for start in range(0, stream.size - size + 1, size):
        assert sorted(stream[start : start + size].tolist()) == sorted(secondary.tolist())


@SETTINGS
@given(two_stream_setups(), st.booleans())
def test_deterministic_equal_length_and_disjoint_primary(setup, drop_last):
    a, b = build(setup, drop_last), build(setup, drop_last)
    if a is None:
        return
    assert_same_batches(a, b, epochs=(0, 2))
    assert len({len(s) for s in a}) == 1
    assert all(len(list(s)) == len(s) for s in a)


def test_new_order_every_epoch():
    sampler = TwoStreamBatchSampler(range(100), range(100, 130), 10, 3, seed=5)
    orders = [sampler.global_batches(e).tolist() for e in range(4)]
    assert all(orders[i] != orders[j] for i in range(4) for j in range(i))


def test_overlap_warns():
    with pytest.warns(UserWarning, match="2 indices are in both"):
        TwoStreamBatchSampler([0, 1, 2, 3], [3, 2, 9], 2, 1)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([], [1], 1, 1), "primary_indices must not be empty"),
        (([0], [], 1, 1), "secondary_indices must not be empty"),
        (([0, 1], [2], 0, 1), "primary_batch_size must be an integer >= 1, got 0"),
        (([0, 1], [2], 1, 0), "secondary_batch_size must be an integer >= 1, got 0"),
        (([0, 1], [2], 3, 1), r"primary_batch_size must be in \[1, 2\]"),
        (
            ([0, 1], [2, 3], 1, 3),
            r"secondary_batch_size must be in \[1, 2\] \(the number of secondary indices\)",
        ),
        (([0, 1], [2, 3], 1, 10**30), r"secondary_batch_size must be in \[1, 2\]"),
        (([-1, 1], [2], 1, 1), "primary_indices must be non-negative"),
        (([0.5, 1], [2], 1, 1), "primary_indices must hold integers"),
    ],
)
def test_bad_arguments_raise_clear_errors(args, match):
    with pytest.raises(ValueError, match=match):
        TwoStreamBatchSampler(*args)


def test_too_few_batches_for_the_world_size():
    with pytest.raises(ValueError, match="fewer than num_replicas=4"):
        TwoStreamBatchSampler(range(6), range(6, 9), 2, 1, num_replicas=4, rank=0)
    padded = [
        TwoStreamBatchSampler(range(6), range(6, 9), 2, 1, num_replicas=4, rank=r, drop_last=False)
        for r in range(4)
    ]
    assert [len(list(s)) for s in padded] == [1, 1, 1, 1]


def test_repeated_primary_indices_are_not_repeated_silently():
    with pytest.warns(UserWarning, match=r"2 primary indices occur more than once .*\[1, 3\]"):
        sampler = TwoStreamBatchSampler(
            [0, 1, 1, 2, 3, 3], [8, 9], primary_batch_size=2, secondary_batch_size=1
        )
    primaries = sorted(i for batch in sampler for i in batch[:2])
    assert primaries == [0, 1, 1, 2, 3, 3]  # the oversampling is what was asked for, and said
