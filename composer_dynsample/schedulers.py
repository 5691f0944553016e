"""Learning-rate schedules as Composer schedulers (``ComposerScheduler``: ``state -> lr multiplier``).

Composer ships step, cosine and linear schedules with warmup (``composer.optim``); this module adds
the one-cycle shape that small metric-learning recipes train best with here. A config names it
``scheduler: {name: one_cycle}``.
"""

from __future__ import annotations

import math

from composer.core import State, TimeUnit
from composer.optim import ComposerScheduler

from composer_dynsample.validation import check_choice, check_float

__all__ = ["OneCycleScheduler", "training_progress"]


def training_progress(state: State) -> float:
    """Fraction of ``max_duration`` done, at batch resolution even when the duration is in epochs.

    Args:
        state (State): The trainer's state.

    Returns:
        float: ``0.0`` at the start, ``1.0`` at ``max_duration`` (``0.0`` without a duration).
    """
    max_duration = state.max_duration
    if max_duration is None or int(max_duration.value) <= 0:
        return 0.0
    unit, total = max_duration.unit, float(max_duration.value)
    timestamp = state.timestamp
    if unit == TimeUnit.EPOCH:
        per_epoch = int(state.dataloader_len) if state.dataloader_len is not None else 0
        within = int(timestamp.batch_in_epoch) / per_epoch if per_epoch > 0 else 0.0
        return (int(timestamp.epoch) + min(within, 1.0)) / total
    return float(timestamp.get(unit).value) / total


class OneCycleScheduler(ComposerScheduler):
    """A Composer scheduler with the learning-rate shape of ``torch.optim.lr_scheduler.OneCycleLR``.

    The multiplier of the optimizer's ``lr`` (the peak) rises from ``1 / div_factor`` to 1 over the first
    ``pct_start`` of training, then falls to ``1 / (div_factor * final_div_factor)``, both with cosine
    (or linear) annealing. Progress is measured per batch as a fraction of the trainer's
    ``max_duration``, so unlike ``OneCycleLR`` it needs no step count and a resumed run may train for
    longer than the run it resumes (the schedule stretches to the new ``max_duration``).

    Args:
        pct_start (float): Fraction of training spent rising, in ``(0, 1)``. Default: ``0.3``.
        div_factor (float): Initial lr = peak / ``div_factor``, >= 1. Default: ``25.0``.
        final_div_factor (float): Final lr = initial lr / ``final_div_factor``, >= 1. Default: ``1e4``.
        anneal_strategy (str): ``"cos"`` or ``"linear"``. Default: ``"cos"``.

    Raises:
        ValueError: If an argument is out of range.

    Example:
        >>> scheduler = OneCycleScheduler(pct_start=0.25, div_factor=10.0, final_div_factor=100.0)
        >>> [round(scheduler.multiplier(p), 4) for p in (0.0, 0.25, 1.0)]
        [0.1, 1.0, 0.001]
    """

    def __init__(
        self,
        pct_start: float = 0.3,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        anneal_strategy: str = "cos",
    ) -> None:
        self.pct_start = check_float(
            "pct_start", pct_start, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True
        )
        self.initial = 1.0 / check_float("div_factor", div_factor, minimum=1)
        self.final = self.initial / check_float("final_div_factor", final_div_factor, minimum=1)
        self.anneal_strategy = check_choice("anneal_strategy", anneal_strategy, ("cos", "linear"))

    def _anneal(self, start: float, end: float, fraction: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * fraction))
        return start + (end - start) * fraction

    def multiplier(self, progress: float) -> float:
        """The lr multiplier at ``progress`` (fraction of training done, clipped to ``[0, 1]``)."""
        progress = min(max(progress, 0.0), 1.0)
        if progress < self.pct_start:
            return self._anneal(self.initial, 1.0, progress / self.pct_start)
        return self._anneal(1.0, self.final, (progress - self.pct_start) / (1.0 - self.pct_start))

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        """The multiplier at the state's current time (Composer's ``ComposerScheduler`` protocol)."""
        return self.multiplier(training_progress(state))
