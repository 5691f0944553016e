"""``MultiSimilarityMiner``: multi-similarity positive and negative pairs (Wang et al., 2019)."""

from __future__ import annotations

import torch

from composer_dynsample.distances import RankMatrix
from composer_dynsample.mining._common import (
    LabelIndex,
    MiningInputs,
    Pairs,
    anchor_chunks,
    cat_indices,
    shift_rows,
)
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.validation import check_float

__all__ = ["MultiSimilarityMiner"]


class MultiSimilarityMiner(BaseMiner):
    """Multi-similarity pair mining (Wang et al., 2019).

    With ``d`` the distance, a positive pair ``(a, p)`` is kept if ``d(a, p) + epsilon > min_n d(a, n)``
    and a negative pair ``(a, n)`` if ``d(a, n) - epsilon < max_p d(a, p)``; for ``"cosine"`` this is
    the paper's rule on similarities, ``s(a, p) - epsilon < max_n s(a, n)`` and
    ``s(a, n) + epsilon > min_p s(a, p)``. Anchors without a negative keep no positive pair and vice
    versa. On L2-normalised embeddings the pairs equal pytorch-metric-learning's
    ``MultiSimilarityMiner(epsilon)`` (as sets; with ``distance="cosine"`` the decisions are
    bit-identical). Pairs are ordered by anchor, then pool index. Called as
    :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns pairs ``(a1, p, a2, n)``: positive
    pairs ``(a1, p)`` and negative pairs ``(a2, n)``.

    Args:
        epsilon (float): Margin of the mining rule, ``>= 0``. Default: ``0.1``.
        distance (str), chunk_size (int, optional): As for every miner (:class:`BaseMiner`).

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
        >>> MultiSimilarityMiner(epsilon=0.1)(emb, torch.tensor([0, 0, 1, 1]))
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([0, 1, 1, 2, 2, 3]), tensor([2, 2, 3, 0, 1, 1]))
    """

    kind = "pairs"

    def __init__(
        self, *, epsilon: float = 0.1, distance: str = "cosine", chunk_size: int | None = None
    ) -> None:
        self.epsilon = check_float("epsilon", epsilon, minimum=0.0)
        super().__init__(distance=distance, chunk_size=chunk_size)

    def mine(self, inputs: MiningInputs, index: LabelIndex) -> Pairs:  # type: ignore[override]
        epsilon = self.epsilon
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, self.distance, dtype=inputs.dtype)
        pos_parts, neg_masks = [], []
        # The matrix plus a bool mask per entry.
        for start, stop, mat, pos_idx, pos_valid in anchor_chunks(
            ranks, index, ranks.dtype.itemsize + 1, self.chunk_size
        ):
            finfo = torch.finfo(mat.dtype)
            pos_vals = mat.gather(1, pos_idx)
            hardest_pos = pos_vals.masked_fill(~pos_valid, finfo.min).amax(dim=1)
            index.mask_same_label(mat, start, pos_idx, pos_valid, finfo.max)
            hardest_neg = mat.amin(dim=1)
            has_neg = index.n_neg[start:stop, None] > 0
            # Written as `d + eps > x` and `d - eps < x` (not `d > x - eps`) so that, with the cosine rank
            # matrix being exactly -s, the rounding matches similarity code's `s - eps < x` bit for bit.
            keep_pos = pos_valid & has_neg & (pos_vals + epsilon > hardest_neg[:, None])
            rows, slots = keep_pos.nonzero(as_tuple=True)
            pos_parts.append((shift_rows(rows, start), pos_idx[rows, slots]))
            # Same-label entries hold finfo.max, and finfo.max - eps rounds back to finfo.max, which is
            # never below a real distance; anchors without positives have hardest_pos == finfo.min.
            neg_masks.append((start, mat.sub_(epsilon) < hardest_pos[:, None]))
            del mat  # before the next chunk's matrix is computed
        a1, p = cat_indices(pos_parts, 2, inputs.device)
        return a1, p, *_mask_pairs(neg_masks)


def _mask_pairs(masks: list[tuple[int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of the true entries of row-chunk masks ``(start, mask)``, in row-major order.

    The negative pairs can be most of ``B x M`` (16 bytes each), so they are written straight into one
    ``(n, 2)`` tensor, a chunk at a time, rather than concatenated from per-chunk parts, which would
    hold them twice.
    """
    if len(masks) == 1:
        start, mask = masks[0]
        rows, cols = mask.nonzero(as_tuple=True)
        return shift_rows(rows, start), cols
    counts = [int(mask.count_nonzero()) for _, mask in masks]
    pairs = torch.empty(sum(counts), 2, dtype=torch.int64, device=masks[0][1].device)
    offset = 0
    for (start, mask), count in zip(masks, counts):
        chunk = pairs[offset : offset + count]
        torch.nonzero(mask, out=chunk)
        chunk[:, 0] += start
        offset += count
    return pairs[:, 0], pairs[:, 1]
