"""Parity with pytorch-metric-learning where the semantics match, and PML losses accepting our tuples."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    SemiHardMiner,
)
from tests.mining import TOL, Case, as_rows, cases, check_index_tuple, distances

SETTINGS = settings(max_examples=40, deadline=None)

# Our distance name -> the PML distance with the same order on L2-normalised embeddings. Cosine is
# computed bit-identically (see RankMatrix), so its results must match exactly.
PML_DISTANCES = {
    "cosine": pml_distances.CosineSimilarity,
    "euclidean": pml_distances.LpDistance,
    "squared_euclidean": lambda: pml_distances.LpDistance(power=2),
}


# Half-precision inputs are mined as float32 (see distances.working_dtype): PML's miners on the same
# rounded numbers in float32 must give the same tuples.
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])


def _normalised(case: Case, dtype: torch.dtype = torch.float32) -> tuple[Case, Case]:
    """L2-normalised copies (PML's Lp distances normalise internally, ours do not): ``(ours, PML's)``.

    Ours is rounded to ``dtype``; PML's holds the same (rounded) numbers in float32.
    """
    ref = None if case.ref_emb is None else F.normalize(case.ref_emb, dim=1).to(dtype)
    ours = Case(F.normalize(case.emb, dim=1).to(dtype), case.labels, ref, case.ref_labels)
    return ours, Case(ours.emb.float(), ours.labels, None if ref is None else ref.float(), ours.ref_labels)


def _pml_distance(distance: str, dtype: torch.dtype = torch.float32):
    """PML's distance for ours; on half-precision inputs (rounded, so no longer exactly unit norm) the Lp
    distances must not normalise again, or they would measure other numbers than ours."""
    if distance == "cosine" or dtype == torch.float32:
        return PML_DISTANCES[distance]()
    return pml_distances.LpDistance(
        normalize_embeddings=False, power=2 if distance == "squared_euclidean" else 1
    )


def _pml(miner, case: Case) -> tuple[torch.Tensor, ...]:
    if case.ref_emb is None:
        return miner(case.emb, case.labels)
    return miner(case.emb, case.labels, case.ref_emb, case.ref_labels)


def _same_up_to_ties(ours, theirs, dist, columns) -> None:
    """Rows equal as sets; where they differ in the given columns, the distances must tie."""
    ours_rows, theirs_rows = as_rows(ours), as_rows(theirs)
    if sorted(ours_rows) == sorted(theirs_rows):
        return
    assert [r[0] for r in sorted(ours_rows)] == [r[0] for r in sorted(theirs_rows)]
    for mine, other in zip(sorted(ours_rows), sorted(theirs_rows)):
        for c in columns:
            assert abs(dist[mine[0]][mine[c]] - dist[other[0]][other[c]]) <= TOL, (mine, other)


@SETTINGS
@given(
    case=cases(max_dim=6).filter(lambda c: c.emb.shape[1] >= 2),
    distance=st.sampled_from(sorted(PML_DISTANCES)),
    dtype=DTYPES,
)
def test_batch_hard_equals_pml_batch_hard_miner(case: Case, distance: str, dtype: torch.dtype) -> None:
    half, case = _normalised(case, dtype)
    ours = BatchHardMiner(distance=distance)(*half.args())
    theirs = _pml(pml_miners.BatchHardMiner(distance=_pml_distance(distance, dtype)), case)
    check_index_tuple(ours, 3)
    if distance == "cosine":
        assert sorted(as_rows(ours)) == sorted(as_rows(theirs))
    else:
        _same_up_to_ties(ours, theirs, distances(case, distance), columns=(1, 2))


@SETTINGS
@given(case=cases(max_dim=6).filter(lambda c: c.emb.shape[1] >= 2))
def test_batch_hard_default_equals_pml_default(case: Case) -> None:
    """Our default (cosine) and PML's default (Euclidean on normalised embeddings) order pairs alike."""
    _, case = _normalised(case)
    ours = BatchHardMiner()(*case.args())
    theirs = _pml(pml_miners.BatchHardMiner(), case)
    _same_up_to_ties(ours, theirs, distances(case, "euclidean"), columns=(1, 2))


@SETTINGS
@given(
    case=cases(max_dim=6).filter(lambda c: c.emb.shape[1] >= 2),
    distance=st.sampled_from(sorted(PML_DISTANCES)),
    epsilon=st.floats(0.0, 0.5),
    dtype=DTYPES,
)
def test_multi_similarity_equals_pml(case: Case, distance: str, epsilon: float, dtype: torch.dtype) -> None:
    half, case = _normalised(case, dtype)
    ours = MultiSimilarityMiner(epsilon=epsilon, distance=distance)(*half.args())
    theirs = _pml(
        pml_miners.MultiSimilarityMiner(epsilon=epsilon, distance=_pml_distance(distance, dtype)), case
    )
    check_index_tuple(ours, 4)
    ours_pos, ours_neg = set(as_rows(ours[:2])), set(as_rows(ours[2:]))
    theirs_pos, theirs_neg = set(as_rows(theirs[:2])), set(as_rows(theirs[2:]))
    if distance == "cosine":
        assert ours_pos == theirs_pos and ours_neg == theirs_neg
        return
    # Lp distances: PML uses torch.cdist, we use the Gram-matrix formula; differences only at the boundary.
    dist = distances(case, distance)
    for a, j in ours_pos ^ theirs_pos:
        negs = [dist[a][n] for n in range(len(dist[a])) if int(case.pool[1][n]) != int(case.labels[a])]
        assert abs(dist[a][j] + epsilon - min(negs)) <= TOL
    for a, j in ours_neg ^ theirs_neg:
        poss = [
            dist[a][p]
            for p in range(len(dist[a]))
            if int(case.pool[1][p]) == int(case.labels[a]) and not (case.self_pool and p == a)
        ]
        assert abs(dist[a][j] - epsilon - max(poss)) <= TOL


