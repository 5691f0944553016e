"""Batched miners: pure functions from embeddings and labels to index tuples.

Every miner takes ``embeddings`` ``(B, D)``, integer ``labels`` ``(B,)`` and optionally a reference pool
``ref_embeddings`` ``(M, D)`` / ``ref_labels`` ``(M,)`` (e.g. a memory bank). Anchors index
``embeddings``; positives and negatives index the pool, which is the batch itself when no pool is given
(pytorch-metric-learning's convention). Only in that case does the miner exclude pairing anchor ``i``
with pool entry ``i``; an explicit pool is treated as distinct samples, as pytorch-metric-learning does
(passing the very same ``embeddings``/``labels`` objects as pool counts as "no pool").

Outputs follow pytorch-metric-learning's ``indices_tuple`` formats, as int64 tensors on the embeddings'
device: triplets ``(anchors, positives, negatives)`` or pairs ``(a1, p, a2, n)``. Empty results are
tuples of ``(0,)`` tensors.

Implementation notes: a miner computes one distance matrix per chunk of anchors (chunks keep the working
set near :data:`~composer_dynsample.mining._common.CHUNK_BYTES`; ``chunk_size`` overrides it) and uses
only masked reductions on it. Positives are looked up from per-anchor same-label lists
(:class:`~composer_dynsample.mining._common.LabelIndex`), so no ``B x M`` label mask is built. Masking
uses ``torch.finfo(dtype).max`` / ``.min`` of the matrix dtype (or boolean masks), never a literal that
overflows fp16. Distances are computed in :func:`~composer_dynsample.distances.working_dtype`: float32
for fp16 / bf16 inputs, float64 where float32 would overflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Final, NamedTuple

import torch

from composer_dynsample.distances import RankMatrix
from composer_dynsample.mining._common import (
    LabelIndex,
    MiningInputs,
    empty_indices,
    row_chunks,
    scratch_buffer,
    validate_mining_inputs,
)
from composer_dynsample.validation import InputTypeError, check_choice, check_float, check_int, describe

__all__ = [
    "SEMI_HARD_FALLBACKS",
    "batch_hard",
    "distance_weighted",
    "hard_topk",
    "multi_similarity",
    "semi_hard",
]

#: Valid values of :func:`semi_hard`'s ``fallback`` argument.
SEMI_HARD_FALLBACKS: Final[tuple[str, ...]] = ("hardest", "hardest_negative", "none")

Triplets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
# _successors: (values, cols, found, min_value, min_col).
_Successors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# Up to this many positives per anchor, semi_hard counts the thresholds below each entry with one
# comparison pass per threshold; above it, through a grid of cells (a fixed number of passes, two of
# them table lookups).
_LOOP_MAX_WIDTH: Final[int] = 12
# Grid cells per threshold (more cells: fewer thresholds share one, fewer lookups), and a bound on the
# scale that maps distances to cells (keeps it finite when all of a row's thresholds are equal).
_GRID_CELLS_PER_THRESHOLD: Final[int] = 16
_GRID_MAX_SCALE: Final[float] = 1e30
# Pool indices packed into the low mantissa bits of a float64 copy of a <=32-bit distance (see
# _successors): float32 -> float64 leaves 29 low bits zero.
_INDEX_BITS: Final[int] = 29
_INT64_MAX: Final[int] = torch.iinfo(torch.int64).max
# distance_weighted: log-weight offset of entries that must not be sampled (finite in float32), and the
# smallest log(1 - c/2) kept (log of the smallest normal float32).
_EXCLUDED: Final[float] = 1e30
_LOG_TINY: Final[float] = math.log(torch.finfo(torch.float32).tiny)
_LOG_WEIGHT_FLOOR: Final[float] = -80.0


def _prepare(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None,
    ref_labels: torch.Tensor | None,
    distance: str,
    chunk_size: int | None,
    self_offset: int | None,
) -> tuple[MiningInputs, LabelIndex | None]:
    """Validate, and return the label index, or ``None`` when nothing can be mined."""
    inputs = validate_mining_inputs(
        embeddings, labels, ref_embeddings, ref_labels, distance=distance, self_offset=self_offset
    )
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    if inputs.is_empty:
        return inputs, None
    index = LabelIndex(inputs.labels, inputs.ref_labels, inputs.self_offset)
    # Every miner needs an anchor-positive pair; no positive anywhere means an empty result.
    if not bool((index.n_pos > 0).any()):
        return inputs, None
    return inputs, index


def _order_equivalent(distance: str) -> str:
    """A cheaper distance with the same order, for miners that only rank (no margin, no threshold)."""
    return "squared_euclidean" if distance == "euclidean" else distance


def _cat(parts: list[tuple[torch.Tensor, ...]], n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    if not parts:
        return empty_indices(n, device)
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat([part[i] for part in parts]) for i in range(n))


def _shift(rows: torch.Tensor, start: int) -> torch.Tensor:
    """Chunk row numbers to anchor indices (skipping a pass over large outputs for the first chunk)."""
    return rows + start if start else rows


class _Chunk(NamedTuple):
    """Anchors ``start:stop``: their rows of the distance matrix and their positives (``LabelIndex.chunk``)."""

    start: int
    stop: int
    mat: torch.Tensor
    pos_idx: torch.Tensor
    pos_valid: torch.Tensor


def _chunks(
    ranks: RankMatrix, index: LabelIndex, bytes_per_entry: int, chunk_size: int | None
) -> Iterator[_Chunk]:
    """The anchors in chunks whose working set, ``bytes_per_entry`` per matrix entry, fits the budget."""
    n_rows, n_cols = ranks.shape
    for start, stop in row_chunks(n_rows, n_cols, bytes_per_entry, chunk_size):
        pos_idx, pos_valid = index.chunk(start, stop)
        yield _Chunk(start, stop, ranks.rows(start, stop), pos_idx, pos_valid)


def _hardest_positive(chunk: _Chunk, index: LabelIndex) -> torch.Tensor:
    """Each anchor's farthest positive; the chunk's same-label entries are then set to ``finfo.max``."""
    mat, pos_idx, pos_valid = chunk.mat, chunk.pos_idx, chunk.pos_valid
    finfo = torch.finfo(mat.dtype)
    # The hardest positive comes from the small (rows, K) positives table, not the full row.
    pos_vals = mat.gather(1, pos_idx).masked_fill_(~pos_valid, finfo.min)
    positive = pos_idx.gather(1, pos_vals.argmax(dim=1, keepdim=True)).squeeze(1)
    index.mask_same_label(mat, chunk.start, pos_idx, pos_valid, finfo.max)
    return positive


def batch_hard(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    distance: str = "cosine",
    chunk_size: int | None = None,
    self_offset: int | None = None,
) -> Triplets:
    """Batch-hard triplets (Hermans et al., 2017): per anchor its farthest positive and nearest negative.

    Anchors without a positive or without a negative are left out, so at most one triplet per anchor is
    returned, in increasing anchor order. On L2-normalised embeddings this returns the same triplets as
    pytorch-metric-learning's ``BatchHardMiner()`` (ties aside).

    Args:
        embeddings: ``(B, D)`` floating-point anchors.
        labels: ``(B,)`` integer labels.
        ref_embeddings: Optional ``(M, D)`` pool for positives and negatives (default: the batch).
        ref_labels: ``(M,)`` labels of the pool; required with ``ref_embeddings``.
        self_offset: Where the pool holds the anchors (a memory after the batch, a cross-rank pool),
            anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        distance: ``"cosine"`` (default), ``"euclidean"`` or ``"squared_euclidean"``.
        chunk_size: Anchors per distance-matrix chunk; ``None`` bounds a chunk's matrix to about 64 MiB.

    Returns:
        ``(anchors, positives, negatives)``, 1-D int64 tensors on the embeddings' device.

    Raises:
        ValueError: On invalid inputs (see :func:`validate_mining_inputs`) or ``chunk_size < 1``.

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
        >>> batch_hard(emb, torch.tensor([0, 0, 1, 1]))
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 2, 1, 1]))
    """
    return hard_topk(
        embeddings,
        labels,
        ref_embeddings,
        ref_labels,
        k=1,
        distance=distance,
        chunk_size=chunk_size,
        self_offset=self_offset,
    )


def hard_topk(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    k: int = 1,
    distance: str = "cosine",
    chunk_size: int | None = None,
    self_offset: int | None = None,
) -> Triplets:
    """Per anchor, its ``k`` nearest negatives, each paired with the anchor's hardest positive.

    Every triplet of an anchor uses the same positive: the farthest one, as in :func:`batch_hard` (so
    ``k=1`` returns the batch-hard triplets). An anchor with fewer than ``k`` negatives gets one triplet
    per negative; anchors without a positive or a negative are left out. Triplets are ordered by anchor,
    then by increasing anchor-negative distance.

    Args:
        embeddings: ``(B, D)`` floating-point anchors.
        labels: ``(B,)`` integer labels.
        ref_embeddings: Optional ``(M, D)`` pool (default: the batch).
        ref_labels: ``(M,)`` labels of the pool; required with ``ref_embeddings``.
        self_offset: Where the pool holds the anchors (a memory after the batch, a cross-rank pool),
            anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        k: Number of negatives per anchor, ``>= 1``.
        distance: ``"cosine"`` (default), ``"euclidean"`` or ``"squared_euclidean"``.
        chunk_size: Anchors per distance-matrix chunk; ``None`` bounds a chunk's matrix to about 64 MiB.

    Returns:
        ``(anchors, positives, negatives)``, 1-D int64 tensors on the embeddings' device.

    Raises:
        ValueError: On invalid inputs, ``k < 1`` or ``chunk_size < 1``.

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
        >>> hard_topk(emb, torch.tensor([0, 0, 1, 1]), k=2)
        (tensor([0, 0, 1, 1, 2, 2, 3, 3]), tensor([1, 1, 0, 0, 3, 3, 2, 2]), tensor([2, 3, 2, 3, 1, 0, 1, 0]))
    """
    with torch.no_grad():
        k = check_int("k", k, minimum=1)
        inputs, index = _prepare(
            embeddings, labels, ref_embeddings, ref_labels, distance, chunk_size, self_offset
        )
        if index is None:
            return empty_indices(3, inputs.device)
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, _order_equivalent(distance))
        k_eff = min(k, ranks.shape[1])
        parts = []
        for chunk in _chunks(ranks, index, ranks.dtype.itemsize, chunk_size):
            start, stop, mat = chunk.start, chunk.stop, chunk.mat
            positive = _hardest_positive(chunk, index)
            if k_eff == 1:
                # min() with indices is about twice as fast as argmin() on CPU.
                negatives = mat.min(dim=1, keepdim=True).indices
            else:
                negatives = mat.topk(k_eff, dim=1, largest=False, sorted=True).indices
            # Masked entries sort last, so the first n_neg slots of a row are exactly its negatives.
            slots = torch.arange(k_eff, device=mat.device)
            keep = (slots < index.n_neg[start:stop, None]) & (index.n_pos[start:stop, None] > 0)
            rows, cols = keep.nonzero(as_tuple=True)
            parts.append((_shift(rows, start), positive[rows], negatives[rows, cols]))
        return _cat(parts, 3, inputs.device)


def multi_similarity(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    epsilon: float = 0.1,
    distance: str = "cosine",
    chunk_size: int | None = None,
    self_offset: int | None = None,
) -> Pairs:
    """Multi-similarity pair mining (Wang et al., 2019).

    With ``d`` the distance, a positive pair ``(a, p)`` is kept if ``d(a, p) + epsilon > min_n d(a, n)``
    and a negative pair ``(a, n)`` if ``d(a, n) - epsilon < max_p d(a, p)``; for ``"cosine"`` this is
    the paper's rule on similarities, ``s(a, p) - epsilon < max_n s(a, n)`` and
    ``s(a, n) + epsilon > min_p s(a, p)``. Anchors without a negative keep no positive pair and vice
    versa. On L2-normalised embeddings the pairs equal pytorch-metric-learning's
    ``MultiSimilarityMiner(epsilon)`` (as sets; with ``distance="cosine"`` the decisions are
    bit-identical). Pairs are ordered by anchor, then pool index.

    Args:
        embeddings: ``(B, D)`` floating-point anchors.
        labels: ``(B,)`` integer labels.
        ref_embeddings: Optional ``(M, D)`` pool (default: the batch).
        ref_labels: ``(M,)`` labels of the pool; required with ``ref_embeddings``.
        self_offset: Where the pool holds the anchors (a memory after the batch, a cross-rank pool),
            anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        epsilon: Margin of the mining rule, ``>= 0``.
        distance: ``"cosine"`` (default), ``"euclidean"`` or ``"squared_euclidean"``.
        chunk_size: Anchors per distance-matrix chunk; ``None`` bounds a chunk's matrix to about 64 MiB.

    Returns:
        ``(a1, p, a2, n)``, 1-D int64 tensors on the embeddings' device: positive pairs ``(a1, p)`` and
        negative pairs ``(a2, n)``.

    Raises:
        ValueError: On invalid inputs, ``epsilon < 0`` or ``chunk_size < 1``.

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
        >>> multi_similarity(emb, torch.tensor([0, 0, 1, 1]), epsilon=0.1)
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([0, 1, 1, 2, 2, 3]), tensor([2, 2, 3, 0, 1, 1]))
    """
    with torch.no_grad():
        epsilon = check_float("epsilon", epsilon, minimum=0.0)
        inputs, index = _prepare(
            embeddings, labels, ref_embeddings, ref_labels, distance, chunk_size, self_offset
        )
        if index is None:
            return empty_indices(4, inputs.device)
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, distance)
        pos_parts, neg_masks = [], []
        # The matrix plus a bool mask per entry.
        for start, stop, mat, pos_idx, pos_valid in _chunks(
            ranks, index, ranks.dtype.itemsize + 1, chunk_size
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
            pos_parts.append((_shift(rows, start), pos_idx[rows, slots]))
            # Same-label entries hold finfo.max, and finfo.max - eps rounds back to finfo.max, which is
            # never below a real distance; anchors without positives have hardest_pos == finfo.min.
            neg_masks.append((start, mat.sub_(epsilon) < hardest_pos[:, None]))
            del mat  # before the next chunk's matrix is computed
        a1, p = _cat(pos_parts, 2, inputs.device)
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
        return _shift(rows, start), cols
    counts = [int(mask.count_nonzero()) for _, mask in masks]
    pairs = torch.empty(sum(counts), 2, dtype=torch.int64, device=masks[0][1].device)
    offset = 0
    for (start, mask), count in zip(masks, counts):
        chunk = pairs[offset : offset + count]
        torch.nonzero(mask, out=chunk)
        chunk[:, 0] += start
        offset += count
    return pairs[:, 0], pairs[:, 1]


def _successors(mat: torch.Tensor, thresholds: torch.Tensor) -> _Successors:
    """For each row and threshold, the smallest entry of the row strictly greater than the threshold.

    Buckets every entry by the number of the row's thresholds below it (:func:`_count_below`), takes the
    minimum of each bucket with a scatter, and a suffix minimum over buckets: entries above threshold
    ``t`` are exactly those in buckets ``>= #{thresholds <= t}``. No sort of the rows.

    Args:
        mat: ``(R, M)`` non-negative values (distances); entries never to be returned may hold
            ``finfo.max`` and are returned only when nothing else lies above a threshold.
        thresholds: ``(R, W)`` thresholds, ``W >= 1``; padding slots may hold ``finfo.max``.

    Returns:
        ``(values, cols, found, min_value, min_col)``: ``(R, W)`` successor values and pool indices
        (meaningless where ``found`` is false) and the ``(R,)`` minimum of each row with its index.
    """
    sorted_thr, order = thresholds.sort(dim=1)
    packable = mat.dtype != torch.float64 and mat.shape[1] < 2**_INDEX_BITS
    # One scratch buffer for the int64 buckets and two matrices of mat's dtype, which the packed keys
    # (8 bytes per entry) reuse once the buckets are known (see scratch_buffer: fresh memory is slow).
    numel, itemsize = mat.numel(), mat.element_size()
    scratch = scratch_buffer(numel * (8 + 2 * itemsize), mat.device)
    bucket = scratch[: 8 * numel].view(torch.int64).view(mat.shape)
    work = scratch[8 * numel :]
    _count_below(mat, sorted_thr, bucket, work)
    # #{thresholds <= t}: where the suffix minimum for threshold t starts (ties between thresholds included).
    start_bucket = torch.searchsorted(sorted_thr, sorted_thr, right=True)
    minima = _packed_bucket_minima if packable else _bucket_minima
    values, cols, found, min_value, min_col = minima(mat, bucket, start_bucket, work)

    # Back from threshold-sorted order to the caller's slot order.
    def unsort(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x).scatter_(1, order, x)

    return unsort(values), unsort(cols), unsort(found), min_value, min_col


def _count_below(
    mat: torch.Tensor, sorted_thr: torch.Tensor, bucket: torch.Tensor, work: torch.Tensor
) -> None:
    """Write ``#{t < v}`` for every entry ``v`` of ``mat`` into ``bucket``: its row's thresholds below it.

    ``work`` holds two matrices of ``mat``'s dtype, which this overwrites. Few thresholds per row: one
    comparison pass per threshold, counted in float (faster on CPU than through bool or int64, and
    written into buffers that are already touched). Many: a grid of cells (:func:`_grid_count_below`,
    a fixed number of passes) for 32-bit distances, ``searchsorted`` for float64 ones.
    """
    if sorted_thr.shape[1] <= _LOOP_MAX_WIDTH:
        count, step = _two_matrices(work, mat)
        torch.gt(mat, sorted_thr[:, :1], out=count)
        for j in range(1, sorted_thr.shape[1]):
            count.add_(torch.gt(mat, sorted_thr[:, j : j + 1], out=step))
        bucket.copy_(_whole(count, step))
    elif mat.element_size() == 8 or sorted_thr.shape[1] >= 2**24:  # the grid counts in float32
        torch.searchsorted(sorted_thr, mat, out=bucket)
    else:
        _grid_count_below(mat, sorted_thr, bucket, work)


def _two_matrices(work: torch.Tensor, mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two matrices of ``mat``'s shape and dtype that the bytes of ``work`` hold, one after the other."""
    span = mat.numel() * mat.element_size()
    first, second = (work[i * span : (i + 1) * span].view(mat.dtype).view(mat.shape) for i in (0, 1))
    return first, second


