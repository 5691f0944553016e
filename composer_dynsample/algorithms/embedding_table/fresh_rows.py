"""Rows the current model encodes beyond the forward passes: a budget per step, stalest first, and the rows
the sampler's next snapshot will use.

The forward pass writes a row only when its sample is in a batch, in training mode (dropout on), so between
two visits a row holds what an older model, with dropout noise, made of it. A sampler that mines from the
table ranks stale anchors against stale passages. Two remedies, both in eval mode under ``no_grad`` with the
model as it is at that step, each rank a share of the rows and the results gathered, so every rank writes
the same rows:

- ``per_step`` rows at every ``BATCH_END``, the stalest first (never written, then the oldest stamp; ties in
  row order): the negative cache of Lindgren et al. (NeurIPS 2021) refreshes a small share of its cache
  every step;
- ``upcoming``: before a snapshot is searched, the anchors and positives of the batches it applies to (the
  sampler's ``upcoming_rows``), or with ``"all"`` every row (ANCE's refresh of the whole index, at each
  snapshot: the snapshot's lists are then the current model's), so every anchor is ranked by the current model (ADORE's current queries;
  with a frozen passage side the passages are exact too).

:class:`FreshRows` also measures what it replaced: the cosine similarity of each re-encoded row to the row it
overwrites (its ``drift`` is one minus the mean), the table's staleness made visible.
"""

from __future__ import annotations

import torch

from composer_dynsample.algorithms.embedding_table._training_set import embed_rows, rng_untouched
from composer_dynsample.distributed import all_gather_embeddings, get_rank, get_world_size
from composer_dynsample.validation import check_int

__all__ = ["FreshRows"]


class FreshRows:
    """What :class:`~composer_dynsample.EmbeddingTable` re-encodes beyond the forward passes, and the drift.

    Args:
        per_step (int): Rows re-encoded at every ``BATCH_END``, the stalest first; ``0``: none.
        upcoming (bool | str): Re-encode the rows the sampler's next snapshot applies to before it is searched;
            ``"all"``: every row.
    """

    def __init__(self, per_step: int = 0, upcoming: bool | str = False) -> None:
        self.per_step = check_int("fresh_rows_per_step", per_step, minimum=0)
        if upcoming != "all" and not isinstance(upcoming, bool):
            raise ValueError(f'fresh_upcoming must be true, false or "all", got {upcoming!r}.')
        self.upcoming = upcoming
        self._rows = 0  # rows re-encoded that held an earlier embedding, since the last take
        self._cosine = 0.0  # the sum of their cosine similarities to what they replaced

    def stalest(self, written_at: torch.Tensor) -> torch.Tensor:
        """The ``per_step`` rows written longest ago: never written (``-1``) first, ties in row order."""
        return torch.sort(written_at.cpu(), stable=True).indices[: self.per_step]

    def encode(
        self, model: torch.nn.Module, collate: object, rows: torch.Tensor, batch_size: int, dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embed ``rows`` with the model in eval mode, each rank every ``world_size``-th row, gathered: the
        same ``(indices, embeddings)`` on every rank. The global random states are put back afterwards."""
        mine = rows.cpu()[get_rank() :: get_world_size()]
        with rng_untouched():
            embeddings = embed_rows(model, collate, mine, batch_size, dim)
        gathered, indices, _ = all_gather_embeddings(embeddings, mine.to(embeddings.device), with_grad=False)
        return indices, gathered

    def measure(
        self, table: torch.Tensor, written_at: torch.Tensor, indices: torch.Tensor, fresh: torch.Tensor
    ) -> None:
        """Add the cosine similarity of each fresh embedding to the row it is about to replace (rows never
        written are left out)."""
        at = indices.to(table.device)
        held = written_at[at] >= 0
        if not bool(held.any()):
            return
        old = table[at[held]].float()
        new = fresh.to(device=table.device, dtype=torch.float32)[held.to(fresh.device)]
        cosine = torch.nn.functional.cosine_similarity(old, new, dim=1)
        self._rows += int(cosine.numel())
        self._cosine += float(cosine.double().sum())

    def state_dict(self) -> dict[str, float]:
        """The drift counted since the last :meth:`take_drift`, for a resume inside an epoch."""
        return {"rows": float(self._rows), "cosine": self._cosine}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._rows, self._cosine = int(state.get("rows", 0)), float(state.get("cosine", 0.0))

    def take_drift(self) -> dict[str, float]:
        """``fresh_rows_measured`` and ``fresh_drift`` (one minus the mean cosine, NaN without rows) since the
        last call, which starts a new count."""
        drift = 1.0 - self._cosine / self._rows if self._rows else float("nan")
        record = {"fresh_rows_measured": float(self._rows), "fresh_drift": drift}
        self._rows, self._cosine = 0, 0.0
        return record
