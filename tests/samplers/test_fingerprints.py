"""What the ranks compare of a batch sampler: its options and the hashes of its labels and epoch plan."""

from __future__ import annotations

import numpy as np
import torch

from composer_dynsample import (
    HardClassPKBatchSampler,
    NeighbourBatchSampler,
    PKBatchSampler,
    TwoStreamBatchSampler,
)

LABELS = torch.arange(512) % 16


def pk(labels=LABELS, p=4, k=4, **kwargs) -> PKBatchSampler:
    return PKBatchSampler(labels, p, k, **kwargs)


def differing(first, second, epoch: int = 0) -> list[str]:
    one, two = first.fingerprints(epoch), second.fingerprints(epoch)
    return [name for name in one if one[name] != two[name]]


def test_the_ranks_of_one_world_have_the_same_fingerprints():
    ranks = [pk(num_replicas=4, rank=r, seed=3) for r in range(4)]
    assert all(r.fingerprints(2) == ranks[0].fingerprints(2) for r in ranks)
    assert ranks[0].options() == ranks[3].options()
    assert "rank" not in ranks[0].options() and "epoch" not in ranks[0].options()


def test_the_fingerprints_are_hex_digests_and_the_plan_follows_the_epoch():
    sampler = pk()
    prints = sampler.fingerprints(0)
    assert set(prints) == {"labels", "options", "plan"}
    assert all(len(value) == 16 and int(value, 16) >= 0 for value in prints.values())
    assert sampler.fingerprints(1)["plan"] != prints["plan"]
    sampler.set_epoch(1)
    assert sampler.fingerprints() == sampler.fingerprints(1)


def test_another_shape_of_the_same_batch_size_differs_in_options_and_plan_only():
    wide, narrow = pk(p=4, k=4), pk(p=8, k=2)
    assert (len(wide), wide.batch_size) == (len(narrow), narrow.batch_size)
    assert differing(wide, narrow) == ["options", "plan"]


def test_permuted_labels_differ_in_labels_and_plan_only():
    permuted = LABELS[torch.randperm(512, generator=torch.Generator().manual_seed(0))]
    assert differing(pk(), pk(permuted)) == ["labels", "plan"]


def test_another_seed_differs_in_options_and_plan():
    assert differing(pk(seed=0), pk(seed=1)) == ["options", "plan"]
    assert pk(seed=1).options()["seed"] == 1


def test_labels_given_as_a_list_array_or_tensor_are_the_same_labels():
    forms = [LABELS, LABELS.numpy(), LABELS.tolist(), LABELS.numpy().astype(np.int32)]
    assert len({pk(labels).fingerprints(0)["labels"] for labels in forms}) == 1


def test_options_name_the_constructor_settings_and_the_type():
    options = HardClassPKBatchSampler(LABELS, 4, 4, hard_fraction=0.25, distance="cosine").options()
    assert options["type"] == "composer_dynsample.samplers.hard_class.HardClassPKBatchSampler"
    assert (options["hard_fraction"], options["distance"], options["classes_per_batch"]) == (
        0.25,
        "cosine",
        4,
    )
    assert differing(HardClassPKBatchSampler(LABELS, 4, 4), pk()) == ["options"]  # same batches, another type


def test_a_hard_class_snapshot_changes_the_plan_from_the_next_epoch():
    sampler = HardClassPKBatchSampler(LABELS, 4, 4, seed=1)
    before = sampler.fingerprints(1)
    sampler.update_class_embeddings(torch.randn(16, 3, generator=torch.Generator().manual_seed(0)))
    assert sampler.fingerprints(1) == before  # pending until set_epoch
    sampler.set_epoch(1)
    after = sampler.fingerprints(1)
    assert after["plan"] != before["plan"] and after["labels"] == before["labels"]


def test_neighbour_snapshots_change_the_plan_and_not_the_labels():
    first, second = NeighbourBatchSampler(LABELS, 4, 2), NeighbourBatchSampler(LABELS, 4, 2)
    for sampler, seed in ((first, 0), (second, 1)):
        sampler.update_neighbours(torch.randn(512, 4, generator=torch.Generator().manual_seed(seed)))
        sampler.set_epoch(0)
    assert differing(first, second) == ["plan"]


def test_two_stream_streams_are_the_labels():
    first = TwoStreamBatchSampler(range(0, 96), range(96, 128), 8, 2)
    second = TwoStreamBatchSampler(range(32, 128), range(0, 32), 8, 2)
    assert differing(first, second) == ["labels", "plan"]


def test_the_labels_hash_is_taken_once_when_the_sampler_is_built():
    sampler = pk()
    labels_hash = sampler.fingerprints(0)["labels"]
    sampler.extra = np.arange(512)  # an array set later, one entry per index: not the labels
    assert sampler.fingerprints(0)["labels"] == labels_hash