# A negative 7e-8 farther than the positive (the anchor's own row): semi-hard by PML's rounding, not by ours,
# so PML's nearest semi-hard negative is not one ours must match (found by a random draw).
_BOUNDARY = Case(
    torch.tensor([[0.8756043910980225, -0.4830288887023926]]),
    torch.tensor([0]),
    torch.tensor([[0.8756043910980225, -0.4830288887023926], [0.8754188418388367, -0.4833652079105377],
                  [0.6168080568313599, -0.7871135473251343]]),
    torch.tensor([0, 1, 1]),
)  # fmt: skip


@SETTINGS
@given(
    case=cases(max_dim=6).filter(lambda c: c.emb.shape[1] >= 2),
    distance=st.sampled_from(["cosine", "euclidean"]),
    margin=st.floats(0.01, 1.0),
    dtype=DTYPES,
)
@example(case=_BOUNDARY, distance="cosine", margin=1.0, dtype=torch.float32)
def test_semi_hard_is_the_nearest_of_pml_semihard_triplets(
    case: Case, distance: str, margin: float, dtype: torch.dtype
) -> None:
    """PML returns every semi-hard triplet; ours (fallback="none") keeps the nearest one per pair."""
    half, case = _normalised(case, dtype)
    ours = SemiHardMiner(margin=margin, distance=distance, fallback="none")(*half.args())
    theirs = _pml(
        pml_miners.TripletMarginMiner(
            margin=margin, type_of_triplets="semihard", distance=_pml_distance(distance, dtype)
        ),
        case,
    )
    dist = distances(case, distance)

    def near_boundary(a: int, p: int, n: int) -> bool:
        gap = dist[a][n] - dist[a][p]
        return min(abs(gap), abs(gap - margin)) <= TOL

    theirs_rows = as_rows(theirs)
    candidates: dict[tuple[int, int], list[int]] = {}
    for a, p, n in theirs_rows:
        candidates.setdefault((a, p), []).append(n)
    theirs_set = set(theirs_rows)
    for a, p, n in as_rows(ours):
        assert (a, p, n) in theirs_set or near_boundary(a, p, n)
    ours_by_pair = {(a, p): n for a, p, n in as_rows(ours)}
    for (a, p), negs in candidates.items():
        clear = [n for n in negs if not near_boundary(a, p, n)]  # semi-hard under either rounding
        if not clear:
            continue
        assert (a, p) in ours_by_pair
        assert dist[a][ours_by_pair[(a, p)]] <= min(dist[a][n] for n in clear) + TOL


def _pk_batch(
    seed: int = 0, classes: int = 6, per_class: int = 4, dim: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(classes * per_class, dim, generator=gen), dim=1)
    return emb, torch.arange(classes).repeat_interleave(per_class)


def test_pml_triplet_loss_accepts_batch_hard_and_matches_pml_miner_loss() -> None:
    emb, labels = _pk_batch()
    emb.requires_grad_(True)
    loss_fn = pml_losses.TripletMarginLoss(margin=0.2)
    ours = loss_fn(emb, labels, indices_tuple=BatchHardMiner(distance="euclidean")(emb, labels))
    theirs = loss_fn(emb, labels, indices_tuple=pml_miners.BatchHardMiner()(emb, labels))
    assert torch.isfinite(ours) and float(ours) > 0
    assert torch.allclose(ours, theirs)
    ours.backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()


@pytest.mark.parametrize(
    "miner",
    [
        lambda e, y, *r: SemiHardMiner(margin=0.2)(e, y, *r),
        lambda e, y, *r: HardTopKMiner(k=3)(e, y, *r),
        lambda e, y, *r: DistanceWeightedMiner(generator=torch.Generator().manual_seed(0))(e, y, *r),
    ],
    ids=["semi_hard", "hard_topk", "distance_weighted"],
)
def test_pml_triplet_loss_accepts_other_triplet_miners(miner) -> None:
    emb, labels = _pk_batch()
    loss_fn = pml_losses.TripletMarginLoss(margin=0.2, distance=pml_distances.CosineSimilarity())
    indices = miner(emb, labels)
    assert indices[0].numel() > 0
    loss = loss_fn(emb, labels, indices_tuple=indices)
    # The same loss, by hand: mean over triplets with positive loss of relu(s_an - s_ap + margin).
    a, p, n = indices
    sim = emb @ emb.T
    per_triplet = torch.relu(sim[a, n] - sim[a, p] + 0.2)
    expected = per_triplet[per_triplet > 0].mean() if bool((per_triplet > 0).any()) else per_triplet.sum()
    assert math.isfinite(float(loss)) and torch.allclose(loss, expected, atol=1e-6)


def test_pml_losses_accept_multi_similarity_pairs_with_reference_pool() -> None:
    emb, labels = _pk_batch(seed=1)
    ref_emb, ref_labels = _pk_batch(seed=2)
    pairs = MultiSimilarityMiner(epsilon=0.1)(emb, labels, ref_emb, ref_labels)
    theirs = pml_miners.MultiSimilarityMiner(epsilon=0.1)(emb, labels, ref_emb, ref_labels)
    for loss_fn in (pml_losses.MultiSimilarityLoss(), pml_losses.ContrastiveLoss()):
        ours_loss = loss_fn(emb, labels, indices_tuple=pairs, ref_emb=ref_emb, ref_labels=ref_labels)
        theirs_loss = loss_fn(emb, labels, indices_tuple=theirs, ref_emb=ref_emb, ref_labels=ref_labels)
        assert torch.isfinite(ours_loss) and torch.allclose(ours_loss, theirs_loss)
