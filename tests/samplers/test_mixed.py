"""MixedBatchSampler: the order of sources against sentence-transformers' multi-data-set batch samplers,
every batch from one source, weights, runs of one source per step, purity and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, TensorDataset

from composer_dynsample import PKBatchSampler
from composer_dynsample.samplers.mixed import MixedBatchSampler

SIZES = {"code": 48, "qa": 24, "labels": 36}


def _labels(size: int, per_class: int = 2) -> np.ndarray:
    return np.arange(size) // per_class


def _sources(seed: int = 0, **sizes: int) -> dict[str, PKBatchSampler]:
    sizes = sizes or SIZES
    return {
        name: PKBatchSampler(_labels(size), classes_per_batch=4, samples_per_class=2, seed=seed + i)
        for i, (name, size) in enumerate(sizes.items())
    }


def _mixed(**options: object) -> MixedBatchSampler:
    return MixedBatchSampler(_sources(), list(SIZES.values()), **options)


def _st_oracle(kind: str) -> list[list[int]]:
    sampler_module = pytest.importorskip("sentence_transformers.base.sampler")
    datasets = ConcatDataset([TensorDataset(torch.zeros(size)) for size in SIZES.values()])
    cls = (
        sampler_module.RoundRobinBatchSampler
        if kind == "round_robin"
        else sampler_module.ProportionalBatchSampler
    )
    oracle = cls(datasets, batch_samplers=list(_sources().values()), generator=torch.Generator(), seed=0)
    return [list(map(int, batch)) for batch in oracle]


def _source_of(batch: list[int]) -> int:
    offsets = np.cumsum([0, *SIZES.values()])
    sources = {int(np.searchsorted(offsets, index, side="right")) - 1 for index in batch}
    assert len(sources) == 1, f"a batch mixes sources {sources}"
    return sources.pop()


def test_round_robin_is_sentence_transformers_order_batch_for_batch():
    assert [list(map(int, batch)) for batch in _mixed(sampling="round_robin")] == _st_oracle("round_robin")


def test_proportional_holds_the_batches_sentence_transformers_draws_each_once():
    ours = [list(map(int, batch)) for batch in _mixed()]
    theirs = _st_oracle("proportional")
    assert sorted(ours) == sorted(theirs) and len(ours) == len(theirs) == 6 + 3 + 4
    assert ours != theirs  # the order is this package's own seeded schedule, not torch's generator


def test_every_batch_comes_from_one_source_and_keeps_the_source_samplers_order():
    mixed = _mixed()
    sources = _sources()
    for epoch in (0, 3):
        mixed.set_epoch(epoch)
        batches = list(mixed)
        order = [_source_of(batch) for batch in batches]
        assert order == mixed.sources_of(epoch).tolist()
        for position, (name, sampler) in enumerate(sources.items()):
            own = [b for b, s in zip(batches, order, strict=True) if s == position]
            offset = int(mixed.offsets[position])
            assert np.array_equal(np.asarray(own) - offset, sampler.global_batches(epoch)), name


def test_proportional_draws_sources_by_size_within_sampling_error():
    mixed = _mixed()
    counts = np.asarray(list(mixed.batch_counts.values()))
    share = counts / counts.sum()
    firsts = np.stack(
        [mixed.sources_of(epoch)[:4] for epoch in range(400)]
    )  # the first 4 batches of an epoch
    observed = np.asarray([(firsts == s).mean() for s in range(3)])
    sd = np.sqrt(share * (1 - share) / firsts.size)
    assert np.all(np.abs(observed - share) < 4 * sd + 1e-9), (observed, share)
    assert len({tuple(mixed.sources_of(epoch)) for epoch in range(20)}) > 15  # the order changes by epoch


def test_weights_set_each_sources_share_cycling_a_small_source():
    mixed = _mixed(weights=[1, 2, 1])
    assert mixed.batch_counts == {"code": 3, "qa": 6, "labels": 3}  # 13 batches split 1:2:1, rounded
    qa = mixed.source_batches(1, epoch=2) - mixed.offsets[1]
    own = _sources()["qa"]
    assert np.array_equal(
        qa, np.concatenate([own.global_batches(4), own.global_batches(5)])
    )  # epochs 2R, 2R+1
    assert len(mixed) == 12 and len(list(mixed)) == 12


def test_batches_per_draw_keeps_every_step_of_two_ranks_on_one_source():
    options = {"batches_per_draw": 2, "num_replicas": 2, "seed": 5}
    ranks = [MixedBatchSampler(_sources(), list(SIZES.values()), rank=r, **options) for r in (0, 1)]
    for first, second in zip(*ranks, strict=True):
        assert _source_of(first) == _source_of(second)
    one = MixedBatchSampler(_sources(), list(SIZES.values()), batches_per_draw=2, seed=5, num_replicas=1)
    runs = one.sources_of(0)
    assert np.all(runs[0:12:2] == runs[1:12:2])


def test_the_order_is_a_pure_function_of_seed_and_epoch_and_resumes_on_another_number_of_ranks():
    full = MixedBatchSampler(_sources(), list(SIZES.values()), seed=3, num_replicas=1)
    full.set_epoch(1)
    sequence = [list(map(int, b)) for b in full]
    again = MixedBatchSampler(_sources(), list(SIZES.values()), seed=3, num_replicas=1)
    again.set_epoch(1)
    assert [list(map(int, b)) for b in again] == sequence
    two = [
        MixedBatchSampler(_sources(), list(SIZES.values()), seed=3, num_replicas=2, rank=r) for r in (0, 1)
    ]
    for sampler in two:
        sampler.set_epoch(1)
    interleaved = [b for pair in zip(*two, strict=True) for b in pair]
    assert interleaved == sequence[: len(interleaved)]
    resumed = MixedBatchSampler(_sources(), list(SIZES.values()), seed=3, num_replicas=1)
    resumed.set_epoch(1)
    resumed.resume_epoch(1, global_batches_done=4, batches_to_skip=0)  # 2 steps on 2 ranks, then 1 rank
    assert [list(map(int, b)) for b in resumed] == sequence[4:]
    assert full.fingerprints(1)["plan"] != full.fingerprints(2)["plan"]
    assert two[0].fingerprints(1)["labels"] == full.fingerprints(1)["labels"]  # what a resume compares


def test_sources_of_different_batch_sizes_yield_their_own_sizes():
    sources = {
        "small": PKBatchSampler(_labels(16), classes_per_batch=2, samples_per_class=2),
        "large": PKBatchSampler(_labels(24), classes_per_batch=4, samples_per_class=2),
    }
    mixed = MixedBatchSampler(sources, [16, 24], sampling="round_robin")
    assert [len(batch) for batch in mixed] == [4, 8] * 3 and mixed.batch_size == 8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sampling": "round_robin", "weights": [1, 1, 1]}, "weights are for sampling='proportional'"),
        ({"weights": [1, 0, 1]}, "source 'qa': weight must be a positive number"),
        ({"weights": [1, 1]}, "one weight per source (3)"),
        ({"sampling": "mixed"}, "sampling"),
        ({"sampling": "round_robin", "batches_per_draw": 4}, "source 'qa' has 3 batches an epoch"),
    ],
)
def test_bad_options_name_the_option(options, message):
    with pytest.raises(ValueError, match=None) as error:
        _mixed(**options)
    assert message in str(error.value)


def test_sources_must_fit_their_rows():
    with pytest.raises(
        ValueError, match="source 'code': its sampler draws from 48 rows, but the source has 40"
    ):
        MixedBatchSampler(_sources(), [40, 24, 36])
    with pytest.raises(ValueError, match="one size per source"):
        MixedBatchSampler(_sources(), [48, 24])
    with pytest.raises(ValueError, match="source 'a': its sampler must be a batch sampler"):
        MixedBatchSampler({"a": [[0, 1]]}, [2])  # type: ignore[dict-item]
