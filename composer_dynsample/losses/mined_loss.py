"""A loss called on what :class:`~composer_dynsample.HardNegativeMining` hands the model: the one call to write.

The algorithm replaces ``state.outputs`` with a :class:`~composer_dynsample.MinedBatch`, and a
``ComposerModel``'s ``loss(outputs, batch)`` must pass its fields on: the embeddings, the labels, the mined
tuples and the pool. :func:`mined_loss` does it in one line for any loss with pytorch-metric-learning's
signature (``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``), adding the keywords a loss
of this package takes (``global_mean`` over ranks, the duplicate ids). :func:`reject_mined_batch` is what
this package's losses say when they are given the :class:`~composer_dynsample.MinedBatch` itself, anything
else than a tensor, or a floating-point tensor that is not ``(batch, dim)``, where the embeddings belong:
every loss here goes through it (:class:`~composer_dynsample.losses.tuple_losses.TupleLoss` when called,
:class:`~composer_dynsample.losses.wrapper.LossWrapper` in ``forward``).
"""

from __future__ import annotations

from typing import Any

import torch

from composer_dynsample.losses.call import forward_takes
from composer_dynsample.mining.mined_batch import MinedBatch

__all__ = ["CALL", "SAMPLER_CAUSE", "mined_loss", "reject_mined_batch"]

#: The call a model's ``loss`` writes for a :class:`MinedBatch` ``outputs``.
CALL = (
    "composer_dynsample.losses.mined_loss(loss_fn, outputs), or loss_fn(outputs.embeddings, outputs.labels, "
    "outputs.indices_tuple, outputs.ref_embeddings, outputs.ref_labels)"
)


def mined_loss(loss: Any, outputs: MinedBatch, **kwargs: Any) -> torch.Tensor:
    """``loss`` on a :class:`MinedBatch`: the mined tuples against their pool, averaged over ranks when the
    pool spans them (``global_mean``, for a loss that takes it), with the duplicate ids for a loss that takes
    them; ``kwargs`` are passed on.

    Raises:
        TypeError: If ``outputs`` is not a :class:`MinedBatch` (the algorithm did not run, or the model's
            forward output was passed instead).

    Example:
        >>> import torch
        >>> from composer_dynsample import TripletMarginLoss
        >>> from composer_dynsample.mining import BatchHardMiner
        >>> embeddings = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        >>> labels = torch.arange(8) % 4
        >>> mined = MinedBatch(embeddings, labels, BatchHardMiner()(embeddings, labels))
        >>> bool(mined_loss(TripletMarginLoss(margin=0.2), mined) >= 0)
        True
    """
    if not isinstance(outputs, MinedBatch):
        raise TypeError(
            f"mined_loss takes the MinedBatch HardNegativeMining puts in state.outputs, got "
            f"{type(outputs).__name__}: add HardNegativeMining to the Trainer's algorithms, or call the loss on "
            "the embeddings and labels yourself."
        )
    extra = dict(kwargs)
    if forward_takes(loss, "global_mean"):
        extra.setdefault("global_mean", outputs.global_mean)
    if outputs.checks_deferred and forward_takes(loss, "values_checked"):
        extra.setdefault("values_checked", True)  # checked on the device by the step: no host read here
    if outputs.duplicate_ids is not None and forward_takes(loss, "duplicate_ids"):
        extra.setdefault("duplicate_ids", outputs.duplicate_ids)
        extra.setdefault("ref_duplicate_ids", outputs.ref_duplicate_ids)
    return loss(
        outputs.embeddings,
        outputs.labels,
        outputs.indices_tuple,
        outputs.ref_embeddings,
        outputs.ref_labels,
        **extra,
    )


#: Why a loss's embeddings have one axis too many when a batch holds one item (what a batch sampler given as
#: ``DataLoader(sampler=...)`` makes of each batch of indices).
SAMPLER_CAUSE = (
    "a batch sampler passed as DataLoader(sampler=...) makes each batch one item; pass it as batch_sampler=, "
    "or build the loader with composer_dynsample.build_dataloader(dataset, batch_sampler)"
)


def reject_mined_batch(owner: str, embeddings: Any) -> None:
    """Raise a ``TypeError`` naming the call to write when a loss got a :class:`MinedBatch` or another
    non-tensor where the embeddings belong, and a one-line ``ValueError`` naming the shape and its likely
    cause when floating-point embeddings are not ``(batch, dim)``.

    Only the shape is read, never a value: nothing is copied to the host. A tensor of another dtype is left
    to the loss, which names the dtype it needs.

    Example:
        >>> reject_mined_batch("TripletMarginLoss", torch.zeros(1, 16, 8))
        Traceback (most recent call last):
            ...
        ValueError: TripletMarginLoss: embeddings must be (batch, dim), got (1, 16, 8): a batch sampler passed as DataLoader(sampler=...) makes each batch one item; pass it as batch_sampler=, or build the loader with composer_dynsample.build_dataloader(dataset, batch_sampler).
    """
    if isinstance(embeddings, MinedBatch):
        raise TypeError(
            f"{owner} got the MinedBatch that HardNegativeMining put in state.outputs where the (B, D) "
            f"embeddings belong: in the model's loss, call {CALL}."
        )
    if not isinstance(embeddings, torch.Tensor):
        raise TypeError(f"{owner} takes the (B, D) embeddings as a tensor, got {type(embeddings).__name__}.")
    if embeddings.ndim == 2 or not embeddings.is_floating_point():
        return
    shape = tuple(embeddings.shape)
    if embeddings.ndim == 3 and shape[0] == 1:
        cause = SAMPLER_CAUSE
    elif embeddings.ndim > 2:
        cause = (
            "the encoder must return one row per item (pool a (batch, tokens, dim) output over its tokens), "
            "or a batch sampler was passed as DataLoader(sampler=...): pass it as batch_sampler="
        )
    else:
        cause = "the encoder must return one row per item, a 2-D tensor"
    raise ValueError(f"{owner}: embeddings must be (batch, dim), got {shape}: {cause}.")
