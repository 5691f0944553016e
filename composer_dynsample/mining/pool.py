"""Assemble the reference pool a microbatch is mined against: the batch, other ranks' rows, the memory."""

from __future__ import annotations

from typing import NamedTuple

import torch

from composer_dynsample.distributed import all_gather_embeddings

__all__ = ["Pool", "assemble_pool"]


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
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    offset: int | None
    enqueue_embeddings: torch.Tensor | None
    enqueue_labels: torch.Tensor | None


def assemble_pool(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    cross_rank: bool = False,
    with_grad: bool = False,
    memory_embeddings: torch.Tensor | None = None,
    memory_labels: torch.Tensor | None = None,
    enqueue: bool = False,
) -> Pool:
    """Build the pool: the batch, then every rank's batch with ``cross_rank``, then the memory's rows.

    Collectives (all ranks must call this with the same ``cross_rank`` and ``enqueue``): one
    :func:`~composer_dynsample.distributed.all_gather_embeddings` with ``cross_rank``, or one without
    gradient when only ``enqueue`` needs the global batch. With one process neither communicates.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` local anchors.
        labels (torch.Tensor): ``(B,)`` their labels.
        cross_rank (bool): Join the other ranks' rows. Default: ``False``.
        with_grad (bool): With ``cross_rank``, let gradients flow to the other ranks' rows. Default: ``False``.
        memory_embeddings (torch.Tensor, optional): ``(K, D)`` memory rows appended after the batch rows,
            moved to the embeddings' device and dtype. Default: none.
        memory_labels (torch.Tensor, optional): Their labels. Default: none.
        enqueue (bool): Also return the (global, detached) batch to enqueue into the memory. Default: ``False``.

    Returns:
        Pool: The pool, its labels, the anchors' offset in it and what to enqueue.

    Example:
        >>> pool = assemble_pool(torch.ones(2, 3), torch.tensor([0, 1]), memory_embeddings=torch.zeros(4, 3),
        ...                      memory_labels=torch.tensor([2, 2, 3, 3]), enqueue=True)
        >>> pool.embeddings.shape[0], pool.labels.tolist(), pool.offset, pool.enqueue_labels.tolist()
        (6, [0, 1, 2, 2, 3, 3], 0, [0, 1])
    """
    batch, batch_labels, offset = embeddings, labels, 0
    if cross_rank:
        batch, batch_labels, offset = all_gather_embeddings(embeddings, labels, with_grad=with_grad)
    queued, queued_labels = None, None
    if enqueue and cross_rank:
        queued, queued_labels = batch.detach(), batch_labels
    elif enqueue:
        queued, queued_labels, _ = all_gather_embeddings(embeddings.detach(), labels, with_grad=False)
    pool, pool_labels = batch, batch_labels
    if memory_embeddings is not None and memory_labels is not None and memory_embeddings.shape[0]:
        pool = torch.cat([pool, memory_embeddings.detach().to(pool.device, pool.dtype)])
        pool_labels = torch.cat([pool_labels, memory_labels.to(pool_labels.device, pool_labels.dtype)])
    uses_pool = pool is not embeddings
    return Pool(pool, pool_labels, offset if uses_pool else None, queued, queued_labels)
