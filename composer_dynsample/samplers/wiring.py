"""The wiring mistakes a Composer user makes with a batch sampler, caught before the first batch.

A batch sampler of this package works only when the ``DataLoader`` gets it as ``batch_sampler`` and its
labels are the dataset's; when tuples are mined in the batch, Composer's microbatches must not cut a P x K
batch into single classes. Each mistake otherwise fails far away (a shape error in a loss, an ``IndexError``
mid-epoch) or trains on the wrong thing with no error (a loss of zero for the whole run, new samples never
drawn). The checks here read the loader and the sampler only, and raise a ``ValueError`` in one line naming
the fix; :class:`~composer_dynsample.callbacks.SetSamplerEpoch` and
:class:`~composer_dynsample.HardNegativeMining` run the loader's at ``FIT_START``, and the callback the
dataset's length again at every ``EPOCH_START``; the microbatches are checked by what mines in them
(:class:`~composer_dynsample.HardNegativeMining`, and :class:`~composer_dynsample.EmbeddingTable` when it feeds
a sampler), never by the epoch callback: a classifier trains on single-class microbatches.

:func:`find_epoch_target` finds what takes the epoch in a loader.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from composer_dynsample.samplers.base import DistributedBatchSampler, SupportsSetEpoch
from composer_dynsample.validation import is_int

__all__ = [
    "check_dataset_length",
    "check_microbatch_size",
    "check_microbatches",
    "check_train_loader",
    "dataset_length",
    "find_epoch_target",
    "torch_loader",
]


def torch_loader(dataloader: Any) -> DataLoader | None:
    """The ``DataLoader`` itself, also inside a Composer ``DataSpec``; ``None`` for anything else."""
    loader = getattr(dataloader, "dataloader", dataloader)
    return loader if isinstance(loader, DataLoader) else None


def dataset_length(dataloader: Any) -> int | None:
    """``len`` of the loader's dataset, or ``None`` when it has none (an iterable dataset)."""
    loader = torch_loader(dataloader)
    try:
        return None if loader is None else len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_train_loader(dataloader: Any) -> None:
    """Refuse a batch sampler given as ``sampler=`` and a sampler drawing indices past the dataset's end.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from composer_dynsample.samplers import PKBatchSampler
        >>> labels = torch.arange(16) % 4
        >>> check_train_loader(DataLoader(TensorDataset(labels), sampler=PKBatchSampler(labels, 2, 2)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: The train DataLoader got the batch sampler PKBatchSampler as sampler=...
    """
    loader = torch_loader(dataloader)
    if loader is None:
        return
    sampler, batches = loader.sampler, loader.batch_sampler
    if isinstance(sampler, DistributedBatchSampler) and not isinstance(batches, DistributedBatchSampler):
        raise ValueError(
            f"The train DataLoader got the batch sampler {type(sampler).__name__} as sampler=, so each of its "
            f"batches of {sampler.batch_size} indices became one item of a batch of {loader.batch_size}: pass it "
            "as batch_sampler=, or build the loader with composer_dynsample.samplers.build_dataloader(dataset, "
            "batch_sampler)."
        )
    target = batches if isinstance(batches, DistributedBatchSampler) else None
    if target is None and isinstance(batches, BatchSampler):
        target = batches.sampler if isinstance(batches.sampler, DistributedBatchSampler) else None
    size = dataset_length(loader)
    if target is not None and size is not None and target.num_indices > size:
        raise ValueError(
            f"The train batch sampler {type(target).__name__} was built on {target.num_indices} labels and draws "
            f"indices up to {target.num_indices - 1}, but the dataset holds {size} samples: build it on the "
            "dataset's own labels (one per sample, in the dataset's order)."
        )


