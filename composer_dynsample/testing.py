"""What a user's own test suite imports: the harnesses this package's suite proves its promises with.

``from composer_dynsample.testing import ...`` in a test module or a ``conftest.py``; nothing else in the
package imports this module, and none of it is a callback to train with: each patches torch or Composer for
the block it runs in, or counts what a step does, for a test or a benchmark.

- **Composer's batch-sampler epoch fix, undone.** Composer before v0.21.2 called ``set_epoch`` only on the
  train dataloader's ``sampler``, never on its ``batch_sampler`` (Composer issue #3123). A P x K batch
  sampler such as :class:`~composer_dynsample.PKBatchSampler` is the ``batch_sampler``, so every epoch
  trained on epoch 0's order again; :class:`~composer_dynsample.SetSamplerEpoch` sets the epoch itself and
  repairs that. :func:`reverted_batch_sampler_fix` (a ``with`` block) and
  :func:`reverted_batch_sampler_fix_fixture` (a pytest fixture) put the old behaviour back into the
  installed Composer, so a test can show both halves: that a run without the callback repeats epoch 0, and
  that the callback gives each epoch its own order, whatever Composer does (the regression test to copy is
  in docs/api.md). They replace ``composer.trainer.trainer._get_distributed_sampler``, a private function
  of Composer that the trainer calls at every epoch start and on resume; should it move in a later
  Composer, the block refuses to start with a ``RuntimeError`` naming the installed Composer version, rather
  than patching nothing and letting the test pass for the wrong reason.
- **Host reads.** On a GPU a read of a device tensor's value (``.item()``, ``.tolist()``, ``.cpu()``,
  ``if tensor:``, ``float(tensor)``, ``int(tensor)``) makes the CPU wait until the GPU's queue has drained.
  ``torch.cuda.set_sync_debug_mode`` reports such syncs on CUDA only; :class:`HostReadCounter` counts the
  same calls (:data:`HOST_READS`) on any device, so a test on the CPU can prove that a training step makes
  none. It patches those methods on ``torch.Tensor`` while it is entered and attributes each call to the
  first caller outside torch (:func:`caller_of`): ``"composer_dynsample"``, ``"composer"`` or ``"other"``.
  :class:`HostReadsPerStep` is the Composer callback that counts them step by step.
- **Device syncs.** An operation whose result's *size* or *value* the host needs (``torch.nonzero``, a
  boolean-mask index, ``torch.unique``, ``repeat_interleave`` without ``output_size``, ``.item()``,
  ``torch.equal``, a copy to the host), or that copies a value from the host first (a Python scalar written
  by indexing, ``t[rows, cols] = 0.5``: write ``t.new_full(rows.shape, 0.5)``), makes a CUDA device wait
  for the host. :class:`SyncOpCounter`, a ``TorchDispatchMode``, recognises those operations
  (:func:`syncs_on_cuda`, :data:`SYNCING_OPS`) as they are dispatched on any device, so a test on the CPU
  can count the syncs a step would make on a GPU and name their lines; :class:`SyncOpsPerStep` is the
  Composer callback that counts them step by step.

The callbacks count from ``BATCH_START`` to ``BATCH_END``: the forward, the algorithms, the loss, the
backward and the optimizer step.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import composer
import torch
from composer.core import Callback, State
from composer.loggers import Logger
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, DistributedSampler

__all__ = [
    "HOST_READS",
    "SYNCING_OPS",
    "HostReadCounter",
    "HostReadsPerStep",
    "SyncOpCounter",
    "SyncOpsPerStep",
    "caller_of",
    "origin_of",
    "reverted_batch_sampler_fix",
    "reverted_batch_sampler_fix_fixture",
    "syncs_on_cuda",
]

# Composer's batch-sampler epoch fix, undone for a block.

#: The private function of ``composer.trainer.trainer`` that finds the sampler whose epoch the trainer sets.
PATCHED_NAME = "_get_distributed_sampler"


def _pre_fix_get_distributed_sampler(dataloader: DataLoader) -> DistributedSampler | None:
    """Composer's behaviour before v0.21.2 (issue #3123): only ``dataloader.sampler`` got its epoch set."""
    return dataloader.sampler if isinstance(dataloader.sampler, DistributedSampler) else None


