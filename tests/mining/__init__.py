"""Tests of :mod:`composer_dynsample.mining`, with shared brute-force references, checks and input strategies.

The references below loop over anchors in plain Python on float64 distances, so that they are obviously
right; comparisons against the (float32) miners allow ``TOL`` for ties and rounding.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

TOL = 1e-4
DISTANCE_NAMES = ("cosine", "euclidean", "squared_euclidean")


@dataclass
class Case:
    """One mining problem: a batch and an optional reference pool, which may hold the batch itself at
    rows ``self_offset ...`` (as the batch followed by a memory, or a cross-rank pool, does)."""

    emb: torch.Tensor
    labels: torch.Tensor
    ref_emb: torch.Tensor | None = None
    ref_labels: torch.Tensor | None = None
    self_offset: int | None = None

    @property
    def pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ref_emb is None:
            return self.emb, self.labels
        return self.ref_emb, self.ref_labels

    @property
    def self_pool(self) -> bool:
        return self.ref_emb is None

    def own_row(self, a: int) -> int | None:
        """Anchor ``a``'s own row of the pool, or ``None`` when the pool does not hold the anchors."""
        return a if self.self_pool else None if self.self_offset is None else self.self_offset + a

    def args(self) -> tuple:
        return (self.emb, self.labels, self.ref_emb, self.ref_labels)

    def kwargs(self) -> dict:
        return {} if self.self_offset is None else {"self_offset": self.self_offset}


@st.composite
def cases(
    draw, max_batch: int = 20, max_pool: int = 24, max_dim: int = 6, with_ref: bool | None = None
) -> Case:
    """Random batches with continuous random floats (so exact ties do not occur) and small label sets."""
    batch = draw(st.integers(1, max_batch))
    dim = draw(st.integers(1, max_dim))
    n_classes = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(batch, dim, generator=gen)
    labels = torch.randint(0, n_classes, (batch,), generator=gen)
    use_ref = draw(st.booleans()) if with_ref is None else with_ref
    if not use_ref:
        return Case(emb, labels)
    pool = draw(st.integers(1, max_pool))
    ref_emb = torch.randn(pool, dim, generator=gen)
    ref_labels = torch.randint(0, n_classes + 1, (pool,), generator=gen)
    if not draw(st.booleans()):
        return Case(emb, labels, ref_emb, ref_labels)
    # The pool holds the batch itself at some offset, among other samples.
    offset = draw(st.integers(0, pool))
    ref_emb = torch.cat([ref_emb[:offset], emb, ref_emb[offset:]])
    ref_labels = torch.cat([ref_labels[:offset], labels, ref_labels[offset:]])
    return Case(emb, labels, ref_emb, ref_labels, offset)


def ref_distance(x: torch.Tensor, y: torch.Tensor, distance: str) -> torch.Tensor:
    """Float64 distance matrix written from the definitions."""
    x, y = x.double(), y.double()
    if distance == "cosine":
        xn = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        yn = y / y.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return 1.0 - xn @ yn.T
    sq = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return sq.sqrt() if distance == "euclidean" else sq


def positives_of(case: Case, a: int) -> list[int]:
    pool_labels = case.pool[1].tolist()
    label = int(case.labels[a])
    return [j for j, lab in enumerate(pool_labels) if lab == label and j != case.own_row(a)]


def negatives_of(case: Case, a: int) -> list[int]:
    pool_labels = case.pool[1].tolist()
    label = int(case.labels[a])
    return [j for j, lab in enumerate(pool_labels) if lab != label]


def distances(case: Case, distance: str) -> list[list[float]]:
    """Float64 distances as nested lists (fast to index in the Python-loop references)."""
    pool_emb, _ = case.pool
    return ref_distance(case.emb, pool_emb, distance).tolist()


def as_rows(out: tuple[torch.Tensor, ...]) -> list[tuple[int, ...]]:
    """Index tuple -> list of python tuples, for set/list comparisons."""
    return list(zip(*(t.tolist() for t in out)))


def check_index_tuple(out: tuple[torch.Tensor, ...], n: int, device: torch.device | None = None) -> None:
    """The PML format: n 1-D int64 tensors of matching lengths, on the embeddings' device."""
    assert isinstance(out, tuple) and len(out) == n
    for t in out:
        assert t.dtype == torch.int64 and t.ndim == 1
        assert not t.requires_grad
        if device is not None:
            assert t.device == device
    if n == 3:
        assert len(out[0]) == len(out[1]) == len(out[2])
    else:
        assert len(out[0]) == len(out[1]) and len(out[2]) == len(out[3])


# ------------------------------------------------- each miner's output against the references
def _tol(dist: list[list[float]]) -> float:
    """Absolute tolerance for float32-vs-float64 comparisons, scaled to the distances' magnitude."""
    return TOL * (1.0 + max((abs(x) for row in dist for x in row), default=0.0))


def check_batch_hard(case: Case, distance: str, out: tuple[torch.Tensor, ...]) -> None:
    check_index_tuple(out, 3)
    dist = distances(case, distance)
    tol = _tol(dist)
    expected = [a for a in range(len(case.labels)) if positives_of(case, a) and negatives_of(case, a)]
    assert out[0].tolist() == expected
    for a, p, n in as_rows(out):
        pos, neg = positives_of(case, a), negatives_of(case, a)
        assert p in pos and n in neg
        assert dist[a][p] >= max(dist[a][j] for j in pos) - tol
        assert dist[a][n] <= min(dist[a][j] for j in neg) + tol