def _whole(src: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
    """Whole-number floats ``src`` as integers in ``spare`` (another tensor of its shape and dtype).

    32-bit floats become int32: on CPU, float to int32 and then int32 to int64 is faster than float to
    int64 directly.
    """
    return spare.view(torch.int32 if src.element_size() == 4 else torch.int64).copy_(src)


def _grid_count_below(
    mat: torch.Tensor, sorted_thr: torch.Tensor, bucket: torch.Tensor, work: torch.Tensor
) -> None:
    """``#{t < v}`` into ``bucket`` (int64) through a uniform grid of cells over each row's thresholds.

    ``cell(x) = trunc(clamp((x - origin) * scale, 0, top))`` applies the same elementwise operations to
    entries and thresholds, each monotone, so ``cell(t) < cell(v)`` implies ``t < v`` and
    ``cell(t) > cell(v)`` implies ``t > v``, whatever the rounding. With ``a`` the number of thresholds
    in the cells before the entry's (one table lookup), the thresholds below ``v`` are the first few of
    ``sorted[a], sorted[a + 1], ...`` (some of those in its own cell; no later one is below ``v``), so
    the count is ``a`` plus ``v > sorted[a + k]`` for ``k`` below the most thresholds any cell holds:
    two in a cell are common (a birthday paradox), three rare. ``mat`` holds 32-bit floats; ``work``
    (as many bytes as ``bucket``) is overwritten.
    """
    n_rows, width = sorted_thr.shape
    big = torch.finfo(mat.dtype).max
    valid = sorted_thr < big  # padding slots sort last and are never below an entry
    cells = _GRID_CELLS_PER_THRESHOLD * width
    last = (valid.sum(dim=1, keepdim=True) - 1).clamp_(min=0)
    low, span = sorted_thr[:, :1], sorted_thr.gather(1, last) - sorted_thr[:, :1]
    # Finite and positive whatever the span (0 for a row with one distinct threshold): no NaN arises.
    scale = (cells / span).clamp_(max=_GRID_MAX_SCALE)
    origin = low - 2.0 / scale  # the lowest threshold lands in cell 1 or 2; cell 0 is below it
    top = cells + 3  # entries above the largest threshold: cells + 2 or beyond, clamped to top

    def cell_of(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.sub(x, origin, out=out).mul_(scale).clamp_(0, top)

    thr_cell = cell_of(sorted_thr, torch.empty_like(sorted_thr)).long().masked_fill_(~valid, top + 1)
    per_cell = torch.zeros(n_rows, top + 2, dtype=torch.int64, device=mat.device)
    per_cell.scatter_add_(1, thr_cell, torch.ones_like(thr_cell))
    before = per_cell.cumsum(dim=1).sub_(per_cell)  # thresholds in earlier cells
    most = int(per_cell[:, : top + 1].max())  # the last column counted the padding
    # Slots past the last threshold read big, never below an entry: sorted[a + k] is padded[:, k:][a].
    padded = torch.cat([sorted_thr, sorted_thr.new_full((n_rows, most + 1), big)], dim=1)

    # The entries' cells: float and int32 in the two halves of bucket, then int64 in work.
    numel = mat.numel()
    cell_float = bucket.view(-1).view(mat.dtype)[:numel].view(mat.shape)
    cell = work.view(torch.int64).view(mat.shape)
    cell.copy_(bucket.view(-1).view(torch.int32)[numel:].view(mat.shape).copy_(cell_of(mat, cell_float)))
    torch.gather(before, 1, cell, out=bucket)  # a; work is free again
    count, step = _two_matrices(work, mat)
    torch.gt(mat, torch.gather(padded, 1, bucket, out=step), out=count)
    for k in range(1, most):
        count.add_(torch.gt(mat, torch.gather(padded[:, k:], 1, bucket, out=step), out=step))
    # a + count in float (whole numbers below 2**24, so exact) and back: adding the counts to the int64
    # bucket directly would promote them through a fresh int64 temporary, which on CPU costs a page
    # fault per 4 KiB (see scratch_buffer) and was the slowest step of the whole miner.
    count.add_(step.copy_(bucket))
    bucket.copy_(count)


def _packed_bucket_minima(
    mat: torch.Tensor, bucket: torch.Tensor, start_bucket: torch.Tensor, scratch: torch.Tensor
) -> _Successors:
    """:func:`_successors`' results for a matrix of at most 32-bit floats, with packed keys in ``scratch``.

    A float32 (or half) value widened to float64 has 29 zero low mantissa bits: put the column there.
    For non-negative floats the int64 bit pattern orders like the value (-0.0 maps to the smallest
    key, which is right since it equals 0), so one integer amin yields the minimum with its index.
    """
    n_rows, n_cols = mat.shape
    keys = scratch[: mat.numel() * 8].view(torch.float64).view(n_rows, n_cols)
    keys.copy_(mat)
    keys = keys.view(torch.int64).bitwise_or_(torch.arange(n_cols, device=mat.device))
    table = torch.full((n_rows, start_bucket.shape[1] + 1), _INT64_MAX, dtype=torch.int64, device=mat.device)
    table.scatter_reduce_(1, bucket, keys, reduce="amin")
    suffix = table.flip(1).cummin(dim=1).values.flip(1)
    succ = suffix.gather(1, start_bucket)
    low = (1 << _INDEX_BITS) - 1

    def unpack(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        value = (key & ~low).view(torch.float64).to(mat.dtype)
        return value, (key & low).clamp_(max=max(n_cols - 1, 0))

    return *unpack(succ), succ != _INT64_MAX, *unpack(suffix[:, 0])


def _bucket_minima(
    mat: torch.Tensor, bucket: torch.Tensor, start_bucket: torch.Tensor, scratch: torch.Tensor
) -> _Successors:
    """:func:`_successors`' results for float64 distances, which leave no mantissa bits to pack into.

    Bucket minima by value, then their index with an equality pass: slower than packing, same result
    (``scratch`` is unused).
    """
    n_rows, n_cols = mat.shape
    width = start_bucket.shape[1]
    big = torch.finfo(mat.dtype).max
    vtable = torch.full((n_rows, width + 1), big, dtype=mat.dtype, device=mat.device)
    vtable.scatter_reduce_(1, bucket, mat, reduce="amin")
    is_min = mat == vtable.gather(1, bucket)
    cand = torch.where(is_min, torch.arange(n_cols, device=mat.device), n_cols)
    ctable = torch.full((n_rows, width + 1), n_cols, dtype=torch.int64, device=mat.device)
    ctable.scatter_reduce_(1, bucket, cand, reduce="amin")
    suffix_val, suffix_arg = vtable.flip(1).cummin(dim=1)
    suffix_val = suffix_val.flip(1)
    suffix_bucket = (width - suffix_arg).flip(1)
    suffix_col = ctable.gather(1, suffix_bucket).clamp_(max=max(n_cols - 1, 0))
    values = suffix_val.gather(1, start_bucket)
    cols = suffix_col.gather(1, start_bucket)
    return values, cols, values < big, suffix_val[:, 0], suffix_col[:, 0]


def semi_hard(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    margin: float = 0.2,
    distance: str = "cosine",
    fallback: str = "hardest",
    chunk_size: int | None = None,
    self_offset: int | None = None,
) -> Triplets:
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
    (``1 - cos`` for cosine), so ``margin`` is in distance units.

    Args:
        embeddings: ``(B, D)`` floating-point anchors.
        labels: ``(B,)`` integer labels.
        ref_embeddings: Optional ``(M, D)`` pool (default: the batch).
        ref_labels: ``(M,)`` labels of the pool; required with ``ref_embeddings``.
        self_offset: Where the pool holds the anchors (a memory after the batch, a cross-rank pool),
            anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        margin: Width of the semi-hard band, ``>= 0``.
        distance: ``"cosine"`` (default), ``"euclidean"`` or ``"squared_euclidean"``.
        fallback: One of :data:`SEMI_HARD_FALLBACKS`: ``"hardest"``, ``"hardest_negative"``, ``"none"``.
        chunk_size: Anchors per chunk; ``None`` bounds a chunk's working set to about 64 MiB.

    Returns:
        ``(anchors, positives, negatives)``, 1-D int64 tensors on the embeddings' device.

    Raises:
        ValueError: On invalid inputs, ``margin < 0``, an unknown ``fallback`` or ``chunk_size < 1``.

    Example:
        Points on a line; pair (1, 0) has d = 1 and negatives at 0.1, 0.5 and 2.0 from the anchor, so
        no semi-hard negative for margin 0.3: "none" drops it, "hardest" takes sample 4 (at 2.0).

        >>> emb = torch.tensor([[0.0], [1.0], [1.1], [1.5], [3.0]])
        >>> labels = torch.tensor([0, 0, 1, 1, 2])
        >>> semi_hard(emb, labels, margin=0.3, distance="euclidean", fallback="none")
        (tensor([0, 3]), tensor([1, 2]), tensor([2, 1]))
        >>> semi_hard(emb, labels, margin=0.3, distance="euclidean", fallback="hardest")
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 4, 0, 1]))
    """
    with torch.no_grad():
        margin = check_float("margin", margin, minimum=0.0)
        check_choice("fallback", fallback, SEMI_HARD_FALLBACKS)
        inputs, index = _prepare(
            embeddings, labels, ref_embeddings, ref_labels, distance, chunk_size, self_offset
        )
        if index is None:
            return empty_indices(3, inputs.device)
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, distance, nonnegative=True)
        # Matrix and two same-size float buffers, int64 bucket, int64 key and its float64 source.
        bytes_per_entry = 3 * ranks.dtype.itemsize + 24
        parts = []
        for chunk in _chunks(ranks, index, bytes_per_entry, chunk_size):
            keep, negative = _semi_hard_negatives(chunk, index, inputs, margin, fallback)
            rows, slots = keep.nonzero(as_tuple=True)
            parts.append((_shift(rows, chunk.start), chunk.pos_idx[rows, slots], negative[rows, slots]))
        return _cat(parts, 3, inputs.device)


def _semi_hard_negatives(
    chunk: _Chunk, index: LabelIndex, inputs: MiningInputs, margin: float, fallback: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, negative)``, ``(rows, W)`` like the positives table: which pairs get which negative."""
    start, stop, mat, pos_idx, pos_valid = chunk
    big = torch.finfo(mat.dtype).max
    pos_dist = mat.gather(1, pos_idx).masked_fill_(~pos_valid, big)
    index.mask_same_label(mat, start, pos_idx, pos_valid, big)
    succ_dist, succ_col, found, _, min_col = _successors(mat, pos_dist)
    # A masked (same-label) entry comes back only when no negative lies above the threshold.
    found &= inputs.ref_labels[succ_col] != inputs.labels[start:stop, None]
    semi = found & (succ_dist < pos_dist + margin)
    if fallback == "none":
        return pos_valid & semi, succ_col
    if fallback == "hardest":
        return pos_valid & found, succ_col
    has_neg = index.n_neg[start:stop, None] > 0
    return pos_valid & (semi | has_neg), torch.where(semi, succ_col, min_col[:, None])


