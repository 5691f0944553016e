"""``HardTopKMiner``: per anchor its ``k`` nearest negatives, each with the anchor's farthest positive."""

from __future__ import annotations

import torch

from composer_dynsample.distances import RankMatrix
from composer_dynsample.mining._common import (
    LabelIndex,
    MiningInputs,
    Triplets,
    anchor_chunks,
    cat_indices,
    hardest_positive,
    shift_rows,
)
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.validation import check_int

__all__ = ["HardTopKMiner"]


class HardTopKMiner(BaseMiner):
    """Per anchor, its ``k`` nearest negatives, each paired with the anchor's hardest positive.

    Every triplet of an anchor uses the same positive: the farthest one, as in
    :class:`~composer_dynsample.mining.BatchHardMiner` (so ``k=1`` returns the batch-hard triplets). An
    anchor with fewer than ``k`` negatives gets one triplet per negative; anchors without a positive or a
    negative are left out. Triplets are ordered by anchor, then by increasing anchor-negative distance.
    Called as :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns triplets.

    Args:
        k (int): Number of negatives per anchor, ``>= 1``. Default: ``1``.
        distance (str), chunk_size (int, optional): As for every miner (:class:`BaseMiner`).

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
        >>> HardTopKMiner(k=2)(emb, torch.tensor([0, 0, 1, 1]))
        (tensor([0, 0, 1, 1, 2, 2, 3, 3]), tensor([1, 1, 0, 0, 3, 3, 2, 2]), tensor([2, 3, 2, 3, 1, 0, 1, 0]))
    """

    def __init__(self, *, k: int = 1, distance: str = "cosine", chunk_size: int | None = None) -> None:
        self.k = check_int("k", k, minimum=1)
        super().__init__(distance=distance, chunk_size=chunk_size)

    def mine(self, inputs: MiningInputs, index: LabelIndex) -> Triplets:  # type: ignore[override]
        # Only the order of distances matters here: the squared Euclidean distance saves a square root.
        distance = "squared_euclidean" if self.distance == "euclidean" else self.distance
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, distance, dtype=inputs.dtype)
        k_eff = min(self.k, ranks.shape[1])
        parts = []
        for chunk in anchor_chunks(ranks, index, ranks.dtype.itemsize, self.chunk_size):
            start, stop, mat = chunk.start, chunk.stop, chunk.mat
            positive = hardest_positive(chunk, index)
            if k_eff == 1:
                # min() with indices is about twice as fast as argmin() on CPU.
                negatives = mat.min(dim=1, keepdim=True).indices
            else:
                negatives = mat.topk(k_eff, dim=1, largest=False, sorted=True).indices
            # Masked entries sort last, so the first n_neg slots of a row are exactly its negatives.
            slots = torch.arange(k_eff, device=mat.device)
            keep = (slots < index.n_neg[start:stop, None]) & (index.n_pos[start:stop, None] > 0)
            rows, cols = keep.nonzero(as_tuple=True)
            parts.append((shift_rows(rows, start), positive[rows], negatives[rows, cols]))
        return cat_indices(parts, 3, inputs.device)  # type: ignore[return-value]
