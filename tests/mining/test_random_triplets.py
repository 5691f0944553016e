"""The random_triplets baseline: valid triplets, uniform draws, self never paired."""

from __future__ import annotations

import torch

from composer_dynsample.mining import RandomTripletsMiner


def test_triplets_are_valid_and_skip_anchors_without_negatives_or_positives():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    a, p, n = RandomTripletsMiner(generator=torch.Generator().manual_seed(1))(torch.randn(6, 3), labels)
    assert a.tolist() == [0, 1, 3, 4, 5]  # anchor 2 is alone in its class
    assert bool((labels[p] == labels[a]).all()) and bool((p != a).all())
    assert bool((labels[n] != labels[a]).all())


def test_draws_are_uniform_over_the_candidates():
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(11)
    for _ in range(2000):
        _, _, n = RandomTripletsMiner(generator=generator)(torch.randn(11, 2), labels)
        counts += torch.bincount(n[:1], minlength=11)  # anchor 0's negative: uniform over 7 candidates
    share = counts[4:] / counts.sum()
    assert counts[:4].sum() == 0 and bool((share - 1 / 7).abs().max() < 0.03)


def test_reference_pool_indices_and_empty_result():
    labels, ref_labels = torch.tensor([0, 1]), torch.tensor([1, 1, 0, 0, 2])
    a, p, n = RandomTripletsMiner()(torch.randn(2, 3), labels, torch.randn(5, 3), ref_labels)
    assert a.tolist() == [0, 1]
    assert bool((ref_labels[p] == labels[a]).all()) and bool((ref_labels[n] != labels[a]).all())
    empty = RandomTripletsMiner()(torch.randn(3, 2), torch.zeros(3, dtype=torch.int64))
    assert all(t.numel() == 0 for t in empty)