def _trainer_module() -> Any:
    """``composer.trainer.trainer``, checked to hold the function this harness replaces."""
    import composer.trainer.trainer as trainer_module

    if not callable(getattr(trainer_module, PATCHED_NAME, None)):
        version = getattr(composer, "__version__", "(version unknown)")
        raise RuntimeError(
            f"reverted_batch_sampler_fix: the installed Composer {version} has no "
            f"composer.trainer.trainer.{PATCHED_NAME}, the private function it replaces, so it cannot "
            "simulate the trainer before Composer's batch-sampler epoch fix (v0.21.2) on this version."
        )
    return trainer_module


@contextlib.contextmanager
def reverted_batch_sampler_fix() -> Iterator[None]:
    """Run the block with Composer's batch-sampler epoch fix (v0.21.2) undone, as on an older Composer.

    Inside the block the trainer sets the epoch of the train dataloader's ``sampler`` only, never of its
    ``batch_sampler``: without :class:`~composer_dynsample.SetSamplerEpoch` a batch sampler then yields
    epoch 0's batches every epoch. Build and fit the ``Trainer`` inside the block. The installed Composer
    is restored when the block ends, also when it raises. Blocks may nest. The patch is process-wide:
    run no other training in another thread meanwhile.

    Returns:
        A context manager; it yields ``None``.

    Raises:
        RuntimeError: The installed Composer has no ``composer.trainer.trainer._get_distributed_sampler``
            (the message names its version); nothing is patched.

    Example::

        import torch
        from composer import Trainer

        from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader
        from composer_dynsample.testing import reverted_batch_sampler_fix

        labels = torch.arange(96) % 8
        sampler = PKBatchSampler(labels, classes_per_batch=4, samples_per_class=3)
        with reverted_batch_sampler_fix():
            trainer = Trainer(
                model=my_model,  # your ComposerModel, taking (features, label) batches
                train_dataloader=build_dataloader(my_dataset, sampler),
                max_duration="3ep",
                callbacks=[SetSamplerEpoch()],  # without it, all 3 epochs train epoch 0's batches
            )
            trainer.fit()
    """
    trainer_module = _trainer_module()
    original: Callable[[DataLoader], DistributedSampler | None] = getattr(trainer_module, PATCHED_NAME)
    setattr(trainer_module, PATCHED_NAME, _pre_fix_get_distributed_sampler)
    try:
        yield
    finally:
        setattr(trainer_module, PATCHED_NAME, original)


def reverted_batch_sampler_fix_fixture(name: str = "composer_before_the_fix") -> Callable[..., Any]:
    """A pytest fixture named ``name`` that runs each test using it inside :func:`reverted_batch_sampler_fix`.

    Assign it at the top level of a test module or a ``conftest.py``; pytest is imported only when this is
    called. Each call makes a new fixture, so several modules may each make their own.

    Args:
        name (str): The fixture's name, the argument a test asks for. Default: ``"composer_before_the_fix"``.

    Returns:
        The fixture function, registered with ``pytest.fixture(name=name)``.

    Example::

        from composer_dynsample.testing import reverted_batch_sampler_fix_fixture

        composer_before_the_fix = reverted_batch_sampler_fix_fixture()


        def test_each_epoch_has_its_own_order(composer_before_the_fix):
            ...  # build and fit the Trainer here, with SetSamplerEpoch()
    """
    import pytest

    def fixture() -> Iterator[None]:
        with reverted_batch_sampler_fix():
            yield

    fixture.__doc__ = "Composer's batch-sampler epoch fix (v0.21.2) undone for the test (composer_dynsample)."
    return pytest.fixture(name=name)(fixture)


# Host reads: the tensor values read on the host, by who asked.

#: The ``torch.Tensor`` methods that read a tensor's value on the host.
HOST_READS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")

_TORCH = str(Path(torch.__file__).resolve().parent)
_PACKAGE = str(Path(__file__).resolve().parent)
_COMPOSER = (
    str(Path(composer.__file__).resolve().parent) + os.sep
)  # wherever installed (a --target folder too)