def check_hard_topk(case: Case, distance: str, k: int, out: tuple[torch.Tensor, ...]) -> None:
    check_index_tuple(out, 3)
    dist = distances(case, distance)
    tol = _tol(dist)
    rows = as_rows(out)
    assert [a for a, _, _ in rows] == sorted(a for a, _, _ in rows)
    for a in range(len(case.labels)):
        pos, neg = positives_of(case, a), negatives_of(case, a)
        mine = [(p, n) for aa, p, n in rows if aa == a]
        if not pos or not neg:
            assert mine == []
            continue
        assert len(mine) == min(k, len(neg))
        assert len({p for p, _ in mine}) == 1
        p = mine[0][0]
        assert p in pos and dist[a][p] >= max(dist[a][j] for j in pos) - tol
        got = [dist[a][n] for _, n in mine]
        assert len({n for _, n in mine}) == len(mine) and all(n in neg for _, n in mine)
        assert all(x <= y + tol for x, y in itertools.pairwise(got))  # increasing distance
        best = sorted(dist[a][j] for j in neg)[: len(mine)]
        assert all(abs(x - y) <= tol for x, y in zip(got, best))


def check_semi_hard(
    case: Case, distance: str, margin: float, fallback: str, out: tuple[torch.Tensor, ...]
) -> None:
    check_index_tuple(out, 3)
    dist = distances(case, distance)
    tol = _tol(dist)
    rows = as_rows(out)
    got = {(a, p): n for a, p, n in rows}
    assert len(got) == len(rows), "one triplet per anchor-positive pair at most"
    assert [(a, p) for a, p, _ in rows] == sorted(got), "ordered by anchor, then positive"
    all_pairs = {(a, p) for a in range(len(case.labels)) for p in positives_of(case, a)}
    assert set(got) <= all_pairs
    for a, p in sorted(all_pairs):
        neg = negatives_of(case, a)
        d_ap = dist[a][p]
        d = {j: dist[a][j] for j in neg}
        above = [x for x in d.values() if x > d_ap + tol]
        successor = min(above) if above else math.inf
        window_strict = any(d_ap + tol < x < d_ap + margin - tol for x in d.values())
        window_loose = any(d_ap - tol < x < d_ap + margin + tol for x in d.values())
        n = got.get((a, p))
        if n is not None:
            assert n in neg
        is_successor = n is not None and d_ap - tol < d[n] <= successor + tol
        if fallback == "none":
            assert (n is not None) or not window_strict
            assert (n is None) or (window_loose and is_successor and d[n] < d_ap + margin + tol)
        elif fallback == "hardest":
            exists_loose = any(x > d_ap - tol for x in d.values())
            assert (n is not None) or not above
            assert (n is None) or (exists_loose and is_successor)
        else:
            assert (n is not None) == bool(neg)
            if n is None:
                continue
            if window_strict:
                assert is_successor and d[n] < d_ap + margin + tol
            elif not window_loose:
                assert d[n] <= min(d.values()) + tol
            else:
                assert (is_successor and d[n] < d_ap + margin + tol) or d[n] <= min(d.values()) + tol


def check_multi_similarity(case: Case, distance: str, epsilon: float, out: tuple[torch.Tensor, ...]) -> None:
    check_index_tuple(out, 4)
    dist = distances(case, distance)
    tol = _tol(dist)
    got_pos, got_neg = as_rows(out[:2]), as_rows(out[2:])
    assert len(set(got_pos)) == len(got_pos) and len(set(got_neg)) == len(got_neg)
    sure_pos, maybe_pos, sure_neg, maybe_neg = set(), set(), set(), set()
    for a in range(len(case.labels)):
        pos, neg = positives_of(case, a), negatives_of(case, a)
        if not pos or not neg:
            continue
        min_neg = min(dist[a][j] for j in neg)
        max_pos = max(dist[a][j] for j in pos)
        for p in pos:
            margin = dist[a][p] + epsilon - min_neg
            (sure_pos if margin > tol else maybe_pos if margin > -tol else set()).add((a, p))
        for n in neg:
            margin = max_pos - (dist[a][n] - epsilon)
            (sure_neg if margin > tol else maybe_neg if margin > -tol else set()).add((a, n))
    assert sure_pos <= set(got_pos) <= sure_pos | maybe_pos
    assert sure_neg <= set(got_neg) <= sure_neg | maybe_neg
    assert got_pos == sorted(got_pos) and got_neg == sorted(got_neg)


def check_distance_weighted(case: Case, nonzero_loss_cutoff: float, out: tuple[torch.Tensor, ...]) -> None:
    """Structure only (the statistics are tested in test_distance_weighted.py)."""
    check_index_tuple(out, 3)
    pool_emb, _ = case.pool
    xn = torch.nn.functional.normalize(case.emb.double(), dim=1)
    yn = torch.nn.functional.normalize(pool_emb.double(), dim=1)
    chord = torch.cdist(xn, yn)
    rows = as_rows(out)
    got_pairs = [(a, p) for a, p, _ in rows]
    assert got_pairs == sorted(set(got_pairs)), "one negative per anchor-positive pair, in order"
    for a in range(len(case.labels)):
        pos, neg = positives_of(case, a), negatives_of(case, a)
        eligible_sure = [j for j in neg if chord[a, j] < nonzero_loss_cutoff - TOL]
        eligible_loose = [j for j in neg if chord[a, j] < nonzero_loss_cutoff + TOL]
        mine = [(p, n) for aa, p, n in rows if aa == a]
        if eligible_sure:
            assert [p for p, _ in mine] == pos
        if not eligible_loose:
            assert mine == []
        for _, n in mine:
            assert n in eligible_loose
