"""Tests of :mod:`composer_dynsample.mining`, with shared brute-force references and input strategies.

The references below loop over anchors in plain Python on float64 distances, so that they are obviously
right; comparisons against the (float32) miners allow ``TOL`` for ties and rounding.
"""

from __future__ import annotations

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
