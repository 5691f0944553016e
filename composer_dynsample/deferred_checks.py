"""The checks of tensor values that a training step defers: the switch that lets mining run without a host read.

A miner called on its own checks what it is given: NaN or inf in the embeddings, entries so large that their
float32 distances overflow (it then computes in float64), and whether any anchor has a positive. Each check
reads a tensor's value on the host, which on a GPU waits for the whole queue to drain. Inside a training step
:func:`~composer_dynsample.mining.mining_step` computes the same facts on the device once (the step's health
flag, read back only at a logging step) and knows the largest number of positives from the host copy of
the labels, so it enters :func:`defer_value_checks` and the functions that would read a value consult
:func:`value_checks_deferred` instead: :func:`~composer_dynsample.validation.check_embeddings`,
:func:`~composer_dynsample.distances.working_dtype` and the miners' label index.

Example:
    >>> value_checks_deferred() is None
    True
    >>> with defer_value_checks(max_positives=1):
    ...     value_checks_deferred().max_positives
    1
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["DeferredChecks", "defer_value_checks", "value_checks_deferred"]


@dataclass(frozen=True)
class DeferredChecks:
    """What the caller that deferred the checks vouches for.

    Attributes:
        max_positives (int, optional): No anchor has more positives than this in the pool (so the label
            index needs no read of its counts); ``None`` when unknown.
    """

    max_positives: int | None = None


_DEFERRED: contextvars.ContextVar[DeferredChecks | None] = contextvars.ContextVar(
    "composer_dynsample_deferred_checks", default=None
)


@contextlib.contextmanager
def defer_value_checks(*, max_positives: int | None = None) -> Iterator[DeferredChecks]:
    """Within the block, value checks that read a tensor on the host are the caller's to make on the device.

    Args:
        max_positives (int, optional): An upper bound of any anchor's positives in the pool, known on the
            host. Default: unknown (the label index reads it).
    """
    checks = DeferredChecks(max_positives=max_positives)
    token = _DEFERRED.set(checks)
    try:
        yield checks
    finally:
        _DEFERRED.reset(token)


def value_checks_deferred() -> DeferredChecks | None:
    """The :class:`DeferredChecks` in force, or ``None`` when every check runs where it is written."""
    return _DEFERRED.get()
