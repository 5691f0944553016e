"""Shared helpers for sampler tests: simulate every rank of a world in one process."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np


def all_ranks(factory: Callable[[int], object], world: int) -> list:
    """One sampler per simulated rank."""
    return [factory(rank) for rank in range(world)]


def all_ranks_or_none(factory: Callable[[int], object], world: int) -> list | None:
    """One sampler per simulated rank, or ``None`` when the sampler refuses the setup with a ``ValueError``.

    Warnings are silenced: property tests draw setups with small classes or few batches on purpose, and
    those warnings have their own tests.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return all_ranks(factory, world)
    except ValueError:
        return None


def assert_same_batches(first: list, second: list, epochs: tuple[int, ...]) -> None:
    """Two samplers per rank, built alike, yield the same batches in every one of ``epochs``."""
    for a, b in zip(first, second, strict=True):
        for epoch in epochs:
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert list(a) == list(b)


def assert_disjoint_across_ranks(samplers: list, epoch: int) -> None:
    """No index appears twice within one epoch, on one rank or across ranks."""
    for sampler in samplers:
        sampler.set_epoch(epoch)
    used = np.concatenate([np.asarray(list(s), dtype=np.int64).reshape(-1) for s in samplers])
    assert np.unique(used).size == used.size, "an index appears twice in one epoch"
