"""What :class:`~composer_dynsample.HardNegativeMining` keeps on the device between two logging steps.

A training step must not read a tensor on the host: on a GPU the read waits for the whole queue. So each step
only adds its statistics, its health flag (:func:`~composer_dynsample.mining.step.step_health`) and the
counters of the warnings to device tensors here, and :meth:`LogWindow.read` brings everything back in one
transfer at a logging step: the mean of each statistic over the window's steps, the smallest embedding
spread, the longest run of steps that mined nothing, and the first batch whose embeddings were unhealthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from composer_dynsample.mining.mined_batch import MinedBatch

__all__ = ["LogWindow", "WindowReading"]


@dataclass(frozen=True)
class WindowReading:
    """One read of a :class:`LogWindow`.

    Attributes:
        means (dict[str, float]): Each statistic's mean over the steps of the window that had it.
        steps (int): The mining steps in the window.
        smallest_spread (float | None): The smallest ``embedding_spread`` of the window.
        last_spread (float | None): The last step's ``embedding_spread``.
        longest_empty_run (int): The longest run of consecutive steps without a tuple that reached into the
            window (a run may start in an earlier window).
        first_unhealthy_batch (int | None): The first batch (as ``state.timestamp.batch`` counted it) whose
            :func:`~composer_dynsample.mining.step.step_health` was not zero, if any.
        health (int): That step's health bits.
    """

    means: dict[str, float]
    steps: int
    smallest_spread: float | None
    last_spread: float | None
    longest_empty_run: int
    first_unhealthy_batch: int | None
    health: int


class LogWindow:
    """The steps since the last read, on the device: :meth:`add` each step, :meth:`read` at a logging step.

    Example:
        >>> from composer_dynsample.mining import BatchHardMiner
        >>> from composer_dynsample.mining.step import mining_step
        >>> window = LogWindow()
        >>> for batch in range(2):
        ...     emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(batch)))
        ...     window.add(mining_step(emb, torch.arange(8) % 4, BatchHardMiner()), batch=batch)
        >>> reading = window.read()
        >>> reading.steps, reading.means["num_tuples"], reading.first_unhealthy_batch
        (2, 8.0, None)
        >>> window.read() is None
        True
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._steps = 0
        self._spreads: tuple[torch.Tensor, torch.Tensor] | None = None  # (smallest, last)
        self._empty_run: torch.Tensor | None = None  # kept across reads: a run may span windows
        self._longest: torch.Tensor | None = None
        self._first_bad: torch.Tensor | None = None  # (batch, health), batch -1 while healthy
        #: The labels of the last step and of its pool (``None`` when the batch was the pool), for messages.
        self.last_labels: tuple[torch.Tensor, torch.Tensor | None] | None = None
        #: The strategy and the batch (``state.timestamp.batch`` at its forward) of the last step.
        self.last_strategy, self.last_batch = "", 0

    def add(self, mined: MinedBatch, *, batch: int, health: torch.Tensor | None = None) -> None:
        """Add one step: its statistics, and its health flag (``None`` when the step checked it on the host)."""
        self._steps += 1
        for name, value in mined.stats.items():
            total = self._sums.get(name)
            self._sums[name] = value if total is None else total + value
            self._counts[name] = self._counts.get(name, 0) + 1
        spread = mined.stats.get("embedding_spread")
        if spread is not None:
            smallest = spread if self._spreads is None else torch.minimum(self._spreads[0], spread)
            self._spreads = (smallest, spread)
        tuples = mined.stats.get("num_tuples")
        if tuples is not None:  # a skipped step mined nothing on purpose: it does not count
            previous = self._empty_run if self._empty_run is not None else torch.zeros_like(tuples)
            self._empty_run = torch.where(tuples > 0, torch.zeros_like(previous), previous + 1)
            longest = self._longest if self._longest is not None else self._empty_run
            self._longest = torch.maximum(longest, self._empty_run)
        if health is not None:
            first = self._first_bad
            if first is None:
                first = torch.tensor([-1, 0], dtype=torch.int64, device=health.device)
            fresh = (first[0] < 0) & (health > 0)
            found = torch.stack([torch.full_like(first[0], batch), health.to(torch.int64)])
            self._first_bad = torch.where(fresh, found, first)
        self.last_labels = (mined.labels, mined.ref_labels)
        self.last_strategy, self.last_batch = mined.strategy, batch

    def read(self) -> WindowReading | None:
        """Everything since the last read, in one transfer to the host (``None`` when no step was added)."""
        if not self._steps:
            return None
        names = list(self._sums)
        values = [self._sums[name] / self._counts[name] for name in names]
        extras = {"spread": self._spreads, "run": (self._longest,), "bad": (self._first_bad,)}
        for group in extras.values():
            if group is not None and group[0] is not None:
                values.extend(group)
        read = _to_host(values)
        means, rest = dict(zip(names, read[: len(names)])), iter(read[len(names) :])
        spreads = (next(rest), next(rest)) if self._spreads is not None else (None, None)
        longest = int(next(rest)) if self._longest is not None else 0
        first_bad: list[float] = list(next(rest)) if self._first_bad is not None else [-1, 0]
        reading = WindowReading(
            means=means,
            steps=self._steps,
            smallest_spread=spreads[0],
            last_spread=spreads[1],
            longest_empty_run=longest,
            first_unhealthy_batch=int(first_bad[0]) if first_bad[0] >= 0 else None,
            health=int(first_bad[1]),
        )
        self._sums, self._counts, self._steps, self._spreads = {}, {}, 0, None
        self._longest = self._empty_run
        return reading


def _to_host(values: list[torch.Tensor]) -> list:
    """The tensors' values in one transfer: each 0-d tensor as a float, each 1-d one as a list of floats."""
    if not values:
        return []
    device = values[0].device
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    flat = torch.cat([value.detach().reshape(-1).to(device=device, dtype=dtype) for value in values]).tolist()
    out, position = [], 0
    for value in values:
        size = value.numel()
        out.append(flat[position] if value.ndim == 0 else flat[position : position + size])
        position += size
    return out
