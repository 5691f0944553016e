"""Input validation, label bookkeeping and chunking shared by the miners."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

import torch

from composer_dynsample.distances import RankMatrix, check_distance, working_dtype
from composer_dynsample.validation import check_int, check_pool

__all__ = [
    "CHUNK_BYTES",
    "AnchorChunk",
    "LabelIndex",
    "MiningInputs",
    "Pairs",
    "Triplets",
    "anchor_chunks",
    "cat_indices",
    "empty_indices",
    "hardest_positive",
    "pair_triplets",
    "row_chunks",
    "scratch_buffer",
    "shift_rows",
    "validate_mining_inputs",
]

Triplets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

_NAMES: Final = ("embeddings", "labels", "ref_embeddings", "ref_labels")

#: Working-set budget of one chunk of anchors (distance rows plus per-element temporaries), in bytes.
CHUNK_BYTES: Final[int] = 64 * 2**20


@dataclass(frozen=True)
class MiningInputs:
    """Validated mining inputs.

    Attributes:
        embeddings: ``(B, D)`` anchors, in the promoted dtype of both embedding tensors.
        labels: ``(B,)`` int64 labels on the embeddings' device.
        ref_embeddings: ``(M, D)`` pool; the same tensor object as ``embeddings`` when ``self_pool``.
        ref_labels: ``(M,)`` int64 pool labels.
        self_pool: Whether the pool is the batch itself.
        self_offset: Where the pool holds the anchors themselves, anchor ``i`` is pool entry
            ``self_offset + i`` and must not pair with it (``0`` for a self pool); ``None`` otherwise.
        distance: The validated distance name.
        values_checked: The caller checked the values on the device: nothing is read on the host.
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    ref_embeddings: torch.Tensor
    ref_labels: torch.Tensor
    self_pool: bool
    self_offset: int | None
    distance: str
    values_checked: bool = False

    @functools.cached_property
    def dtype(self) -> torch.dtype:
        """The dtype distances are computed in (:func:`~composer_dynsample.distances.working_dtype`; its host
        read of the largest entry skipped when the values are checked)."""
        return working_dtype(self.embeddings, self.ref_embeddings, values_checked=self.values_checked)

    @property
    def device(self) -> torch.device:
        """Device of the embeddings (and of every returned index tensor)."""
        return self.embeddings.device

    @property
    def is_empty(self) -> bool:
        """Whether there is no anchor or no pool entry, so nothing can be mined."""
        return self.embeddings.shape[0] == 0 or self.ref_embeddings.shape[0] == 0


