"""Properties of PKBatchSampler over dataset sizes, class distributions and simulated world sizes 1 to 8."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_dynsample import PKBatchSampler
from tests.samplers.helpers import all_ranks_or_none, assert_disjoint_across_ranks, assert_same_batches

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pk_setups(draw):
    """Class sizes, P, K and a world size such that at least one batch per rank exists."""
    num_classes = draw(st.integers(2, 30))
    sizes = draw(st.lists(st.integers(1, 25), min_size=num_classes, max_size=num_classes))
    k = draw(st.integers(1, 5))
    p = draw(st.integers(2, num_classes))
    world = draw(st.integers(1, 8))
    labels = np.repeat(np.arange(num_classes) * 7 + 3, sizes)  # non-contiguous class ids on purpose
    labels = labels[np.random.default_rng(draw(st.integers(0, 2**16))).permutation(labels.size)]
    return labels, p, k, world, draw(st.sampled_from(["drop", "replace"])), draw(st.integers(0, 2**31))


def make_all_ranks(labels, p, k, world, small, seed, drop_last=True):
    options = {"num_replicas": world, "seed": seed, "small_classes": small, "drop_last": drop_last}
    options["require_positive_pairs"] = False  # the layout properties hold for K = 1 too
    return all_ranks_or_none(lambda rank: PKBatchSampler(labels, p, k, rank=rank, **options), world)


@SETTINGS
@given(pk_setups(), st.integers(0, 5))
def test_every_batch_is_p_distinct_classes_of_k(setup, epoch):
    labels, p, k, world, small, seed = setup
    samplers = make_all_ranks(labels, p, k, world, small, seed)
    if samplers is None:
        return
    for sampler in samplers:
        sampler.set_epoch(epoch)
        for batch in sampler:
            assert len(batch) == p * k
            counts = collections.Counter(labels[batch].tolist())
            assert len(counts) == p
            assert set(counts.values()) == {k}
            # A class's K samples are contiguous in the batch.
            runs = [labels[batch[i * k : (i + 1) * k]] for i in range(p)]
            assert all(len(set(run.tolist())) == 1 for run in runs)


@SETTINGS
@given(pk_setups(), st.integers(0, 5), st.booleans())
def test_equal_lengths_on_every_rank_and_len_matches_iteration(setup, epoch, drop_last):
    labels, p, k, world, small, seed = setup
    samplers = make_all_ranks(labels, p, k, world, small, seed, drop_last)
    if samplers is None:
        return
    lengths = set()
    for sampler in samplers:
        sampler.set_epoch(epoch)
        produced = list(sampler)
        assert len(produced) == len(sampler)
        lengths.add(len(sampler))
    assert len(lengths) == 1
    expected = (
        samplers[0].num_global_batches // world if drop_last else -(-samplers[0].num_global_batches // world)
    )
    assert lengths == {expected}


@SETTINGS
@given(pk_setups(), st.integers(0, 5))
def test_shards_are_disjoint_without_replacement(setup, epoch):
    labels, p, k, world, _, seed = setup
    samplers = make_all_ranks(labels, p, k, world, "drop", seed)
    if samplers is None:
        return
    assert_disjoint_across_ranks(samplers, epoch)


@SETTINGS
@given(
    st.integers(2, 12),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(0, 99),
)
def test_full_coverage_when_promised(p, k, world, chunks_per_class_unit, rounds, seed):
    """Class sizes multiple of K, chunk count multiple of P x W, no class above the batch count: all used."""
    num_classes = p * world
    chunks = chunks_per_class_unit * rounds
    labels = np.repeat(np.arange(num_classes), chunks * k)
    samplers = make_all_ranks(labels, p, k, world, "drop", seed)
    assert samplers is not None
    used = np.concatenate([np.asarray(list(s)).reshape(-1) for s in samplers])
    assert np.array_equal(np.sort(used), np.arange(labels.size))


@SETTINGS
@given(pk_setups())
def test_deterministic_and_reshuffled_every_epoch(setup):
    labels, p, k, world, small, seed = setup
    first = make_all_ranks(labels, p, k, world, small, seed)
    second = make_all_ranks(labels, p, k, world, small, seed)
    if first is None:
        return
    assert_same_batches(first, second, epochs=(0, 3))
    # Reshuffle: the global order of epoch 0 and epoch 1 differ whenever more than one order is possible.
    # With 6+ indices a repeat has probability <= 1/72 per epoch, so four repeats in a row mean a bug.
    sampler = first[0]
    if sampler.num_global_batches * sampler.batch_size >= 6:
        epoch0 = sampler.global_batches(0)
        assert any(not np.array_equal(epoch0, sampler.global_batches(e)) for e in range(1, 5))


def test_order_is_a_pure_function_of_seed_epoch_rank():
    labels = np.arange(400) % 20
    a = PKBatchSampler(labels, 4, 5, num_replicas=2, rank=1, seed=7)
    a.set_epoch(3)
    b = PKBatchSampler(labels, 4, 5, num_replicas=2, rank=1, seed=7)
    list(b)  # iterating epoch 0 first must not change what epoch 3 yields
    b.set_epoch(3)
    assert list(a) == list(b)
    c = PKBatchSampler(labels, 4, 5, num_replicas=2, rank=1, seed=8)
    c.set_epoch(3)
    assert list(a) != list(c)


def test_seed_and_epoch_do_not_alias():
    labels = np.arange(400) % 20
    s = PKBatchSampler(labels, 4, 5, seed=1)
    t = PKBatchSampler(labels, 4, 5, seed=0)
    assert not np.array_equal(s.global_batches(0), t.global_batches(1))


def test_small_classes_replace_draws_from_own_class():
    labels = np.array([0] * 10 + [1] * 2 + [2] * 10)
    sampler = PKBatchSampler(labels, 3, 4, small_classes="replace")
    seen_small = 0
    for epoch in range(5):
        sampler.set_epoch(epoch)
        for batch in sampler:
            small = [i for i in batch if labels[i] == 1]
            assert len(small) == 4 and set(small) <= {10, 11}
            seen_small += 1
    assert seen_small == 5


def test_small_classes_drop_warns_and_leaves_out():
    labels = np.array([0] * 8 + [1] * 8 + [2] * 1)
    with pytest.warns(UserWarning, match="1 of 3 classes"):
        sampler = PKBatchSampler(labels, 2, 4)
    assert 16 not in {i for b in sampler for i in b}


def test_dominant_class_is_capped_at_one_chunk_per_batch():
    labels = np.array([0] * 100 + [1] * 4 + [2] * 4)
    sampler = PKBatchSampler(labels, 2, 2)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 4  # class 0 can appear in at most 4 batches with 4 others' chunks
    for batch in batches:
        assert collections.Counter(labels[batch].tolist())[0] <= 2


def test_accepts_tensor_and_list_labels():
    labels = torch.arange(32) % 4
    assert list(PKBatchSampler(labels, 2, 2)) == list(PKBatchSampler(labels.tolist(), 2, 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"classes_per_batch": 1, "samples_per_class": 2},
            r"classes_per_batch must be an integer >= 2, got 1",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 0},
            r"samples_per_class must be an integer in \[2, 32\], got 0",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 0, "require_positive_pairs": False},
            r"samples_per_class must be an integer in \[1, 32\], got 0",
        ),
        (
            {"classes_per_batch": 5, "samples_per_class": 2},
            r"classes_per_batch=5 x samples_per_class=2 cannot be satisfied: only 4",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 9},
            r"every one of the 4 classes has exactly 8 samples; use samples_per_class in \[2, 8\] or "
            r"small_classes='replace' \(which repeats samples in a batch\)\.$",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 2, "small_classes": "pad"},
            r"small_classes must be one of",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 2, "num_replicas": 2, "rank": 2},
            r"rank must be an integer in \[0, 1\]",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 2, "num_replicas": 0},
            r"num_replicas must be an integer >= 1",
        ),
        (
            {"classes_per_batch": 2, "samples_per_class": 2, "drop_last": "no"},
            r"drop_last must be true or false, got 'no'",
        ),
        (
            {"classes_per_batch": 4, "samples_per_class": 8, "num_replicas": 2, "rank": 0},
            r"fewer than num_replicas=2",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    labels = np.arange(32) % 4
    with pytest.raises(ValueError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the small-class warning that precedes some errors
        PKBatchSampler(labels, **kwargs)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([], "labels must not be empty"),
        ([[0, 1], [1, 0]], r"labels must be 1-D, got shape \(2, 2\)"),
        ([0.0, 1.0, 0.5], "labels must hold integers, got dtype float64"),
        (torch.tensor([0.0, 1.0]), "labels must hold integers, got a tensor of dtype torch.float32"),
    ],
)
def test_bad_labels_raise_clear_errors(labels, match):
    with pytest.raises(ValueError, match=match):
        PKBatchSampler(labels, 2, 1)


def test_is_a_distributed_sampler_with_the_expected_contract():
    from torch.utils.data import DistributedSampler

    sampler = PKBatchSampler(np.arange(64) % 8, 4, 2, num_replicas=2, rank=1, seed=3)
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.batch_size, sampler.num_replicas, sampler.rank, sampler.seed, sampler.epoch) == (
        8,
        2,
        1,
        3,
        0,
    )
    sampler.set_epoch(4)
    assert sampler.epoch == 4
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        sampler.set_epoch(-1)


def test_numpy_integers_are_accepted_for_the_world():
    sampler = PKBatchSampler(
        torch.arange(32) % 4, 2, 2, num_replicas=np.int64(2), rank=np.int32(1), seed=np.int64(3)
    )
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (2, 1, 3)
    assert isinstance(sampler.num_replicas, int) and isinstance(sampler.rank, int)


def test_one_sample_per_class_is_refused_unless_positive_pairs_are_not_needed():
    labels = np.arange(32) % 4
    with pytest.raises(
        ValueError, match=r"samples_per_class=1 .* never hold a positive pair.*require_positive_pairs"
    ):
        PKBatchSampler(labels, 4, 1)
    sampler = PKBatchSampler(labels, 4, 1, require_positive_pairs=False)
    assert all(len(set(labels[batch].tolist())) == 4 for batch in sampler)
    with pytest.raises(ValueError, match="require_positive_pairs must be true or false"):
        PKBatchSampler(labels, 4, 2, require_positive_pairs="no")


@pytest.mark.parametrize("small_classes", ["drop", "replace"])
def test_a_huge_samples_per_class_names_the_argument_and_its_range(small_classes):
    labels = np.arange(32) % 4
    with pytest.raises(
        ValueError, match=r"^samples_per_class must be an integer in \[2, 32\], got 10{30}\.$"
    ):
        PKBatchSampler(labels, 2, 10**30, small_classes=small_classes)


@pytest.mark.parametrize(
    ("counts", "p", "k", "small_classes", "expected"),
    [
        # Two classes of 10 and 6, two of 3: K = 5 leaves two classes, P = 3 needs a K of 3 at most.
        (
            [10, 6, 3, 3],
            3,
            5,
            "drop",
            "classes_per_batch=3 x samples_per_class=5 cannot be satisfied: only 2 of 4 classes have 5 samples "
            "or more (small_classes='drop'); use classes_per_batch in [2, 2] or samples_per_class in [2, 3] "
            "(3 classes have that many) or small_classes='replace'.",
        ),
        # The third largest class has a single sample: no K >= 2 serves P = 3.
        (
            [10, 6, 1],
            3,
            2,
            "drop",
            "classes_per_batch=3 x samples_per_class=2 cannot be satisfied: only 2 of 3 classes have 2 samples "
            "or more (small_classes='drop'); use classes_per_batch in [2, 2] or small_classes='replace'.",
        ),
        (
            [4, 4, 4],
            5,
            2,
            "replace",
            "classes_per_batch=5 x samples_per_class=2 cannot be satisfied: the labels hold only 3 classes; use "
            "classes_per_batch in [2, 3].",
        ),
        ([9], 2, 2, "drop", "a P x K batch needs at least 2 classes, but the labels hold 1."),
        (
            [4, 4, 4],
            10**30,
            2,
            "drop",
            f"classes_per_batch={10**30} x samples_per_class=2 cannot be satisfied: only 3 of 3 classes have 2 "
            "samples or more (small_classes='drop'); use classes_per_batch in [2, 3].",
        ),
    ],
)
def test_an_unsatisfiable_p_by_k_says_which_p_and_k_would_work(counts, p, k, small_classes, expected):
    labels = np.repeat(np.arange(len(counts)), counts)
    with pytest.raises(ValueError) as error, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no small-class warning before the error
        PKBatchSampler(labels, p, k, small_classes=small_classes)
    assert str(error.value) == expected
