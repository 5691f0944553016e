"""``DistanceWeightedMiner``: negatives sampled by inverse distance density (Wu et al., 2017)."""

from __future__ import annotations

import math
from typing import Final

import torch

from composer_dynsample.distances import RankMatrix
from composer_dynsample.mining._common import AnchorChunk, LabelIndex, MiningInputs, Triplets, pair_triplets
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.validation import check_float, check_generator

__all__ = ["DistanceWeightedMiner"]

# Log-weight offset of entries that must not be sampled (finite in float32), and the smallest
# log(1 - c/2) kept (log of the smallest normal float32).
_EXCLUDED: Final[float] = 1e30
_LOG_TINY: Final[float] = math.log(torch.finfo(torch.float32).tiny)
_LOG_WEIGHT_FLOOR: Final[float] = -80.0


class DistanceWeightedMiner(BaseMiner):
    """Distance-weighted negative sampling (Wu et al., 2017, "Sampling matters in deep embedding learning").

    Embeddings are L2-normalised and ``d`` is the Euclidean distance between them, in ``[0, 2]``, whatever
    ``distance`` says (the weights are defined for this distance only; see ``distance`` below). Pairwise
    distances of points uniform on the unit sphere in ``D`` dimensions have density
    ``q(d) ∝ d^(D-2) (1 - d^2/4)^((D-3)/2)``; each negative ``n`` of anchor ``a`` gets weight
    ``w ∝ 1 / q(max(d(a, n), cutoff))``, and ``w = 0`` where ``d(a, n) >= nonzero_loss_cutoff``. Weights are
    computed in log space (float32 or wider), normalised by the row maximum. For every anchor-positive pair
    one negative is drawn, independently and with probability proportional to ``w``; pairs whose anchor has
    no negative of non-zero weight are dropped.

    Sampling uses one uniform number per anchor-positive pair, drawn up front from ``generator`` (or the
    global RNG) and mapped through each row's cumulative weights, so the result is deterministic given the
    generator state and independent of chunking. Called as
    :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns triplets ordered by anchor, then
    positive index.

    Args:
        cutoff (float): Distances below it are clipped up to it before weighting (bounds the variance),
            ``>= 0``. Default: ``0.5``.
        nonzero_loss_cutoff (float): Negatives at this distance or beyond are never sampled, ``> 0``.
            Default: ``1.4``.
        generator (torch.Generator, optional): The random source. Default: torch's global generator.
        distance (str): Validated for the miners' common options; the sampling always uses the Euclidean
            distance of L2-normalised embeddings, the cutoffs' units (each distance is monotone in it).
            Default: ``"euclidean"``.
        chunk_size (int, optional): As for every miner (:class:`BaseMiner`).

    Example:
        Anchor 0's only negative closer than 1.4 is sample 2, so it is always drawn; anchor 1 has two
        eligible negatives and draws one of them.

        >>> emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
        >>> miner = DistanceWeightedMiner(generator=torch.Generator().manual_seed(0))
        >>> miner(emb, torch.tensor([0, 0, 1, 1]))
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 3, 0, 1]))
    """

    def __init__(
        self,
        *,
        cutoff: float = 0.5,
        nonzero_loss_cutoff: float = 1.4,
        generator: torch.Generator | None = None,
        distance: str = "euclidean",
        chunk_size: int | None = None,
    ) -> None:
        self.cutoff = check_float("cutoff", cutoff, minimum=0.0)
        self.nonzero_loss_cutoff = check_float(
            "nonzero_loss_cutoff", nonzero_loss_cutoff, minimum=0.0, strict_minimum=True
        )
        self.generator = check_generator("generator", generator)
        super().__init__(distance=distance, chunk_size=chunk_size)

    def mine(self, inputs: MiningInputs, index: LabelIndex) -> Triplets:  # type: ignore[override]
        # In float32 at least (see working_dtype): (D - 2) * log(d) amplifies rounding by D.
        ranks = RankMatrix(
            inputs.embeddings, inputs.ref_embeddings, "cosine", nonnegative=True, dtype=inputs.dtype
        )
        uniforms = _pair_uniforms(index, self.generator, inputs.device)
        draw = _Draw(index, uniforms, inputs.embeddings.shape[1], (self.cutoff, self.nonzero_loss_cutoff))
        # The matrix and two temporaries of its dtype.
        return pair_triplets(ranks, index, 3 * ranks.dtype.itemsize, self.chunk_size, draw)