def origin_of(frame: FrameType | None) -> str:
    """Who asked: the package of the first frame outside torch (``composer_dynsample``, ``composer``, ``other``).

    Example:
        >>> import sys
        >>> origin_of(sys._getframe())
        'other'
    """
    return caller_of(frame)[0]


def caller_of(frame: FrameType | None) -> tuple[str, str]:
    """``(origin, "path:line")`` of the first frame outside torch and outside the counters themselves (this
    file's wrapper of a counted method, which a sync counter can see first); the path from its package's
    folder on.

    Example:
        >>> import sys
        >>> caller_of(sys._getframe())[0]
        'other'
    """
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH) and "<" not in path[:1] and path != __file__:
            parts = Path(path).parts
            if path.startswith(_PACKAGE):
                origin = "composer_dynsample"
            else:
                origin = "composer" if str(Path(path).resolve()).startswith(_COMPOSER) else "other"
            top = origin if origin != "other" else None
            short = "/".join(parts[parts.index(top) :]) if top in parts else Path(path).name
            return origin, f"{short}:{frame.f_lineno}"
        frame = frame.f_back
    return "other", "?"


class HostReadCounter:
    """Count calls of :data:`HOST_READS` on tensors while entered, as ``{(origin, method): calls}``.

    Only one counter may be entered at a time (it patches ``torch.Tensor`` itself); :attr:`armed` turns the
    counting off and on without unpatching, so a callback can count some steps and not others.

    Example:
        >>> with HostReadCounter() as counter:
        ...     _ = torch.ones(2).sum().item(), bool(torch.tensor(True))
        >>> counter.total(), counter.by_origin()
        (2, {'other': 2})
    """

    _active: HostReadCounter | None = None

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        #: The same calls by call site: ``{(origin, "path:line", method): calls}``.
        self.sites: Counter[tuple[str, str, str]] = Counter()
        self.armed = True
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> HostReadCounter:
        if HostReadCounter._active is not None:
            raise RuntimeError("HostReadCounter: another counter is already counting; enter one at a time.")
        HostReadCounter._active = self
        for name in HOST_READS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._counting(name, getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        self._saved.clear()
        HostReadCounter._active = None

    def _counting(self, name: str, method: Any) -> Any:
        counter = self

        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if counter.armed:
                origin, site = caller_of(sys._getframe(1))
                counter.counts[(origin, name)] += 1
                counter.sites[(origin, site, name)] += 1
            return method(tensor, *args, **kwargs)

        counted.__name__ = name
        return counted

    def total(self, origin: str | None = None) -> int:
        """The calls counted, all of them or those of one origin."""
        return sum(n for (who, _), n in self.counts.items() if origin is None or who == origin)

    def by_origin(self) -> dict[str, int]:
        """The calls counted per origin."""
        totals: Counter[str] = Counter()
        for (who, _), n in self.counts.items():
            totals[who] += n
        return dict(totals)


class HostReadsPerStep(Callback):
    """Count host reads in each training step (``BATCH_START`` to ``BATCH_END``): :attr:`steps` holds one
    ``{(origin, method): calls}`` per batch, in order.

    Use it inside an entered :class:`HostReadCounter`, which it arms only during the steps.

    Example:
        >>> with HostReadCounter() as counter:
        ...     per_step = HostReadsPerStep(counter)
        ...     trainer = Trainer(..., callbacks=[per_step]); trainer.fit()  # doctest: +SKIP
        >>> [sum(step.values()) for step in per_step.steps]  # doctest: +SKIP
        [0, 0, 0, 2]
    """

    def __init__(self, counter: HostReadCounter) -> None:
        self.counter = counter
        self.counter.armed = False
        self.steps: list[dict[tuple[str, str], int]] = []
        self._before: Counter[tuple[str, str]] = Counter()

    def batch_start(self, state: State, logger: Logger) -> None:
        self._before = Counter(self.counter.counts)
        self.counter.armed = True

    def batch_end(self, state: State, logger: Logger) -> None:
        self.counter.armed = False
        self.steps.append(dict(self.counter.counts - self._before))


# Device syncs: the operations that make a CUDA device wait for the host, recognised on any device.

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