def validate_mining_inputs(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    distance: str = "cosine",
    self_offset: int | None = None,
    values_checked: bool = False,
) -> MiningInputs:
    """Check and normalise the arguments every miner takes.

    The pool is the batch itself (``self_pool``) when ``ref_embeddings`` is ``None``, or when the very
    same tensor objects are passed as pool (as pytorch-metric-learning decides by identity). Labels are
    moved to the embeddings' device and cast to int64; embeddings and pool are cast to their promoted
    dtype (e.g. bf16 batch against an fp32 memory bank: both fp32).

    Args:
        embeddings: ``(B, D)`` floating-point tensor of anchors.
        labels: ``(B,)`` integer tensor.
        ref_embeddings: Optional ``(M, D)`` reference pool.
        ref_labels: ``(M,)`` integer labels of the pool; required exactly when ``ref_embeddings`` is given.
        distance: One of ``"cosine"``, ``"euclidean"``, ``"squared_euclidean"``.
        self_offset: When the pool holds the anchors themselves (the batch followed by a memory, or a
            cross-rank pool), anchor ``i`` is pool entry ``self_offset + i``, which must carry its label.
        values_checked: The caller has checked the values on the device (a training step's
            :func:`~composer_dynsample.mining.step.step_health`) and assembled the pool itself: nothing is
            read on the host (no NaN or inf check, no overflow check, no check of the anchors' labels at
            ``self_offset``).

    Returns:
        The validated :class:`MiningInputs`.

    Raises:
        ValueError: On a wrong type, shape, dtype or device, mismatched lengths or dimensions, a missing
            half of the pool, an unknown distance, or NaN/inf in the embeddings.

    Example:
        >>> emb = torch.randn(4, 3)
        >>> inputs = validate_mining_inputs(emb, torch.tensor([0, 0, 1, 1]))
        >>> inputs.self_pool, inputs.ref_embeddings is inputs.embeddings
        (True, True)
        >>> validate_mining_inputs(emb, torch.tensor([0, 0, 1]))
        Traceback (most recent call last):
            ...
        ValueError: labels has 3 entries but embeddings has 4 rows; they must match.
    """
    check_distance(distance)
    # The very same tensors as pool are the batch (checked once); anything else is checked as a pool.
    same = ref_embeddings is embeddings and ref_labels is labels
    pool = (None, None) if same else (ref_embeddings, ref_labels)
    check_pool((embeddings, labels), pool, _NAMES, finite=not values_checked)
    device = embeddings.device
    labels = labels.to(device=device, dtype=torch.int64)
    if same or ref_embeddings is None:
        if self_offset not in (None, 0):
            raise ValueError(
                f"self_offset must be 0 or None when the pool is the batch, got {self_offset!r}."
            )
        return MiningInputs(embeddings, labels, embeddings, labels, True, 0, distance, values_checked)
    if ref_embeddings.device != device:
        raise ValueError(
            f"ref_embeddings must be on the embeddings' device {device}, got {ref_embeddings.device}."
        )
    dtype = torch.promote_types(embeddings.dtype, ref_embeddings.dtype)
    ref_labels = ref_labels.to(device=device, dtype=torch.int64)
    offset = _check_self_offset(self_offset, labels, ref_labels, read=not values_checked)
    embeddings, ref_embeddings = embeddings.to(dtype), ref_embeddings.to(dtype)
    return MiningInputs(
        embeddings, labels, ref_embeddings, ref_labels, False, offset, distance, values_checked
    )


def _check_self_offset(
    self_offset: object, labels: torch.Tensor, ref_labels: torch.Tensor, *, read: bool = True
) -> int | None:
    """``self_offset`` as an int (or ``None``), checked to point at the anchors' own rows of the pool (their
    labels compared only with ``read``: ``torch.equal`` reads the device)."""
    if self_offset is None:
        return None
    rows, pool = labels.shape[0], ref_labels.shape[0]
    offset = check_int("self_offset", self_offset, minimum=0)
    same = offset + rows <= pool and (not read or torch.equal(ref_labels[offset : offset + rows], labels))
    if not same:
        raise ValueError(
            f"self_offset={offset} says the pool holds the {rows} anchors at rows {offset} to {offset + rows - 1}, "
            f"but the pool has {pool} rows"
            + ("." if offset + rows > pool else " and their labels differ there.")
        )
    return offset


