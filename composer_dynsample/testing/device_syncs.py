"""Count, on any device, the operations that make a CUDA device wait for the host, by who called them.

On a GPU the host queues kernels ahead of the device; an operation whose result's *size* or *value* the
host needs (``torch.nonzero``, a boolean-mask index, ``torch.unique``, ``repeat_interleave`` without
``output_size``, ``.item()``, ``torch.equal``, a copy to the host), or that copies a value from the host
first (a Python scalar written by indexing, ``t[rows, cols] = 0.5``: write ``t.new_full(rows.shape, 0.5)``) waits until the queue has drained, and the
step then runs at the host's pace. ``torch.cuda.set_sync_debug_mode`` reports those syncs, but only on
CUDA; :class:`SyncOpCounter` recognises the same operations as they are dispatched on any device, so a
test on the CPU can count the syncs a training step would make on a GPU and name their lines.

:class:`SyncOpCounter` is a ``TorchDispatchMode``: it sees every aten operation run while it is entered and
attributes each syncing one to the first caller outside torch (``composer_dynsample``, ``composer`` or
``other``, as :func:`~composer_dynsample.testing.host_reads.caller_of`). :class:`SyncOpsPerStep` is the
Composer callback that counts them step by step, from ``BATCH_START`` to ``BATCH_END``.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from torch.utils._python_dispatch import TorchDispatchMode

from composer_dynsample.testing.host_reads import caller_of

__all__ = ["SYNCING_OPS", "SyncOpCounter", "SyncOpsPerStep", "syncs_on_cuda"]

#: aten operations whose CUDA kernels return a size or value the host must wait for, whatever their inputs.
SYNCING_OPS = frozenset(
    {
        "_local_scalar_dense",  # .item(), bool(), int(), float() of a tensor
        "nonzero",  # torch.nonzero, torch.where(condition), argwhere
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "equal",
        "is_nonzero",
        "bincount",
        "histc",
    }
)
#: Indexing operations that sync when an index is a boolean mask (the mask's true count sizes the result).
_MASK_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


def syncs_on_cuda(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the aten call ``func(*args, **kwargs)`` would make a CUDA device wait for the host.

    Example:
        >>> x = torch.arange(4)
        >>> syncs_on_cuda(torch.ops.aten.nonzero.default, (x,), {})
        True
        >>> syncs_on_cuda(torch.ops.aten.index.Tensor, (x, [x > 1]), {}), syncs_on_cuda(torch.ops.aten.index.Tensor, (x, [x]), {})
        (True, False)
        >>> syncs_on_cuda(torch.ops.aten.repeat_interleave.Tensor, (x,), {}), syncs_on_cuda(
        ...     torch.ops.aten.repeat_interleave.Tensor, (x,), {"output_size": 6})
        (True, False)
    """
    name = func.overloadpacket.__name__
    if name in SYNCING_OPS:
        return True
    if name in _MASK_INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        values = args[2] if len(args) > 2 else kwargs.get("values")
        # A Python scalar written by indexing (``t[rows, cols] = 0.5``) arrives as a 0-dim host tensor, which
        # CUDA copies from the host before the write (measured: benchmarks/_sync_probe.py)
        scalar = isinstance(values, torch.Tensor) and values.ndim == 0 and values.device.type == "cpu"
        return scalar or any(
            isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
            for index in indices or ()
        )
    if name == "repeat_interleave":
        repeats = (
            args[0]
            if func is torch.ops.aten.repeat_interleave.Tensor
            else (args[1] if len(args) > 1 else None)
        )
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    if name in ("_to_copy", "copy_"):  # to or from the host, waiting for the copy
        source = args[1] if name == "copy_" else args[0]
        target = args[0].device if name == "copy_" else torch.device(kwargs.get("device") or source.device)
        between = {source.device.type, target.type}
        return "cuda" in between and "cpu" in between and not kwargs.get("non_blocking", False)
    return False


class SyncOpCounter(TorchDispatchMode):
    """Count the operations :func:`syncs_on_cuda` names while entered, as ``{(origin, "path:line", op): calls}``.

    :attr:`armed` turns the counting off and on without leaving the mode.

    Example:
        >>> with SyncOpCounter() as counter:
        ...     x = torch.arange(6)
        ...     _ = x[x > 2], x.nonzero(), x.sum() * 2, torch.unique(x)
        >>> sorted(op for (_, _, op) in counter.sites)
        ['_unique2', 'index', 'nonzero']
    """

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[tuple[str, str, str]] = Counter()
        self.armed = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.armed and syncs_on_cuda(func, args, kwargs):
            origin, site = caller_of(sys._getframe(1))
            self.sites[(origin, site, func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)

    def total(self, origin: str | None = None) -> int:
        """The syncing calls counted, all of them or those of one origin."""
        return sum(n for (who, _, _), n in self.sites.items() if origin is None or who == origin)


class SyncOpsPerStep(Callback):
    """Count the syncing operations of each training step, ``BATCH_START`` to ``BATCH_END``, in
    :attr:`steps` (one ``{(origin, "path:line", op): calls}`` per step) and, summed, :attr:`sites`.

    The dispatch mode costs time on every operation: a diagnostic for tests and benchmarks.
    """

    def __init__(self) -> None:
        self.steps: list[Counter[tuple[str, str, str]]] = []
        self._counter: SyncOpCounter | None = None

    def batch_start(self, state: State, logger: Logger) -> None:
        self._counter = SyncOpCounter()
        self._counter.__enter__()

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.steps.append(self._counter.sites)
            self._counter = None

    @property
    def sites(self) -> Counter[tuple[str, str, str]]:
        total: Counter[tuple[str, str, str]] = Counter()
        for step in self.steps:
            total.update(step)
        return total
