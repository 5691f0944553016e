"""The kernel of :class:`~composer_dynsample.mining.SemiHardMiner`: per row and threshold, the smallest entry
above the threshold, without sorting the rows.

:func:`successors` buckets every entry of a row by the number of the row's thresholds below it, takes each
bucket's minimum with a scatter and a suffix minimum over the buckets. The rest of this module makes that
fast on CPU: counting thresholds in float through reused scratch memory, a grid of cells when a row has many
thresholds, and pool indices packed into the low mantissa bits of a float64 copy of each distance.
"""

from __future__ import annotations

from typing import Final

import torch

from composer_dynsample.mining._common import scratch_buffer

__all__ = ["successors"]

# successors: (values, cols, found, min_value, min_col).
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
# successors): float32 -> float64 leaves 29 low bits zero.
_INDEX_BITS: Final[int] = 29
_INT64_MAX: Final[int] = torch.iinfo(torch.int64).max


def successors(mat: torch.Tensor, thresholds: torch.Tensor) -> _Successors:
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

    ``work`` holds two matrices of ``mat``'s shape and dtype, one after the other, which this overwrites. Few thresholds per row: one
    comparison pass per threshold, counted in float (faster on CPU than through bool or int64, and
    written into buffers that are already touched). Many: a grid of cells (:func:`_grid_count_below`,
    a fixed number of passes) for 32-bit distances, ``searchsorted`` for float64 ones.
    """
    if sorted_thr.shape[1] <= _LOOP_MAX_WIDTH:
        count, step = (
            work[: 2 * mat.numel() * mat.element_size()].view(mat.dtype).view(2, *mat.shape).unbind(0)
        )
        torch.gt(mat, sorted_thr[:, :1], out=count)
        for j in range(1, sorted_thr.shape[1]):
            count.add_(torch.gt(mat, sorted_thr[:, j : j + 1], out=step))
        # Whole-number floats to integers through step: on CPU float -> int32 -> int64 beats float -> int64.
        bucket.copy_(step.view(torch.int32 if count.element_size() == 4 else torch.int64).copy_(count))
    elif mat.element_size() == 8 or sorted_thr.shape[1] >= 2**24:  # the grid counts in float32
        torch.searchsorted(sorted_thr, mat, out=bucket)
    else:
        _grid_count_below(mat, sorted_thr, bucket, work)


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
    count, step = work[: 2 * mat.numel() * mat.element_size()].view(mat.dtype).view(2, *mat.shape).unbind(0)
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
    """:func:`successors`' results for a matrix of at most 32-bit floats, with packed keys in ``scratch``.

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
    # Each key unpacked: the value in the high bits, the column in the low ones.
    low, last = (1 << _INDEX_BITS) - 1, max(n_cols - 1, 0)
    smallest = suffix[:, 0]
    return (
        (succ & ~low).view(torch.float64).to(mat.dtype),
        (succ & low).clamp_(max=last),
        succ != _INT64_MAX,
        (smallest & ~low).view(torch.float64).to(mat.dtype),
        (smallest & low).clamp_(max=last),
    )


def _bucket_minima(
    mat: torch.Tensor, bucket: torch.Tensor, start_bucket: torch.Tensor, scratch: torch.Tensor
) -> _Successors:
    """:func:`successors`' results for float64 distances, which leave no mantissa bits to pack into.

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
