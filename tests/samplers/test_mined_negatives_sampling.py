"""``MinedNegativesPKBatchSampler``'s sampling from the window (uniform, softmax by Gumbel-max, SimANS) and
its false-negative diagnostics (``above_positive``, ``snapshot_log``), against brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates
from composer_dynsample.samplers._negative_plan import Sampling, ordered_candidates
from tests.samplers.helpers import pairs_data, reference, sampler_for

SIMILARITY = np.array([0.9, 0.7, 0.5, 0.3, 0.1])  # one anchor's five kept candidates, nearest first
POSITIVE = 0.6


def one_anchor(draws: int) -> CorpusCandidates:
    """``draws`` anchors with the same five kept candidates (rows 10..14) and a positive at 0.6."""
    return CorpusCandidates(
        np.tile(np.arange(10, 15), (draws, 1)),
        np.ones((draws, 5), dtype=bool),
        np.zeros((draws, 4), dtype=np.int64),
        np.ones(draws, dtype=bool),
        np.tile(SIMILARITY, (draws, 1)),
        np.full(draws, POSITIVE),
    )


def brute_force_weights(sampling: Sampling) -> np.ndarray:
    if sampling.name == "uniform":
        weights = [1.0] * 5
    elif sampling.name == "softmax":
        weights = [math.exp(s / sampling.temperature) for s in SIMILARITY]
    else:
        weights = [
            math.exp(-(((s - POSITIVE - sampling.shift) / sampling.temperature) ** 2)) for s in SIMILARITY
        ]
    return np.array(weights) / sum(weights)


@pytest.mark.parametrize(
    "sampling",
    [Sampling("uniform"), Sampling("softmax", 0.2), Sampling("simans", 0.3, -0.1), Sampling("simans", 0.2)],
    ids=["uniform", "softmax", "simans_shifted", "simans"],
)
def test_the_first_negative_is_drawn_with_the_brute_force_probabilities(sampling):
    draws = 20000
    counts: dict[str, int] = {}
    ordered, _, _ = ordered_candidates(
        one_anchor(draws), np.arange(draws), np.random.default_rng(0), counts, 1, 5, sampling
    )
    first = np.bincount(ordered[:, 0, 0] - 10, minlength=5) / draws
    expected = brute_force_weights(sampling)
    # Four standard errors of a binomial share: fails for a wrong weight, not for the draw.
    assert np.all(np.abs(first - expected) <= 4 * np.sqrt(expected * (1 - expected) / draws) + 1e-9)
    # Without replacement: every anchor's order is a permutation of its candidates.
    assert (np.sort(ordered[:, 0, :], axis=1) == np.arange(10, 15)).all()


def test_the_order_is_the_gumbel_keys_sorted_in_python():
    sampling = Sampling("softmax", 0.1)
    uniform = np.random.default_rng(3).random((4, 5))
    ordered, _, _ = ordered_candidates(
        one_anchor(4), np.arange(4), np.random.default_rng(3), {}, 2, 5, sampling
    )
    for anchor in range(4):
        keys = [s / 0.1 - math.log(-math.log(u)) for s, u in zip(SIMILARITY, uniform[anchor])]
        expected = [10 + i for i in sorted(range(5), key=lambda i: -keys[i])]
        assert ordered.reshape(4, 5)[anchor].tolist() == expected


def test_a_small_temperature_takes_the_hardest_and_dropped_candidates_come_last():
    found = one_anchor(50)
    found.kept[:, 0] = False  # the nearest was dropped by a guard: never taken, whatever its weight
    ordered, forbidden, above = ordered_candidates(
        found, np.arange(50), np.random.default_rng(1), {}, 1, 5, Sampling("softmax", 1e-4)
    )
    assert (ordered[:, 0, :].tolist() == [[11, 12, 13, 14, -1]] * 50) and (forbidden[:, 0, 0] == 10).all()
    assert above[:, 0, :].tolist() == [[True, False, False, False, False]] * 50  # 0.7 >= 0.6


def test_lists_saved_without_similarities_sample_uniformly():
    old = one_anchor(8)._replace(similarity=None, positive=None)
    args = (np.arange(8), np.random.default_rng(2), {}, 1, 5)
    uniform, _, above = ordered_candidates(old, *args)
    softmax, _, _ = ordered_candidates(
        old, np.arange(8), np.random.default_rng(2), {}, 1, 5, Sampling("softmax")
    )
    assert np.array_equal(uniform, softmax) and not above.any()


@pytest.mark.parametrize("sampling", ["softmax", "simans"])
def test_the_sampler_draws_from_its_epoch_stream_and_counts_negatives_above_the_positive(sampling):
    labels, is_passage, texts, embeddings = pairs_data(40, 6, duplicates=True)
    options = {
        "window": 6,
        "max_relative_similarity": None,
        "sampling": sampling,
        "sampling_temperature": 0.1,
    }
    sampler = sampler_for(labels, is_passage, texts, 4, 2, seed=9, **options)
    sampler.update_neighbours(embeddings)
    sampler.set_epoch(2)
    batches = sampler.global_batches(2)
    # A second sampler from the state dict draws the same batches (a resume), a new seed others.
    resumed = sampler_for(labels, is_passage, texts, 4, 2, seed=9, **options)
    resumed.load_state_dict(sampler.state_dict())
    assert np.array_equal(resumed.global_batches(2), batches)
    other = sampler_for(labels, is_passage, texts, 4, 2, seed=10, **options)
    other.update_neighbours(embeddings)
    assert not np.array_equal(other.global_batches(2)[:, 8:], batches[:, 8:])
    # above_positive by brute force: each mined negative's cosine against its anchor's positive's.
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    expected = reference(embeddings, labels, is_passage, 6, 0, None, texts)
    classes = np.unique(labels)
    anchor_of = {int(c): int(np.flatnonzero((labels == c) & ~is_passage)[0]) for c in classes}
    positive_of = {int(c): int(np.flatnonzero((labels == c) & is_passage)[0]) for c in classes}
    above = 0
    for batch in batches:
        rows = batch[:8].reshape(4, 2)
        for j, pair in enumerate(rows):
            label = int(labels[pair[0]])
            a, p = anchor_of[label], positive_of[label]
            candidates = set(expected.ranked[np.searchsorted(classes, label)].tolist())
            for negative in batch[8 + 2 * j : 10 + 2 * j].tolist():
                if negative in candidates and float(unit[a] @ unit[negative]) >= float(unit[a] @ unit[p]):
                    above += 1
    assert sampler.guard_counts()["above_positive"] == above > 0
    # The snapshot's summary: what it kept and how much of it scores above the positive.
    (record,) = sampler.snapshot_log
    assert record["epoch"] == 2 and record["segment"] == 0
    assert record["kept"] == expected.kept.sum() and record["anchors"] == expected.searched.sum()
    assert (
        record["above_positive"]
        == (expected.kept & (expected.similarity >= expected.positive[:, None])).sum()
    )
    assert resumed.snapshot_log == sampler.snapshot_log


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("sampling", "top", "sampling must be one of"),
        ("sampling_temperature", 0.0, "sampling_temperature must be"),
        ("absolute_margin", "0.1", "absolute_margin must be"),
    ],
)
def test_bad_sampling_options_are_named(option, value, message):
    labels, is_passage, texts, _ = pairs_data(30, 0)
    with pytest.raises((ValueError, TypeError), match=message):
        sampler_for(labels, is_passage, texts, 3, 1, **{option: value})
