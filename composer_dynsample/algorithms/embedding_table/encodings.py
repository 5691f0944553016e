"""What :class:`~composer_dynsample.EmbeddingTable` encodes beyond the training forward passes.

The forward pass feeds the table for free; these are the encodings it pays for, each in eval mode under
``no_grad`` with the model as it is then, every rank a share and the results gathered, so every rank writes
the same rows: the warm start (every row, by the starting model, the random states put back), the refresh of
rows grown old at chosen epoch starts, the fresh rows before a snapshot (``fresh_upcoming``) and the
list-drift check (``list_drift``, which writes nothing). Their rows and seconds are counted for the epoch's
record. :class:`TableEncodings` is the table's part that does them; it reads the table's rows, stamps,
sampler and fit state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from composer.core import State
from composer.loggers import Logger

from composer_dynsample.algorithms.embedding_table._training_set import (
    encode_training_set,
    rng_untouched,
    train_collate,
)
from composer_dynsample.distributed import broadcast_buffers

__all__ = ["TableEncodings"]


class TableEncodings:
    """The encodings beyond the forward pass, as :class:`~composer_dynsample.EmbeddingTable` runs them."""

    rows: torch.Tensor | None
    written_at: torch.Tensor | None
    num_items: int | None
    refresh_batch_size: int
    refresh_every: int | None
    refresh_max_age: int
    warm_start_cost: dict[str, float] | None
    _state: State | None
    _sampler: Any
    _fresh: Any
    _drift: Any
    _encoded: dict[str, float]
    write: Callable[[torch.Tensor, torch.Tensor, int], None]

    def _warm_start(self, state: State, logger: Logger) -> None:
        """Encode every row with the model as it starts, with the random states put back afterwards."""
        started = time.perf_counter()
        broadcast_buffers(state.model)  # rank 0's statistics, as the refresh
        with rng_untouched():
            indices, embeddings = encode_training_set(
                state.model,
                train_collate(state, "warm_start"),
                int(self.num_items),  # type: ignore[arg-type]  # sized by _fit_start
                self.refresh_batch_size,
            )
        self.write(indices, embeddings, int(state.timestamp.batch))
        seconds = time.perf_counter() - started
        self.warm_start_cost = {"rows_encoded": int(indices.numel()), "seconds": seconds}
        self._count_encoded(int(indices.numel()), seconds)
        logger.log_metrics(
            {
                "embedding_table/warm_start_rows": float(indices.numel()),
                "embedding_table/warm_start_seconds": seconds,
            }
        )

    def _count_encoded(self, rows: int, seconds: float) -> None:
        self._encoded = {"rows": self._encoded["rows"] + rows, "seconds": self._encoded["seconds"] + seconds}

    def _encode_upcoming(self) -> None:
        """With ``fresh_upcoming``, encode the rows the sampler's next snapshot applies to, if it takes one."""
        sampler, state = self._sampler, self._state
        if not self._fresh.upcoming or sampler is None or state is None:
            return
        if not callable(getattr(sampler, "upcoming_rows", None)) or not sampler.wants_snapshot():
            return
        if self._fresh.upcoming == "all" and self.written_at is not None:
            rows = torch.arange(len(self.written_at))
        else:
            rows = torch.from_numpy(sampler.upcoming_rows(int(state.timestamp.epoch)))
        self._encode_fresh(rows, "fresh_upcoming")

    def _check_lists(self) -> None:
        """With ``list_drift``, before a snapshot is searched: its lists against the current model's."""
        state, rows, written_at = self._state, self.rows, self.written_at
        if self._drift is None or state is None or rows is None or written_at is None:
            return
        if self._drift.wanted(self._sampler):
            encode = self._encoder(state, "list_drift", rows.shape[1])
            epoch, step = int(state.timestamp.epoch), int(state.timestamp.batch)
            self._drift.check(self._sampler, rows.float(), written_at >= 0, encode, epoch=epoch, step=step)

    def _encoder(
        self, state: State, option: str, dim: int
    ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """``rows -> (indices, embeddings)`` by the model as it is now (eval mode, every rank a share, gathered),
        every rank with rank 0's BatchNorm statistics, the ones rank 0 checkpoints (its own would make the table
        depend on statistics a resume never sees). ``option`` names the table's option in a loader error."""
        broadcast_buffers(state.model)
        collate, model, batch = train_collate(state, option), state.model, self.refresh_batch_size
        return lambda at: self._fresh.encode(model, collate, at, batch, dim)

    def _encode_fresh(self, rows: torch.Tensor, option: str, *, measure: bool = True) -> float:
        """Encode ``rows`` with the model as it is now (eval mode, every rank a share), measure how far each
        moved from the row it replaces (``measure``), write them stamped with the current step and return the
        seconds it took (``0.0`` for no rows). ``option`` names the table's option in a loader error."""
        state = self._state
        if state is None or self.rows is None or self.written_at is None or rows.numel() == 0:
            return 0.0
        started = time.perf_counter()
        indices, embeddings = self._encoder(state, option, self.rows.shape[1])(rows)
        if measure:
            self._fresh.measure(self.rows, self.written_at, indices, embeddings)
        self.write(indices, embeddings, int(state.timestamp.batch))
        seconds = time.perf_counter() - started
        self._count_encoded(int(indices.numel()), seconds)
        return seconds

    def _refresh_due(self, state: State) -> bool:
        epoch = int(state.timestamp.epoch)
        return self.refresh_every is not None and epoch > 0 and epoch % self.refresh_every == 0

    def _refresh(self, state: State, logger: Logger) -> None:
        """Re-encode the rows older than ``refresh_max_age`` batches (and those never written), and log it."""
        if self.rows is None or self.written_at is None:
            return
        step = int(state.timestamp.batch)
        stale = ((self.written_at < 0) | (step - self.written_at > self.refresh_max_age)).nonzero().view(-1)
        seconds = self._encode_fresh(stale, "refresh_interval", measure=False)
        logger.log_metrics(
            {
                "embedding_table/refresh_seconds": seconds,
                "embedding_table/refreshed_rows": float(stale.numel()),
            }
        )
