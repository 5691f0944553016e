"""A ``DataLoader`` for batch samplers that Composer can size its microbatches from."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset

from composer_dynsample.validation import is_int

__all__ = ["BatchSamplerDataLoader", "build_dataloader"]


class BatchSamplerDataLoader(DataLoader):
    """A ``DataLoader`` driven by a batch sampler whose ``batch_size`` is the sampler's per-rank batch size.

    ``DataLoader(batch_sampler=...)`` reports ``batch_size=None``; Composer reads that attribute to pick
    the default ``device_train_microbatch_size`` and, finding ``None``, fails later with a bare
    ``AssertionError``. This loader reports the batch sampler's ``batch_size`` instead, so the Trainer
    needs no extra argument (one microbatch per batch, Composer's default).

    Args:
        dataset (Dataset): A map-style dataset.
        batch_sampler: Yields lists of indices and has an integer ``batch_size`` attribute.
        **kwargs: Any other ``DataLoader`` argument (``collate_fn``, ``num_workers``, ``pin_memory``, ...),
            except ``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``, which the batch sampler owns.
    """

    def __init__(self, dataset: Dataset, batch_sampler: Any, **kwargs: Any) -> None:
        owned = sorted({"batch_size", "shuffle", "sampler", "drop_last"} & kwargs.keys())
        if owned:
            raise ValueError(
                f"{owned} cannot be combined with a batch_sampler: the batch sampler decides them "
                f"(batch_size={getattr(batch_sampler, 'batch_size', None)!r})."
            )
        batch_size = getattr(batch_sampler, "batch_size", None)
        if not is_int(batch_size) or batch_size < 1:
            raise TypeError(
                f"batch_sampler must have an integer batch_size >= 1, got {type(batch_sampler).__name__} "
                f"with batch_size={batch_size!r}."
            )
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        # DataLoader forbids assigning batch_size after __init__; it only reads it for iterable datasets.
        self.__dict__["batch_size"] = int(batch_size)
        from composer_dynsample.samplers.wiring import check_train_loader

        check_train_loader(self)  # a sampler built on more labels than the dataset has samples


def build_dataloader(dataset: Dataset, batch_sampler: Any, **kwargs: Any) -> BatchSamplerDataLoader:
    """Build the ``DataLoader`` of a batch sampler, ready for Composer's ``Trainer``.

    Args:
        dataset (Dataset): A map-style dataset, ideally returning indices and labels only.
        batch_sampler: A batch sampler with ``batch_size``, e.g. :class:`~composer_dynsample.PKBatchSampler`.
        **kwargs: Other ``DataLoader`` arguments (``collate_fn``, ``num_workers``, ``pin_memory``, ...).

    Returns:
        BatchSamplerDataLoader: A ``DataLoader`` whose ``batch_size`` is ``batch_sampler.batch_size``.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from composer_dynsample.samplers import PKBatchSampler
        >>> labels = torch.arange(16) % 4
        >>> loader = build_dataloader(TensorDataset(labels), PKBatchSampler(labels, 2, 2))
        >>> loader.batch_size, len(loader)
        (4, 4)
    """
    return BatchSamplerDataLoader(dataset, batch_sampler, **kwargs)
