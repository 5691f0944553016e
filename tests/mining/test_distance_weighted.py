"""Statistical properties of distance_weighted sampling (Wu et al., 2017)."""

from __future__ import annotations

import math

import torch

from composer_dynsample.mining import DistanceWeightedMiner
from tests.mining import check_index_tuple


def _at_chord_distance(d: float, dim: int) -> torch.Tensor:
    """A unit vector at Euclidean (chord) distance d from e_1."""
    theta = 2.0 * math.asin(d / 2.0)
    v = torch.zeros(dim, dtype=torch.float64)
    v[0], v[1] = math.cos(theta), math.sin(theta)
    return v


def _weight(d: float, dim: int, cutoff: float, nonzero_loss_cutoff: float) -> float:
    """1 / q(d) with q(d) = d^(D-2) (1 - d^2/4)^((D-3)/2), written directly from the paper."""
    if d >= nonzero_loss_cutoff:
        return 0.0
    d = max(d, cutoff)
    return 1.0 / (d ** (dim - 2) * (1.0 - d * d / 4.0) ** ((dim - 3) / 2.0))


def test_sampling_frequencies_follow_inverse_density_weights() -> None:
    dim, cutoff, nonzero = 4, 0.5, 1.4
    neg_dists = [0.3, 0.8, 1.2, 1.6]  # 0.3 is clipped up to the cutoff, 1.6 is beyond nonzero_loss_cutoff
    anchors = 150  # identical anchors of class 0: 150 * 149 anchor-positive pairs, one draw each
    emb = torch.stack(
        [_at_chord_distance(0.0, dim)] * anchors + [_at_chord_distance(d, dim) for d in neg_dists]
    )
    labels = torch.cat([torch.zeros(anchors, dtype=torch.int64), torch.arange(1, 5)])
    a, p, n = DistanceWeightedMiner(
        cutoff=cutoff, nonzero_loss_cutoff=nonzero, generator=torch.Generator().manual_seed(0)
    )(emb.float(), labels)
    check_index_tuple((a, p, n), 3)
    assert len(a) == anchors * (
        anchors - 1
    )  # every pair of class 0 gets a negative; negatives have no positive
    assert bool((labels[p] == 0).all() and (p != a).all() and (n >= anchors).all())
    counts = torch.bincount(n - anchors, minlength=4).double()
    freq = counts / counts.sum()
    weights = torch.tensor([_weight(d, dim, cutoff, nonzero) for d in neg_dists], dtype=torch.float64)
    expected = weights / weights.sum()
    assert counts[3] == 0  # beyond nonzero_loss_cutoff: never sampled
    # 22350 draws: the standard error of each frequency is below 0.004.
    assert torch.allclose(freq, expected, atol=0.02), (freq, expected)
    # The clipped near negative is sampled like one exactly at the cutoff, not more.
    assert expected[0] < 0.7


def test_never_samples_positives_self_or_beyond_cutoff_on_random_batches() -> None:
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(64, 3, generator=gen), dim=1)
    labels = torch.arange(64) % 8
    ref = torch.nn.functional.normalize(torch.randn(80, 3, generator=gen), dim=1)
    ref_labels = torch.arange(80) % 10
    for pool, pool_labels, self_pool in ((emb, labels, True), (ref, ref_labels, False)):
        args = (emb, labels) if self_pool else (emb, labels, pool, pool_labels)
        for seed in range(5):
            a, p, n = DistanceWeightedMiner(
                nonzero_loss_cutoff=1.0, generator=torch.Generator().manual_seed(seed)
            )(*args)
            assert a.numel() > 0
            assert bool((pool_labels[p] == labels[a]).all() and (pool_labels[n] != labels[a]).all())
            if self_pool:
                assert bool((p != a).all() and (n != a).all())
            assert bool(((emb[a] - pool[n]).norm(dim=1) < 1.0 + 1e-5).all())


def test_deterministic_given_generator_and_random_without() -> None:
    gen = torch.Generator().manual_seed(1)
    emb = torch.nn.functional.normalize(torch.randn(48, 6, generator=gen), dim=1)
    labels = torch.arange(48) % 6
    kw = {"nonzero_loss_cutoff": 2.0}
    first = DistanceWeightedMiner(generator=torch.Generator().manual_seed(3), **kw)(emb, labels)
    again = DistanceWeightedMiner(generator=torch.Generator().manual_seed(3), **kw)(emb, labels)
    other = DistanceWeightedMiner(generator=torch.Generator().manual_seed(4), **kw)(emb, labels)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[2], other[2])
    assert torch.equal(first[0], other[0]) and torch.equal(first[1], other[1])
    torch.manual_seed(0)
    global_a = DistanceWeightedMiner(**kw)(emb, labels)
    torch.manual_seed(0)
    global_b = DistanceWeightedMiner(**kw)(emb, labels)
    assert torch.equal(global_a[2], global_b[2])


def _log_weight(d: float, dim: int) -> float:
    return -(dim - 2) * math.log(d) - (dim - 3) / 2.0 * math.log(1.0 - d * d / 4.0)


def test_high_dimension_is_stable_in_log_space() -> None:
    """In D = 512 the weights span ~e^100 (float32 overflows at e^88.7): sampling must still be exact."""
    dim = 512
    near = 0.9
    # A far negative whose weight is exactly twice the near one's (1/q grows again beyond sqrt(2)).
    lo, hi = 1.5, 1.99
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _log_weight(mid, dim) < _log_weight(near, dim) + math.log(2.0) else (lo, mid)
    far = (lo + hi) / 2
    assert _log_weight(near, dim) > 100
    anchors = 120
    neg_dists = [near, 1.3, far]  # 1.3 has relative weight ~e^-105
    emb = torch.stack(
        [_at_chord_distance(0.0, dim)] * anchors + [_at_chord_distance(d, dim) for d in neg_dists]
    )
    labels = torch.cat([torch.zeros(anchors, dtype=torch.int64), torch.arange(1, 4)])
    a, _, n = DistanceWeightedMiner(nonzero_loss_cutoff=2.0, generator=torch.Generator().manual_seed(0))(
        emb.float(), labels
    )
    assert len(a) == anchors * (anchors - 1)
    freq = torch.bincount(n - anchors, minlength=3).double() / len(n)
    assert torch.allclose(freq, torch.tensor([1 / 3, 0.0, 2 / 3], dtype=torch.float64), atol=0.02), freq