class _Draw:
    """Per chunk of anchors, one negative drawn for every anchor-positive pair, with the next uniforms.

    The uniforms are consumed in (anchor, positive) order whatever the chunking, so the draws do not
    depend on it; pairs whose anchor has no negative of non-zero weight are not kept.
    """

    def __init__(
        self, index: LabelIndex, uniforms: torch.Tensor, dim: int, cutoffs: tuple[float, float]
    ) -> None:
        self.index, self.uniforms, self.dim, self.cutoffs = index, uniforms, dim, cutoffs
        self.offset = 0

    def __call__(self, chunk: AnchorChunk) -> tuple[torch.Tensor, torch.Tensor]:
        cdf, has_weight = _weight_cdf(chunk, self.index, self.dim, *self.cutoffs)
        rows, slots = chunk.pos_valid.nonzero(as_tuple=True)
        end = self.offset + rows.shape[0]
        negative = _draw(cdf, self.uniforms[self.offset : end], rows, slots, chunk.pos_idx.shape[1])
        self.offset = end
        return chunk.pos_valid & has_weight, negative


def _pair_uniforms(
    index: LabelIndex, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """One uniform per anchor-positive pair, in (anchor, positive index) order, drawn before chunking."""
    total_pairs = int(index.n_pos.sum())
    gen_device = generator.device if generator is not None else device
    return torch.rand(total_pairs, generator=generator, dtype=torch.float64, device=gen_device).to(device)


def _weight_cdf(
    chunk: AnchorChunk, index: LabelIndex, dim: int, cutoff: float, nonzero_loss_cutoff: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per anchor, the cumulative sums of its sampling weights over the pool, and whether any is non-zero.

    The chunk's matrix holds cosine distances and is overwritten.
    """
    # In terms of the cosine distance c = 1 - cos = d^2 / 2 (fewer passes than going through d):
    # -log q(d) = -(D-2)/2 log(2c) - (D-3)/2 log(1 - c/2), clipping d >= cutoff is c >= cutoff^2 / 2.
    c_min = max(cutoff**2 / 2.0, torch.finfo(torch.float32).tiny)
    c_max = nonzero_loss_cutoff**2 / 2.0
    cos_dist = chunk.mat
    # 1.0 where the entry may not be sampled (beyond the cutoff, positives, self). Arithmetic on this
    # float mask is several times faster on CPU than masked_fill with a bool one.
    excluded = torch.ge(cos_dist, c_max, out=torch.empty_like(cos_dist))
    index.mask_same_label(excluded, chunk.start, chunk.pos_idx, chunk.pos_valid, 1.0)
    # c <= 2 up to rounding; clamping keeps log1p(-c/2) off NaN, and its -inf at c = 2 is clamped.
    clipped = cos_dist.clamp_(min=c_min, max=2.0)
    log_w = clipped.mul(-0.5).log1p_().clamp_(min=_LOG_TINY).mul_(-(dim - 3) / 2.0)
    log_w.sub_(clipped.mul_(2.0).log_(), alpha=(dim - 2) / 2.0)
    # Excluded entries drop to about -1e30, far below any real log-weight, so the row maximum is
    # over the sampleable entries; it normalises the weights so that exp() cannot overflow.
    log_w.sub_(excluded, alpha=_EXCLUDED)
    row_max = log_w.amax(dim=1, keepdim=True)
    has_weight = row_max > -_EXCLUDED / 2
    row_max.masked_fill_(~has_weight, 0.0)
    # Relative weights below e^-80 are raised to e^-80 (still negligible): exp() of very negative
    # or subnormal-producing arguments takes a far slower path on CPU. Excluded entries are then
    # zeroed exactly by the mask.
    weights = log_w.sub_(row_max).clamp_(min=_LOG_WEIGHT_FLOOR).exp_()
    return weights.mul_(excluded.neg_().add_(1.0)).cumsum_(dim=1), has_weight


def _draw(
    cdf: torch.Tensor, uniforms: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, width: int
) -> torch.Tensor:
    """The pool index drawn for pair ``(rows[i], slots[i])`` with ``uniforms[i]``, as a ``(rows, width)`` table."""
    # Inverse CDF: the first j with cdf[j] > u * total has weight > 0 (cumsum of non-negative
    # numbers is monotone, and equal neighbours mean a zero weight). Keep the target below total
    # so rounding of u * total cannot step past the last positive weight.
    total = cdf[:, -1:]
    target = torch.zeros(cdf.shape[0], width, dtype=cdf.dtype, device=cdf.device)
    target[rows, slots] = (uniforms * total[rows, 0]).to(cdf.dtype)
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[1] - 1)
