"""``SemiHardMiner``: FaceNet semi-hard triplets, one negative per anchor-positive pair."""

from __future__ import annotations

import functools
from typing import Final

import torch

from composer_dynsample.distances import RankMatrix
from composer_dynsample.mining._common import AnchorChunk, LabelIndex, MiningInputs, Triplets, pair_triplets
from composer_dynsample.mining._semi_hard_kernel import successors
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.validation import check_choice, check_float

__all__ = ["SEMI_HARD_FALLBACKS", "SemiHardMiner"]

#: Valid values of :class:`SemiHardMiner`'s ``fallback`` option.
SEMI_HARD_FALLBACKS: Final[tuple[str, ...]] = ("hardest", "hardest_negative", "none")


class SemiHardMiner(BaseMiner):
    """FaceNet semi-hard triplets (Schroff et al., 2015): one negative per anchor-positive pair.

    For every anchor-positive pair ``(a, p)`` the semi-hard negative is the nearest negative ``n`` with
    ``d(a, p) < d(a, n) < d(a, p) + margin``. When a pair has none, ``fallback`` decides:

    * ``"hardest"`` (default): the nearest negative with ``d(a, n) > d(a, p)`` (beyond the margin, so it
      gives zero loss under a triplet loss with the same margin); the pair is dropped if every negative is
      at most as far as the positive. With this fallback the result is "the nearest negative farther than
      the positive" for every pair, as in TensorFlow's ``triplet_semihard_loss``; ``margin`` then only
      decides which of these are semi-hard proper, not which negative is returned.
    * ``"hardest_negative"``: the nearest negative overall (the batch-hard negative of the anchor, possibly
      closer than the positive); the pair is dropped only if the anchor has no negative.
    * ``"none"``: the pair is dropped. The result is then a subset of pytorch-metric-learning's
      ``TripletMarginMiner(margin, type_of_triplets="semihard")`` (which returns *all* semi-hard triplets).

    Triplets are ordered by anchor, then by positive index. Distances are computed as true distances
    (``1 - cos`` for cosine), so ``margin`` is in distance units. Called as
    :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns triplets.

    Args:
        margin (float): Width of the semi-hard band, ``>= 0``. Default: ``0.2``.
        fallback (str): One of :data:`SEMI_HARD_FALLBACKS`. Default: ``"hardest"``.
        distance (str), chunk_size (int, optional): As for every miner (:class:`BaseMiner`).

    Example:
        Points on a line; pair (1, 0) has d = 1 and negatives at 0.1, 0.5 and 2.0 from the anchor, so
        no semi-hard negative for margin 0.3: "none" drops it, "hardest" takes sample 4 (at 2.0).

        >>> emb = torch.tensor([[0.0], [1.0], [1.1], [1.5], [3.0]])
        >>> labels = torch.tensor([0, 0, 1, 1, 2])
        >>> SemiHardMiner(margin=0.3, distance="euclidean", fallback="none")(emb, labels)
        (tensor([0, 3]), tensor([1, 2]), tensor([2, 1]))
        >>> SemiHardMiner(margin=0.3, distance="euclidean", fallback="hardest")(emb, labels)
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 4, 0, 1]))
    """

    def __init__(
        self,
        *,
        margin: float = 0.2,
        fallback: str = "hardest",
        distance: str = "cosine",
        chunk_size: int | None = None,
    ) -> None:
        self.margin = check_float("margin", margin, minimum=0.0)
        self.fallback = check_choice("fallback", fallback, SEMI_HARD_FALLBACKS)
        super().__init__(distance=distance, chunk_size=chunk_size)

    def mine(self, inputs: MiningInputs, index: LabelIndex) -> Triplets:  # type: ignore[override]
        ranks = RankMatrix(
            inputs.embeddings, inputs.ref_embeddings, self.distance, nonnegative=True, dtype=inputs.dtype
        )
        # Matrix and two same-size float buffers, int64 bucket, int64 key and its float64 source.
        bytes_per_entry = 3 * ranks.dtype.itemsize + 24
        return pair_triplets(
            ranks,
            index,
            bytes_per_entry,
            self.chunk_size,
            functools.partial(self._negatives, index=index, inputs=inputs),
        )

    def _negatives(
        self, chunk: AnchorChunk, index: LabelIndex, inputs: MiningInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keep, negative)``, ``(rows, W)`` like the positives table: which pairs get which negative."""
        start, stop, mat, pos_idx, pos_valid = chunk
        big = torch.finfo(mat.dtype).max
        pos_dist = mat.gather(1, pos_idx).masked_fill_(~pos_valid, big)
        index.mask_same_label(mat, start, pos_idx, pos_valid, big)
        succ_dist, succ_col, found, _, min_col = successors(mat, pos_dist)
        # A masked (same-label) entry comes back only when no negative lies above the threshold.
        found &= inputs.ref_labels[succ_col] != inputs.labels[start:stop, None]
        semi = found & (succ_dist < pos_dist + self.margin)
        if self.fallback == "none":
            return pos_valid & semi, succ_col
        if self.fallback == "hardest":
            return pos_valid & found, succ_col
        has_neg = index.n_neg[start:stop, None] > 0
        return pos_valid & (semi | has_neg), torch.where(semi, succ_col, min_col[:, None])
