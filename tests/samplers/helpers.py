"""Shared helpers for sampler tests: simulate every rank of a world in one process."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def all_ranks(factory: Callable[[int], object], world: int) -> list:
    """One sampler per simulated rank."""
    return [factory(rank) for rank in range(world)]


def assert_disjoint_across_ranks(samplers: list, epoch: int) -> None:
    """No index appears twice within one epoch, on one rank or across ranks."""
    for sampler in samplers:
        sampler.set_epoch(epoch)
    used = np.concatenate([np.asarray(list(s), dtype=np.int64).reshape(-1) for s in samplers])
    assert np.unique(used).size == used.size, "an index appears twice in one epoch"