def check_dataset_length(dataloader: Any, at_fit_start: int | None, epoch: int) -> None:
    """Refuse an epoch over a dataset whose length changed since ``FIT_START`` (``at_fit_start``)."""
    now = dataset_length(dataloader)
    if at_fit_start is None or now is None or now == at_fit_start:
        return
    effect = (
        "its sampler would draw indices past its end"
        if now < at_fit_start
        else f"its {now - at_fit_start} new samples would never be drawn"
    )
    raise ValueError(
        f"The train dataset held {at_fit_start} samples at the start of the fit and holds {now} at epoch {epoch}: "
        f"{effect}, since the batch sampler was built on its labels then. Keep the dataset fixed during a fit, "
        "or rebuild the batch sampler and the DataLoader on the new labels and start a new fit."
    )


def check_microbatches(dataloader: Any, microbatch_size: int | None) -> None:
    """Refuse microbatches that cut every P x K batch into single classes: each then has no negative, and
    the loss is zero for the whole run."""
    loader = torch_loader(dataloader)
    sampler = None if loader is None else loader.batch_sampler
    k = getattr(sampler, "samples_per_class", None)
    p = getattr(sampler, "classes_per_batch", None)
    if microbatch_size is None or not isinstance(k, int) or not isinstance(p, int) or p < 2:
        return
    if microbatch_size <= k and k % microbatch_size == 0:
        raise ValueError(
            f"device_train_microbatch_size={microbatch_size} cuts each batch of {p} classes x {k} samples "
            f"({type(sampler).__name__}) into microbatches of one class each, which Composer trains one at a "
            "time: no microbatch has a negative, so mining finds nothing and the loss is zero. Set "
            f"device_train_microbatch_size to the batch size ({p * k}), or at least {2 * k} (two whole classes); "
            "for memory, use EmbeddingModel(forward_chunk_size=N), which keeps the whole batch as the pool."
        )


def find_epoch_target(dataloader: Any) -> SupportsSetEpoch | None:
    """Find what takes the epoch in a dataloader: its batch sampler, the sampler inside it, or its sampler.

    Duck-typed: anything with a ``set_epoch`` method qualifies, not only ``DistributedSampler``. A
    Composer :class:`~composer.core.DataSpec` is unwrapped to its dataloader.

    Args:
        dataloader: A ``DataLoader``, a ``DataSpec`` or any object with ``batch_sampler``/``sampler``.

    Returns:
        The object whose ``set_epoch`` to call, or ``None`` when nothing takes an epoch.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
        >>> data = TensorDataset(torch.arange(8))
        >>> sampler = DistributedSampler(data, num_replicas=1, rank=0)
        >>> find_epoch_target(DataLoader(data, sampler=sampler, batch_size=2)) is sampler
        True
        >>> find_epoch_target(DataLoader(data, batch_size=2)) is None
        True
    """
    dataloader = getattr(dataloader, "dataloader", dataloader)  # a Composer DataSpec holds it
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    candidates = (
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(dataloader, "sampler", None),
    )
    for candidate in candidates:
        if isinstance(candidate, SupportsSetEpoch):
            return candidate
    return None


def check_microbatch_size(dataloader: Any, microbatch_size: int | None) -> None:
    """Refuse a ``DataLoader(batch_sampler=...)`` (``batch_size=None``) when the Trainer has no
    ``device_train_microbatch_size``: Composer would fail at the first batch with a bare ``AssertionError``."""
    if microbatch_size is not None:  # Composer sets it from the loader's batch_size when it has one
        return
    loader = getattr(dataloader, "dataloader", dataloader)  # a Composer DataSpec holds it
    batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    raise ValueError(
        "The train dataloader reports batch_size=None (a DataLoader built with batch_sampler=...) and the "
        "Trainer has no device_train_microbatch_size, so Composer cannot size its microbatches. Build the "
        "loader with composer_dynsample.build_dataloader(dataset, batch_sampler), or pass "
        f"device_train_microbatch_size={batch_size if is_int(batch_size) else '<per-rank batch size>'} "
        "to the Trainer."
    )
