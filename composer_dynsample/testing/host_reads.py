"""Count the reads of tensor values on the host during training steps, by who asked for them.

On a GPU a read of a device tensor's value (``.item()``, ``.tolist()``, ``.cpu()``, ``if tensor:``,
``float(tensor)``, ``int(tensor)``) makes the CPU wait until the GPU's queue has drained: the host can no
longer run ahead, and a step whose arithmetic takes milliseconds waits on Python between kernels.
``torch.cuda.set_sync_debug_mode`` reports such syncs on CUDA only; :class:`HostReadCounter` counts the
same calls on any device, so a test on the CPU can prove that a training step makes none.

:class:`HostReadCounter` patches the six methods on ``torch.Tensor`` while it is entered and attributes
each call to the first caller outside torch: ``"composer_dynsample"``, ``"composer"`` or ``"other"``.
:class:`HostReadsPerStep` is the Composer callback that counts them step by step, from ``BATCH_START`` to
``BATCH_END`` (the forward, the algorithms, the loss, the backward and the optimizer step).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import composer
import torch
from composer.core import Callback, State
from composer.loggers import Logger

__all__ = ["HOST_READS", "HostReadCounter", "HostReadsPerStep", "caller_of", "origin_of"]

#: The ``torch.Tensor`` methods that read a tensor's value on the host.
HOST_READS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")

_TORCH = str(Path(torch.__file__).resolve().parent)
_PACKAGE = str(Path(__file__).resolve().parents[1])
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
