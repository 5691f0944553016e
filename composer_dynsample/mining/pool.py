"""Assemble the reference pool a microbatch is mined against: the batch, other ranks' rows, the memory."""

from __future__ import annotations

from typing import NamedTuple

import torch

from composer_dynsample.distributed import all_gather_embeddings

__all__ = ["Pool", "assemble_pool", "gather_duplicate_ids"]


class Pool(NamedTuple):
    """The reference pool of one mining step.

    Attributes:
        embeddings (torch.Tensor): ``(M, D)`` pool rows (the batch itself when nothing joined it).
        labels (torch.Tensor): ``(M,)`` their labels.
        offset (int | None): The pool row of anchor 0 (anchors sit at ``offset + i``), or ``None`` when the
            pool is the batch alone.
        enqueue_embeddings (torch.Tensor | None): Detached rows to enqueue into the memory (the global
            batch, so the memory is identical on every rank), or ``None`` when nothing is enqueued.
        enqueue_labels (torch.Tensor | None): Their labels.
        duplicate_ids (torch.Tensor | None): ``(M,)`` the pool rows' duplicate ids, when the batch's were
            given (memory rows saved without ids get ``-1``, which matches nothing).
        enqueue_duplicate_ids (torch.Tensor | None): The duplicate ids of the rows to enqueue.
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    offset: int | None
    enqueue_embeddings: torch.Tensor | None
    enqueue_labels: torch.Tensor | None
    duplicate_ids: torch.Tensor | None = None
    enqueue_duplicate_ids: torch.Tensor | None = None


def assemble_pool(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    cross_rank: bool = False,
    with_grad: bool = False,
    memory_embeddings: torch.Tensor | None = None,
    memory_labels: torch.Tensor | None = None,
    enqueue: bool = False,
    duplicate_ids: torch.Tensor | None = None,
    memory_duplicate_ids: torch.Tensor | None = None,
) -> Pool:
    """Build the pool: the batch, then every rank's batch with ``cross_rank``, then the memory's rows.

    Collectives (all ranks must call this with the same ``cross_rank``, ``enqueue`` and whether
    ``duplicate_ids`` is given): one :func:`~composer_dynsample.distributed.all_gather_embeddings` with
    ``cross_rank``, or one without gradient when only ``enqueue`` needs the global batch, and with
    ``duplicate_ids`` one more to gather them the same way as the labels. With one process none
    communicates.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` local anchors.
        labels (torch.Tensor): ``(B,)`` their labels.
        cross_rank (bool): Join the other ranks' rows. Default: ``False``.
        with_grad (bool): With ``cross_rank``, let gradients flow to the other ranks' rows. Default: ``False``.
        memory_embeddings (torch.Tensor, optional): ``(K, D)`` memory rows appended after the batch rows,
            moved to the embeddings' device and dtype. Default: none.
        memory_labels (torch.Tensor, optional): Their labels. Default: none.
        enqueue (bool): Also return the (global, detached) batch to enqueue into the memory. Default: ``False``.
        duplicate_ids (torch.Tensor, optional): ``(B,)`` duplicate ids of the batch (see
            :mod:`composer_dynsample.mining.duplicates`); they travel with the labels. Default: none.
        memory_duplicate_ids (torch.Tensor, optional): ``(K,)`` the memory rows' duplicate ids; with
            ``duplicate_ids`` but without these, the memory rows get ``-1`` (no id). Default: none.

    Returns:
        Pool: The pool, its labels, the anchors' offset in it, what to enqueue, and the duplicate ids.

    Example:
        >>> pool = assemble_pool(torch.ones(2, 3), torch.tensor([0, 1]), memory_embeddings=torch.zeros(4, 3),
        ...                      memory_labels=torch.tensor([2, 2, 3, 3]), enqueue=True)
        >>> pool.embeddings.shape[0], pool.labels.tolist(), pool.offset, pool.enqueue_labels.tolist()
        (6, [0, 1, 2, 2, 3, 3], 0, [0, 1])
        >>> assemble_pool(torch.ones(2, 3), torch.tensor([0, 1]), duplicate_ids=torch.tensor([9, 9]),
        ...               memory_embeddings=torch.zeros(1, 3), memory_labels=torch.tensor([2])).duplicate_ids.tolist()
        [9, 9, -1]
    """
    batch, batch_labels, offset = embeddings, labels, 0
    if cross_rank:
        batch, batch_labels, offset = all_gather_embeddings(embeddings, labels, with_grad=with_grad)
    global_ids = duplicate_ids
    if duplicate_ids is not None and (cross_rank or enqueue):
        global_ids = gather_duplicate_ids(duplicate_ids)
    queued, queued_labels = None, None
    if enqueue and cross_rank:
        queued, queued_labels = batch.detach(), batch_labels
    elif enqueue:
        queued, queued_labels, _ = all_gather_embeddings(embeddings.detach(), labels, with_grad=False)
    queued_ids = global_ids if enqueue else None
    pool, pool_labels = batch, batch_labels
    pool_ids = global_ids if cross_rank else duplicate_ids
    if memory_embeddings is not None and memory_labels is not None and memory_embeddings.shape[0]:
        pool = torch.cat([pool, memory_embeddings.detach().to(pool.device, pool.dtype)])
        pool_labels = torch.cat([pool_labels, memory_labels.to(pool_labels.device, pool_labels.dtype)])
        if pool_ids is not None:
            pool_ids = torch.cat([pool_ids, _memory_ids(memory_duplicate_ids, memory_labels, pool_ids)])
    uses_pool = pool is not embeddings
    return Pool(pool, pool_labels, offset if uses_pool else None, queued, queued_labels, pool_ids, queued_ids)


def gather_duplicate_ids(duplicate_ids: torch.Tensor) -> torch.Tensor:
    """Every rank's duplicate ids in rank order, the layout of the labels that
    :func:`~composer_dynsample.distributed.all_gather_embeddings` gathers (a collective on every rank).

    Example:
        >>> gather_duplicate_ids(torch.tensor([4, 2])).tolist()
        [4, 2]
    """
    # The ids ride in the labels' slot, beside a one-column stand-in for embeddings: the same padding
    # and rank order as the labels, without a second copy of the embeddings.
    stand_in = torch.zeros(duplicate_ids.shape[0], 1, device=duplicate_ids.device)
    return all_gather_embeddings(stand_in, duplicate_ids, with_grad=False)[1]


def _memory_ids(ids: torch.Tensor | None, memory_labels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The memory rows' duplicate ids on ``like``'s device and dtype, ``-1`` (no id) where none were kept."""
    if ids is None:
        return torch.full(memory_labels.shape, -1, dtype=like.dtype, device=like.device)
    return ids.to(like.device, like.dtype)
