"""Bad input raises clear ValueErrors naming the argument, the value seen and what is valid."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    SemiHardMiner,
)
from composer_dynsample.mining._common import validate_mining_inputs

MINERS = [BatchHardMiner, HardTopKMiner, SemiHardMiner, MultiSimilarityMiner, DistanceWeightedMiner]
EMB, LABELS = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])


@pytest.mark.parametrize("miner", MINERS, ids=lambda m: m.__name__)
@pytest.mark.parametrize(
    ("args", "kwargs", "pattern"),
    [
        ((torch.randn(4), LABELS), {}, r"embeddings must be a 2-D floating-point tensor.*shape \(4,\)"),
        (
            (torch.ones(4, 3, dtype=torch.int64), LABELS),
            {},
            r"embeddings must be .*floating-point.*torch.int64",
        ),
        (([[1.0, 2.0]], LABELS[:1]), {}, r"embeddings must be .*got an object of type list"),
        (
            (torch.randn(4, 0), LABELS),
            {},
            r"embeddings must be a 2-D floating-point tensor \(num_items, dim\), got .*shape \(4, 0\)",
        ),
        ((EMB, LABELS.float()), {}, r"labels must be a 1-D integer tensor.*torch.float32"),
        ((EMB, LABELS.bool()), {}, r"labels must be a 1-D integer tensor.*torch.bool"),
        ((EMB, LABELS[:, None]), {}, r"labels must be a 1-D integer tensor.*shape \(4, 1\)"),
        ((EMB, LABELS[:3]), {}, r"labels has 3 entries but embeddings has 4 rows; they must match"),
        ((EMB, LABELS, torch.randn(5, 3)), {}, r"ref_embeddings was given without ref_labels"),
        (
            (EMB, LABELS, None, torch.zeros(5, dtype=torch.int64)),
            {},
            r"ref_labels was given without ref_embeddings",
        ),
        (
            (EMB, LABELS, torch.randn(5, 2), torch.zeros(5, dtype=torch.int64)),
            {},
            r"ref_embeddings has dimension 2 but embeddings 3; they must match",
        ),
        (
            (EMB, LABELS, torch.randn(5, 3), torch.zeros(4, dtype=torch.int64)),
            {},
            r"ref_labels has 4 entries but ref_embeddings has 5 rows; they must match",
        ),
        (
            (EMB, LABELS),
            {"distance": "manhattan"},
            r"distance must be one of \('cosine', 'euclidean', 'squared_euclidean'\), got 'manhattan'",
        ),
        ((EMB, LABELS), {"chunk_size": 0}, r"chunk_size must be an integer >= 1, got 0"),
        ((EMB, LABELS), {"chunk_size": 2.5}, r"chunk_size must be an integer >= 1, got 2.5"),
    ],
)
def test_invalid_inputs(miner, args, kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        miner(**kwargs)(*args)


@pytest.mark.parametrize("miner", MINERS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["embeddings", "ref_embeddings"])
def test_non_finite_embeddings(miner, bad: float, where: str) -> None:
    emb, ref = EMB.clone(), torch.randn(5, 3)
    (emb if where == "embeddings" else ref)[1, 2] = bad
    with pytest.raises(ValueError, match=rf"^{where} contain NaN or inf\.$"):
        miner()(emb, LABELS, ref, torch.zeros(5, dtype=torch.int64))


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: SemiHardMiner(fallback="easiest")(EMB, LABELS),
            r"fallback must be one of \('hardest', 'hardest_negative', 'none'\), got 'easiest'",
        ),
        (lambda: SemiHardMiner(margin=-0.1)(EMB, LABELS), r"margin must be a number >= 0.0, got -0.1"),
        (
            lambda: SemiHardMiner(margin=float("nan"))(EMB, LABELS),
            r"margin must be a finite number >= 0.0, got nan",
        ),
        (lambda: HardTopKMiner(k=0)(EMB, LABELS), r"k must be an integer >= 1, got 0"),
        (lambda: HardTopKMiner(k=True)(EMB, LABELS), r"k must be an integer >= 1, got True"),
        (lambda: MultiSimilarityMiner(epsilon=-1)(EMB, LABELS), r"epsilon must be a number >= 0.0, got -1"),
        (
            lambda: MultiSimilarityMiner(epsilon="0.1")(EMB, LABELS),
            r"epsilon must be a number >= 0.0, got '0.1'",
        ),
        (
            lambda: DistanceWeightedMiner(cutoff=-0.5)(EMB, LABELS),
            r"cutoff must be a number >= 0.0, got -0.5",
        ),
        (
            lambda: DistanceWeightedMiner(nonzero_loss_cutoff=0)(EMB, LABELS),
            r"nonzero_loss_cutoff must be a number > 0.0, got 0",
        ),
        (
            lambda: DistanceWeightedMiner(generator=0)(EMB, LABELS),
            r"generator must be a torch.Generator or None, got an object of type int",
        ),
        (lambda: DistanceWeightedMiner(distance="l1")(EMB, LABELS), r"distance must be one of .*got 'l1'"),
    ],
)
def test_invalid_options(call, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        call()


def test_validation_helper_normalises_inputs() -> None:
    labels32 = LABELS.to(torch.int32)
    inputs = validate_mining_inputs(EMB, labels32)
    assert inputs.self_pool and inputs.ref_embeddings is inputs.embeddings
    assert inputs.labels.dtype == torch.int64 and inputs.ref_labels is inputs.labels
    # A bf16 batch against an fp32 memory bank: both promoted to fp32; labels cast to int64.
    ref = validate_mining_inputs(EMB.bfloat16(), LABELS, torch.randn(5, 3), torch.zeros(5, dtype=torch.uint8))
    assert not ref.self_pool
    assert ref.embeddings.dtype == ref.ref_embeddings.dtype == torch.float32
    assert ref.ref_labels.dtype == torch.int64
    # The very same objects as pool count as no pool.
    assert validate_mining_inputs(EMB, LABELS, EMB, LABELS).self_pool
    assert not validate_mining_inputs(EMB, LABELS, EMB.clone(), LABELS).self_pool


def test_mixed_precision_pool_gives_same_result_as_fp32() -> None:
    gen = torch.Generator().manual_seed(3)
    emb, ref = torch.randn(10, 4, generator=gen), torch.randn(12, 4, generator=gen)
    labels, ref_labels = torch.arange(10) % 3, torch.arange(12) % 4
    emb = emb.double().float()  # exactly representable in both precisions below
    mixed = BatchHardMiner()(emb.double(), labels, ref, ref_labels)
    same = BatchHardMiner()(emb.double(), labels, ref.double(), ref_labels)
    assert [t.tolist() for t in mixed] == [t.tolist() for t in same]


def test_numpy_numbers_are_accepted_as_options() -> None:
    import numpy as np

    assert [t.tolist() for t in HardTopKMiner(k=np.int64(2), chunk_size=np.int32(3))(EMB, LABELS)] == [
        t.tolist() for t in HardTopKMiner(k=2, chunk_size=3)(EMB, LABELS)
    ]
    assert [t.tolist() for t in SemiHardMiner(margin=np.float32(0.25))(EMB, LABELS)] == [
        t.tolist() for t in SemiHardMiner(margin=0.25)(EMB, LABELS)
    ]