def distance_weighted(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    generator: torch.Generator | None = None,
    distance: str = "euclidean",
    chunk_size: int | None = None,
    self_offset: int | None = None,
) -> Triplets:
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
    generator state and independent of chunking.

    Args:
        embeddings: ``(B, D)`` floating-point anchors.
        labels: ``(B,)`` integer labels.
        ref_embeddings: Optional ``(M, D)`` pool (default: the batch).
        ref_labels: ``(M,)`` labels of the pool; required with ``ref_embeddings``.
        self_offset: Where the pool holds the anchors (a memory after the batch, a cross-rank pool),
            anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        cutoff: Distances below it are clipped up to it before weighting (bounds the variance), ``>= 0``.
        nonzero_loss_cutoff: Negatives at this distance or beyond are never sampled, ``> 0``.
        generator: Optional ``torch.Generator`` for reproducible sampling.
        distance: Validated for the miners' common signature; the sampling always uses the Euclidean
            distance of L2-normalised embeddings, the cutoffs' units (each distance is monotone in it).
        chunk_size: Anchors per chunk; ``None`` bounds a chunk's working set to about 64 MiB.

    Returns:
        ``(anchors, positives, negatives)``, 1-D int64 tensors on the embeddings' device, ordered by anchor
        then positive index.

    Raises:
        ValueError: On invalid inputs or arguments.

    Example:
        Anchor 0's only negative closer than 1.4 is sample 2, so it is always drawn; anchor 1 has two
        eligible negatives and draws one of them.

        >>> emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
        >>> distance_weighted(emb, torch.tensor([0, 0, 1, 1]), generator=torch.Generator().manual_seed(0))
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 3, 0, 1]))
    """
    with torch.no_grad():
        cutoff = check_float("cutoff", cutoff, minimum=0.0)
        nonzero_loss_cutoff = check_float(
            "nonzero_loss_cutoff", nonzero_loss_cutoff, minimum=0.0, strict_minimum=True
        )
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputTypeError(f"generator must be a torch.Generator or None, got {describe(generator)}.")
        inputs, index = _prepare(
            embeddings, labels, ref_embeddings, ref_labels, distance, chunk_size, self_offset
        )
        if index is None:
            return empty_indices(3, inputs.device)
        # In float32 at least (see working_dtype): (D - 2) * log(d) amplifies rounding by D.
        ranks = RankMatrix(inputs.embeddings, inputs.ref_embeddings, "cosine", nonnegative=True)
        uniforms = _pair_uniforms(index, generator, inputs.device)
        cutoffs, parts, offset = (cutoff, nonzero_loss_cutoff), [], 0
        # The matrix and two temporaries of its dtype.
        for chunk in _chunks(ranks, index, 3 * ranks.dtype.itemsize, chunk_size):
            part, offset = _sample_negatives(
                chunk, index, uniforms, offset, inputs.embeddings.shape[1], cutoffs
            )
            parts.append(part)
        return _cat(parts, 3, inputs.device)


def _sample_negatives(
    chunk: _Chunk,
    index: LabelIndex,
    uniforms: torch.Tensor,
    offset: int,
    dim: int,
    cutoffs: tuple[float, float],
) -> tuple[Triplets, int]:
    """The chunk's triplets, drawn with ``uniforms[offset:]``, and the offset of the next chunk's uniforms."""
    cdf, has_weight = _weight_cdf(chunk, index, dim, *cutoffs)
    rows, slots = chunk.pos_valid.nonzero(as_tuple=True)
    end = offset + rows.shape[0]
    negative = _draw(cdf, uniforms[offset:end], rows, slots, chunk.pos_idx.shape[1])
    keep = has_weight[rows, 0]
    rows, slots = rows[keep], slots[keep]
    return (_shift(rows, chunk.start), chunk.pos_idx[rows, slots], negative[rows, slots]), end


def _pair_uniforms(
    index: LabelIndex, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """One uniform per anchor-positive pair, in (anchor, positive index) order, drawn before chunking."""
    total_pairs = int(index.n_pos.sum())
    gen_device = generator.device if generator is not None else device
    return torch.rand(total_pairs, generator=generator, dtype=torch.float64, device=gen_device).to(device)


def _weight_cdf(
    chunk: _Chunk, index: LabelIndex, dim: int, cutoff: float, nonzero_loss_cutoff: float
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
