"""A ``DataLoader`` for batch samplers that Composer can size its microbatches from."""

from __future__ import annotations

import functools
import multiprocessing
import sys
import types
from typing import Any

from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from composer_dynsample.validation import is_int

__all__ = ["BatchSamplerDataLoader", "build_dataloader", "check_worker_imports", "worker_start_method"]

#: The start methods whose workers unpickle the dataset and the collate function, importing their classes.
PICKLING_START_METHODS = ("spawn", "forkserver")


class BatchSamplerDataLoader(DataLoader):
    """A ``DataLoader`` driven by a batch sampler whose ``batch_size`` is the sampler's per-rank batch size.

    ``DataLoader(batch_sampler=...)`` reports ``batch_size=None``; Composer reads that attribute to pick
    the default ``device_train_microbatch_size`` and, finding ``None``, fails later with a bare
    ``AssertionError``. This loader reports the batch sampler's ``batch_size`` instead, so the Trainer
    needs no extra argument (one microbatch per batch, Composer's default). A dataset or collate function
    that spawned workers cannot import is refused at once (:func:`check_worker_imports`).

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
        check_worker_imports(self)  # before the first batch, not a worker's death at the first one
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

    Raises:
        ValueError: If ``spawn`` or ``forkserver`` workers (``num_workers > 0``) would have to import a
            dataset or collate function defined in an interactive ``__main__`` (:func:`check_worker_imports`).

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


def worker_start_method(context: Any = None) -> str:
    """The start method of a ``DataLoader``'s workers: ``context``'s (a name or a multiprocessing context),
    else the one set for the process, else the platform's default (``fork`` on Linux before Python 3.14,
    ``spawn`` on macOS and Windows, ``forkserver`` on Linux from 3.14). Nothing is set by asking.

    Example:
        >>> worker_start_method("spawn"), worker_start_method(multiprocessing.get_context("fork"))
        ('spawn', 'fork')
    """
    if isinstance(context, str):
        return context
    if context is not None:
        return context.get_start_method()
    import torch.multiprocessing

    chosen = torch.multiprocessing.get_start_method(allow_none=True)
    # The default comes first (documented); multiprocessing.get_start_method() would fix the context.
    return chosen if chosen is not None else multiprocessing.get_all_start_methods()[0]


def _interactive_main() -> bool:
    """Whether ``__main__`` is a notebook, IPython, the REPL or ``python -c``: no file a worker can re-import."""
    return getattr(sys.modules.get("__main__"), "__file__", None) is None


def _defined_in_main(what: str, value: Any) -> str | None:
    """``"the dataset's class NotebookDataset"`` when ``value`` (or its class) is defined in ``__main__``."""
    if isinstance(value, functools.partial):
        value = value.func
    if isinstance(value, (types.FunctionType, type)):
        kind, owner = ("function" if isinstance(value, types.FunctionType) else "class"), value
    else:
        kind, owner = "class", type(value)
    if getattr(owner, "__module__", None) != "__main__":
        return None
    return (
        f"the {what} {kind} {owner.__qualname__}"
        if kind == "function"
        else f"the {what}'s class {owner.__qualname__}"
    )


def _pickled_to_workers(loader: DataLoader) -> list[tuple[str, Any]]:
    """What each worker unpickles: the dataset (and the datasets a ``Subset`` or ``ConcatDataset`` wraps),
    the collate function and the worker init function. The batch sampler stays in the main process."""
    found, pending = [], [loader.dataset]
    while pending and len(found) < 64:
        dataset = pending.pop()
        found.append(("dataset", dataset))
        if isinstance(dataset, Subset):
            pending.append(dataset.dataset)
        elif isinstance(dataset, ConcatDataset):
            pending.extend(dataset.datasets)
    return [*found, ("collate_fn", loader.collate_fn), ("worker_init_fn", loader.worker_init_fn)]


def check_worker_imports(loader: DataLoader) -> None:
    """Refuse, in one ``ValueError`` line, a dataset or collate function defined in an interactive
    ``__main__`` (a notebook, IPython, the REPL, ``python -c``) that ``spawn`` or ``forkserver`` workers
    would have to import.

    Such a worker unpickles ``__main__.NotebookDataset``, finds no such attribute in its own ``__main__``
    and dies; the loader then raises PyTorch's ``DataLoader worker (pid(s) ...) exited unexpectedly`` at the
    first batch, the cause only in the worker's stderr. ``fork`` workers inherit the class and are left
    alone, as is ``num_workers=0`` and a ``__main__`` that is a script (spawned workers re-import it).

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> check_worker_imports(DataLoader(TensorDataset(torch.zeros(4)), num_workers=2, multiprocessing_context="spawn"))
    """
    workers = loader.num_workers
    if workers <= 0 or not _interactive_main():
        return
    method = worker_start_method(loader.multiprocessing_context)
    if method not in PICKLING_START_METHODS:
        return
    for what, value in _pickled_to_workers(loader):
        named = None if value is None else _defined_in_main(what, value)
        if named is not None:
            raise ValueError(
                f"{named} is defined in an interactive __main__ (a notebook, IPython or python -c), which the "
                f"{workers} {method!r} DataLoader worker(s) cannot import (they would die at the first batch): "
                "move it into a module (a .py file) and import it from there, or use num_workers=0 or "
                "multiprocessing_context='fork'."
            )
