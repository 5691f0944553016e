"""Miners as configured objects: built with their options (checked there), called on tensors, carrying
their output kind, named in one registry."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.mining import (
    MINERS,
    BaseMiner,
    BatchHardMiner,
    CrossBatchMemory,
    HardTopKMiner,
    SemiHardMiner,
    build_miner,
    mining_step,
)
from composer_dynsample.mining.base import KINDS
from composer_dynsample.mining.step import skipped_step

OPTIONS = {
    "batch_hard": {},
    "semi_hard": {"margin": 0.3, "fallback": "hardest_negative"},
    "hard_topk": {"k": 3},
    "distance_weighted": {"cutoff": 0.4},
    "multi_similarity": {"epsilon": 0.2},
    "random_triplets": {},
}
RANDOM = {"distance_weighted", "random_triplets"}


def _batch(seed: int = 0, rows: int = 24, classes: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(rows, 8, generator=gen), dim=1)
    return emb, torch.arange(rows) % classes


def _as_lists(tuples: tuple[torch.Tensor, ...]) -> list[list[int]]:
    return [t.tolist() for t in tuples]


@pytest.mark.parametrize("name", list(MINERS))
def test_an_object_built_once_returns_what_a_fresh_object_returns(name):
    emb, labels = _batch()
    bank, bank_labels = _batch(seed=1, rows=16)
    options = dict(OPTIONS[name])
    if name in RANDOM:  # the same draws for both: a generator seeded alike
        make = lambda: {**options, "generator": torch.Generator().manual_seed(5)}  # noqa: E731
    else:
        make = lambda: options  # noqa: E731
    miner = MINERS[name](**make())
    for pool in ((None, None), (bank, bank_labels)):
        if name in RANDOM:
            miner.generator.manual_seed(5)
        by_object = miner(emb, labels, *pool)
        by_fresh = MINERS[name](**make())(emb, labels, *pool)
        assert _as_lists(by_object) == _as_lists(by_fresh)
        assert len(by_object) == KINDS[miner.kind]
        assert sum(t.numel() for t in by_object) > 0


def test_kind_says_which_miners_return_pairs():
    assert {name for name, cls in MINERS.items() if cls.kind == "pairs"} == {"multi_similarity"}
    for cls in MINERS.values():
        assert len(cls().empty()) == KINDS[cls.kind]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: SemiHardMiner(margin=-1.0), "margin must be"),
        (lambda: SemiHardMiner(fallback="any"), "fallback must be"),
        (lambda: HardTopKMiner(k=0), "k must be an integer >= 1"),
        (lambda: BatchHardMiner(distance="manhattan"), "distance"),
        (lambda: BatchHardMiner(chunk_size=0), "chunk_size must be an integer >= 1"),
        (lambda: MINERS["distance_weighted"](nonzero_loss_cutoff=0.0), "nonzero_loss_cutoff"),
        (lambda: MINERS["random_triplets"](generator=3), "generator must be a torch.Generator"),
    ],
)
def test_bad_options_fail_when_the_miner_is_built_not_when_it_first_runs(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_options_are_kept_and_shown():
    miner = SemiHardMiner(margin=0.3, distance="euclidean")
    assert (miner.margin, miner.fallback, miner.distance, miner.chunk_size) == (
        0.3,
        "hardest",
        "euclidean",
        None,
    )
    assert (
        repr(miner) == "SemiHardMiner(margin=0.3, fallback='hardest', distance='euclidean', chunk_size=None)"
    )
    assert repr(BatchHardMiner()) == "BatchHardMiner(distance='cosine', chunk_size=None)"


def test_build_miner_names_unknown_keys_and_bad_values():
    assert isinstance(build_miner("hard_topk", {"k": 2}, distance="euclidean"), HardTopKMiner)
    with pytest.raises(
        ValueError,
        match=r"has unknown keys \['distance'\]; semi_hard takes \['margin', 'fallback', 'chunk_size'\]",
    ):
        build_miner("semi_hard", {"distance": "cosine"})
    with pytest.raises(ValueError, match=r"^where: k must be an integer >= 1"):
        build_miner("hard_topk", {"k": 0}, where="where")
    with pytest.raises(ValueError, match="Did you mean 'semi_hard'"):
        build_miner("semihard")


def test_a_new_miner_only_writes_mine():
    class FirstNegative(BaseMiner):
        def mine(self, inputs, index):
            rows = torch.nonzero(index.n_neg > 0).flatten()
            negatives = (inputs.ref_labels[None, :] != inputs.labels[rows, None]).int().argmax(dim=1)
            return rows, index.chunk(0, inputs.labels.shape[0])[0][rows, 0], negatives

    emb, labels = _batch()
    anchors, positives, negatives = FirstNegative()(emb, labels)
    assert anchors.tolist() == list(range(24))
    assert bool((labels[positives] == labels).all()) and bool((labels[negatives] != labels).all())
    # The shared work: inputs are validated, and a batch without positives mines nothing.
    assert [t.numel() for t in FirstNegative()(emb, torch.arange(24))] == [0, 0, 0]
    with pytest.raises(ValueError, match="labels has 3 entries"):
        FirstNegative()(emb, labels[:3])


def test_mining_step_equals_the_miner_and_the_statistics_on_the_batch_and_a_memory():
    emb, labels = _batch()
    miner = SemiHardMiner(margin=0.3)
    mined = mining_step(emb, labels, miner, strategy="semi_hard")
    assert _as_lists(mined.indices_tuple) == _as_lists(miner(emb, labels))
    assert mined.ref_embeddings is None and mined.strategy == "semi_hard" and not mined.global_mean
    assert mined.stats["num_tuples"] == mined.num_tuples
    memory = CrossBatchMemory(64)
    mining_step(emb, labels, miner, memory=memory)  # fills the memory
    mined = mining_step(emb, labels, miner, memory=memory)
    expected = miner(emb, labels, mined.ref_embeddings, mined.ref_labels, self_offset=0)
    assert torch.equal(mined.ref_embeddings[24:], emb) and len(memory) == 48
    assert _as_lists(mined.indices_tuple) == _as_lists(expected)


def test_a_skipped_step_has_zero_embeddings_attached_to_every_parameter():
    layer = torch.nn.Linear(2, 3)
    mined = skipped_step(
        torch.full((4, 3), float("nan")), torch.arange(4), MINERS["multi_similarity"](), layer.parameters()
    )
    assert len(mined.indices_tuple) == 4 and mined.stats == {"skipped": 1.0}
    mined.embeddings.sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in layer.parameters())