def empty_indices(n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Return ``n`` distinct empty int64 tensors on ``device``."""
    return tuple(torch.empty(0, dtype=torch.int64, device=device) for _ in range(n))


def row_chunks(
    n_rows: int, n_cols: int, bytes_per_entry: int, chunk_size: int | None
) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` ranges of anchors so a chunk's working set stays bounded.

    Args:
        n_rows: Number of anchors.
        n_cols: Pool size ``M``.
        bytes_per_entry: Bytes of temporaries the miner keeps per ``(anchor, pool entry)``.
        chunk_size: Explicit number of anchors per chunk, or ``None`` to fit :data:`CHUNK_BYTES`.
    """
    if chunk_size is None:
        chunk_size = max(1, CHUNK_BYTES // max(1, n_cols * bytes_per_entry))
    for start in range(0, n_rows, chunk_size):
        yield start, min(start + chunk_size, n_rows)


_workspace = threading.local()


def scratch_buffer(n_bytes: int, device: torch.device) -> torch.Tensor:
    """A ``uint8`` buffer of ``n_bytes`` for a miner's temporaries, reused from call to call on CPU.

    A large CPU allocation is returned to the operating system when freed, and the next one costs a
    page fault per 4 KiB page on first touch, which can take longer than the arithmetic on the buffer.
    On CPU the buffer is therefore kept (one per thread, grown to the largest request, at most a chunk's
    working set, :data:`CHUNK_BYTES` for the miners' default chunks) and handed out again; its contents
    are arbitrary. A caller must be done with it before asking again. Other devices get a fresh
    ``torch.empty`` (CUDA's caching allocator already reuses memory).

    Example:
        >>> buf = scratch_buffer(1024, torch.device("cpu"))
        >>> buf.dtype, buf.numel(), buf.data_ptr() == scratch_buffer(512, torch.device("cpu")).data_ptr()
        (torch.uint8, 1024, True)
    """
    if device.type != "cpu":
        return torch.empty(n_bytes, dtype=torch.uint8, device=device)
    buffer = getattr(_workspace, "buffer", None)
    if buffer is None or buffer.numel() < n_bytes:
        # Aligned for any dtype view: offsets into it are multiples of the element sizes used.
        buffer = _workspace.buffer = torch.empty(n_bytes, dtype=torch.uint8)
    return buffer[:n_bytes]


class LabelIndex:
    """Per-anchor lists of positives (pool entries sharing its label), built by sorting the pool labels once.

    This avoids any ``B x M`` label comparison: in a P x K batch an anchor has ``K - 1`` positives, so the
    positives of every anchor fit a small ``(B, K - 1)`` table, and a negative is simply "not listed".

    Attributes:
        n_pos: ``(B,)`` number of positives per anchor (same label, its own pool entry excluded).
        n_neg: ``(B,)`` number of negatives per anchor.
        width: Largest number of positives of any anchor (the table width, one host read), or the
            ``max_positives`` bound the caller knows on the host (no read; the slots beyond an anchor's
            ``n_pos`` are padding).
        self_offset: Anchor ``i`` is pool entry ``self_offset + i`` (``0`` for a self pool), or ``None``
            when the pool does not hold the anchors.
    """

    def __init__(
        self,
        labels: torch.Tensor,
        ref_labels: torch.Tensor,
        self_offset: int | None,
        max_positives: int | None = None,
    ) -> None:
        self.self_offset = self_offset
        self._pool_size = ref_labels.shape[0]
        self._order = torch.argsort(ref_labels, stable=True)
        sorted_labels = ref_labels[self._order]
        self._start = torch.searchsorted(sorted_labels, labels)
        count = torch.searchsorted(sorted_labels, labels, right=True) - self._start
        self.n_neg = self._pool_size - count
        if self_offset is not None:
            # Position of anchor i's own entry inside its label group of the sorted pool, to skip it.
            position = torch.empty_like(self._order)
            position[self._order] = torch.arange(self._pool_size, device=position.device)
            self._self_slot = position[self_offset : self_offset + labels.shape[0]] - self._start
            self.n_pos = count - 1
        else:
            self.n_pos = count
        if self.n_pos.numel() == 0:
            self.width = 0
        elif max_positives is None:
            self.width = int(self.n_pos.max())
        else:
            self.width = min(int(max_positives), self._pool_size)

    def chunk(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(pos_idx, pos_valid)`` for anchors ``start:stop``.

        ``pos_idx`` is ``(rows, width)``: each anchor's positives as pool indices, in increasing order;
        entries where ``pos_valid`` is false are padding and point at arbitrary pool entries.
        """
        slots = torch.arange(self.width, device=self._order.device)
        pos_valid = slots < self.n_pos[start:stop, None]
        if self.self_offset is not None:
            slots = slots + (slots >= self._self_slot[start:stop, None])
        flat = (self._start[start:stop, None] + slots).clamp_(max=self._pool_size - 1)
        return self._order[flat], pos_valid

    def mask_same_label(
        self, mat: torch.Tensor, start: int, pos_idx: torch.Tensor, pos_valid: torch.Tensor, value: float
    ) -> None:
        """Overwrite, in place, the entries of chunk ``mat`` that are not negatives (positives, self)."""
        rows, slots = pos_valid.nonzero(as_tuple=True)
        # index_put_ with values made on the device: a Python scalar assigned by indexing is copied from the
        # host, a wait on CUDA
        mat.index_put_((rows, pos_idx[rows, slots]), mat.new_full(rows.shape, value))
        if self.self_offset is not None:
            rows = torch.arange(mat.shape[0], device=mat.device)
            mat.index_put_((rows, rows + start + self.self_offset), mat.new_full(rows.shape, value))


def cat_indices(
    parts: list[tuple[torch.Tensor, ...]], n: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """The per-chunk index tuples ``parts`` (each of ``n`` tensors) joined into one tuple."""
    if not parts:
        return empty_indices(n, device)
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat([part[i] for part in parts]) for i in range(n))


def shift_rows(rows: torch.Tensor, start: int) -> torch.Tensor:
    """Chunk row numbers to anchor indices (skipping a pass over large outputs for the first chunk)."""
    return rows + start if start else rows


class AnchorChunk(NamedTuple):
    """Anchors ``start:stop``: their rows of the distance matrix and their positives (``LabelIndex.chunk``)."""

    start: int
    stop: int
    mat: torch.Tensor
    pos_idx: torch.Tensor
    pos_valid: torch.Tensor


def anchor_chunks(
    ranks: RankMatrix, index: LabelIndex, bytes_per_entry: int, chunk_size: int | None
) -> Iterator[AnchorChunk]:
    """The anchors in chunks whose working set, ``bytes_per_entry`` per matrix entry, fits the budget."""
    n_rows, n_cols = ranks.shape
    for start, stop in row_chunks(n_rows, n_cols, bytes_per_entry, chunk_size):
        pos_idx, pos_valid = index.chunk(start, stop)
        yield AnchorChunk(start, stop, ranks.rows(start, stop), pos_idx, pos_valid)


def hardest_positive(chunk: AnchorChunk, index: LabelIndex) -> torch.Tensor:
    """Each anchor's farthest positive; the chunk's same-label entries are then set to ``finfo.max``."""
    mat, pos_idx, pos_valid = chunk.mat, chunk.pos_idx, chunk.pos_valid
    finfo = torch.finfo(mat.dtype)
    # The hardest positive comes from the small (rows, K) positives table, not the full row.
    pos_vals = mat.gather(1, pos_idx).masked_fill_(~pos_valid, finfo.min)
    positive = pos_idx.gather(1, pos_vals.argmax(dim=1, keepdim=True)).squeeze(1)
    index.mask_same_label(mat, chunk.start, pos_idx, pos_valid, finfo.max)
    return positive


def pair_triplets(
    ranks: RankMatrix,
    index: LabelIndex,
    bytes_per_entry: int,
    chunk_size: int | None,
    negatives_of: Callable[[AnchorChunk], tuple[torch.Tensor, torch.Tensor]],
) -> Triplets:
    """At most one triplet per anchor-positive pair, ordered by anchor, then positive index.

    ``negatives_of(chunk)`` returns ``(keep, negative)``, ``(rows, W)`` tables like the chunk's positives
    (``pos_idx``): which pairs are kept, and the pool index of each pair's negative.
    """
    parts = []
    for chunk in anchor_chunks(ranks, index, bytes_per_entry, chunk_size):
        keep, negative = negatives_of(chunk)
        rows, slots = keep.nonzero(as_tuple=True)
        parts.append((shift_rows(rows, chunk.start), chunk.pos_idx[rows, slots], negative[rows, slots]))
    return cat_indices(parts, 3, index.n_pos.device)  # type: ignore[return-value]
