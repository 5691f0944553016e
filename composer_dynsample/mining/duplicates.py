"""Identical samples must not serve as each other's negatives: duplicate ids, as pure functions on tensors.

A *duplicate id* marks samples that are the same item under different labels, e.g. the hash of a
normalised text (``text_hash`` of the text batches): in pairs data the same passage answers two queries,
or a pair appears twice, and then one batch holds the same text under two labels. Each label sees the
other's copy as a negative, a false negative that no model can separate from its positive.

For an anchor ``a``, a pool row ``n`` of another label is a *duplicate negative* when the batch or the
pool holds ``n``'s duplicate id under ``a``'s label, or ``a``'s id under ``n``'s label: ``n`` is the
anchor's own text, or one of its positives' (the same passage answering another query), or the anchor
is the text of one of ``n``'s positives. The relation is symmetric. A negative id marks a row without
one (a memory row saved before ids were kept): it matches nothing. This is the idea of
sentence-transformers' ``NoDuplicatesBatchSampler``, applied where the negatives are chosen instead of
by leaving samples out of the batch.

:func:`duplicate_negatives` answers that for any ``(anchor, row)`` entries without building a
``(B, M)`` matrix unless asked for one, and without a host sync; :func:`drop_duplicate_negatives`
filters mined tuples with it.

Example:
    >>> labels, ids = torch.tensor([0, 0, 1, 1]), torch.tensor([10, 20, 30, 20])
    >>> duplicate_negatives(labels, ids, labels, ids).int().tolist()  # rows 1 and 3: one text, two labels
    [[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 0, 0]]
"""

from __future__ import annotations

import torch

__all__ = ["drop_duplicate_negatives", "duplicate_negatives"]


def duplicate_negatives(
    labels: torch.Tensor,
    duplicate_ids: torch.Tensor,
    ref_labels: torch.Tensor,
    ref_duplicate_ids: torch.Tensor,
    anchors: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Whether pool row ``rows`` is a negative of anchor ``anchors`` that repeats a sample of its label.

    That is (see the module): the row has another label, and the batch or the pool holds the row's
    duplicate id under the anchor's label or the anchor's id under the row's label. Sorting and binary
    search, no host sync: the known ``(duplicate id, label)`` pairs are sorted once and each entry looks
    up its two pairs among them.

    Args:
        labels (torch.Tensor): ``(B,)`` anchor labels.
        duplicate_ids (torch.Tensor): ``(B,)`` anchor duplicate ids.
        ref_labels (torch.Tensor): ``(M,)`` pool labels (``labels`` when the pool is the batch).
        ref_duplicate_ids (torch.Tensor): ``(M,)`` pool duplicate ids.
        anchors (torch.Tensor, optional): Anchor indices of the entries asked about, broadcastable
            with ``rows``. Default: every anchor, as a column.
        rows (torch.Tensor, optional): Pool indices of the entries. Default: every row, as a row.

    Returns:
        torch.Tensor: A boolean tensor of the broadcast shape of ``anchors`` and ``rows``
        (``(B, M)`` by default).

    Example:
        >>> labels, ids = torch.tensor([0, 0, 1]), torch.tensor([7, 8, 8])
        >>> duplicate_negatives(labels, ids, labels, ids, torch.tensor([0, 2, 1]), torch.tensor([2, 0, 0])).tolist()
        [True, True, False]
    """
    device = labels.device
    if anchors is None:
        anchors = torch.arange(labels.shape[0], device=device)[:, None]
    if rows is None:
        rows = torch.arange(ref_labels.shape[0], device=device)[None, :]
    if ref_labels.shape[0] == 0 or labels.shape[0] == 0:
        return torch.zeros(torch.broadcast_shapes(anchors.shape, rows.shape), dtype=torch.bool, device=device)
    all_ids = torch.cat([duplicate_ids, ref_duplicate_ids]).long()
    all_labels = torch.cat([labels, ref_labels]).long()
    # Ids and labels as positions in their sorted lists: values below len(all), so one int64 key holds a pair.
    sorted_ids, sorted_labels, size = all_ids.sort().values, all_labels.sort().values, all_ids.shape[0]
    id_index, label_index = (
        torch.searchsorted(sorted_ids, all_ids),
        torch.searchsorted(sorted_labels, all_labels),
    )
    keys = torch.where(all_ids >= 0, id_index * size + label_index, -1).sort().values

    def held(ids: torch.Tensor, label_positions: torch.Tensor) -> torch.Tensor:
        """Whether some known row holds this (id, label) pair; ``ids`` are positions in ``all_ids``."""
        asked = id_index[ids] * size + label_index[label_positions]
        return (all_ids[ids] >= 0) & (keys[torch.searchsorted(keys, asked).clamp(max=size - 1)] == asked)

    pool_rows = rows + labels.shape[0]  # positions in all_ids / all_labels
    negative = all_labels[anchors] != all_labels[pool_rows]
    return negative & (held(pool_rows, anchors) | held(anchors, pool_rows))


def drop_duplicate_negatives(
    indices_tuple: tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    duplicate_ids: torch.Tensor,
    ref_labels: torch.Tensor | None = None,
    ref_duplicate_ids: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Drop the mined tuples whose negative is a duplicate negative of its anchor (see the module).

    Triplets ``(a, p, n)`` are dropped whole (``n`` repeating ``a``, ``p`` or another positive of ``a``,
    or ``a`` repeating a positive of ``n``); of pairs ``(a1, p, a2, n)`` only the negative pairs
    ``(a2, n)`` are. Everything else keeps its order.

    Args:
        indices_tuple (tuple[torch.Tensor, ...]): Triplets or pairs in pytorch-metric-learning's format.
        labels (torch.Tensor): ``(B,)`` anchor labels.
        duplicate_ids (torch.Tensor): ``(B,)`` anchor duplicate ids.
        ref_labels (torch.Tensor, optional): ``(M,)`` pool labels. Default: the batch is the pool.
        ref_duplicate_ids (torch.Tensor, optional): ``(M,)`` pool duplicate ids, given with ``ref_labels``.

    Returns:
        ``(kept_tuple, dropped)``: the filtered tuple and a 0-d ``int64`` tensor counting the dropped
        triplets or negative pairs (left on the device).

    Example:
        >>> labels, ids = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([5, 6, 7, 6, 8, 9])
        >>> tuples = (torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5]), torch.tensor([3, 4, 0]))
        >>> kept, dropped = drop_duplicate_negatives(tuples, labels, ids)  # row 3 repeats anchor 0's positive
        >>> [t.tolist() for t in kept], int(dropped)
        ([[2, 4], [3, 5], [4, 0]], 1)
    """
    if (ref_labels is None) != (ref_duplicate_ids is None):
        raise ValueError("ref_labels and ref_duplicate_ids must be given together.")
    if ref_labels is None or ref_duplicate_ids is None:
        ref_labels, ref_duplicate_ids = labels, duplicate_ids
    parts = tuple(indices_tuple)
    anchors, negatives = (parts[0], parts[2]) if len(parts) == 3 else (parts[2], parts[3])
    duplicate = duplicate_negatives(labels, duplicate_ids, ref_labels, ref_duplicate_ids, anchors, negatives)
    kept = (~duplicate).nonzero().squeeze(1)  # one size the host waits for on a GPU, not one per part
    dropped = duplicate.sum()
    if len(parts) == 3:
        return tuple(part.index_select(0, kept) for part in parts), dropped
    return (parts[0], parts[1], parts[2].index_select(0, kept), parts[3].index_select(0, kept)), dropped
