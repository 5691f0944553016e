"""Cross-batch memory (XBM, Wang et al. 2020): a FIFO of detached embeddings and labels (and duplicate ids)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CrossBatchMemory"]


class CrossBatchMemory:
    """A fixed-size FIFO of past embeddings and labels, used as extra reference pool for mining.

    The memory holds constants (``detach``-ed copies): gradients never flow into past steps. Under
    cross-rank training the algorithm enqueues the global batch, so the memory is identical on every rank.

    Duplicate ids (:mod:`composer_dynsample.mining.duplicates`) are kept beside the labels once an enqueue
    passes them; rows enqueued without ids, before or after, hold ``-1`` (no id, matching nothing).

    Args:
        size (int): The number of rows kept, at least 1.

    Example:
        >>> memory = CrossBatchMemory(size=3)
        >>> memory.enqueue(torch.ones(2, 4), torch.tensor([0, 1]))
        >>> memory.enqueue(torch.zeros(2, 4), torch.tensor([2, 3]))
        >>> memory.labels.tolist()  # oldest first; the first row fell out
        [1, 2, 3]
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"memory size must be an integer >= 1, got {size!r}.")
        self.size = size
        self._embeddings: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self._duplicate_ids: torch.Tensor | None = None
        self._next = 0  # the row the next enqueue writes
        self._filled = 0

    def __len__(self) -> int:
        return self._filled

    @property
    def embeddings(self) -> torch.Tensor | None:
        """The stored embeddings, oldest first, or ``None`` while empty."""
        return None if self._embeddings is None or not self._filled else self._ordered(self._embeddings)

    @property
    def labels(self) -> torch.Tensor | None:
        """The stored labels, oldest first, or ``None`` while empty."""
        return None if self._labels is None or not self._filled else self._ordered(self._labels)

    @property
    def duplicate_ids(self) -> torch.Tensor | None:
        """The stored duplicate ids, oldest first, or ``None`` while empty or when none were ever given."""
        if self._duplicate_ids is None or not self._filled:
            return None
        return self._ordered(self._duplicate_ids)

    def _ordered(self, values: torch.Tensor) -> torch.Tensor:
        if self._filled < self.size:
            return values[: self._filled]
        return torch.cat([values[self._next :], values[: self._next]])

    def to(self, device: torch.device | str) -> CrossBatchMemory:
        """Move the stored rows to ``device`` (in place; a no-op when they are there) and return ``self``.

        The memory follows the embeddings: the algorithm moves it to the embeddings' device before it joins
        the pool, and :meth:`enqueue` before it writes, so a memory restored on the CPU moves to the GPU on
        its first use.
        """
        device = torch.device(device)
        if self._embeddings is not None and self._embeddings.device != device:
            self._embeddings = self._embeddings.to(device)
        if self._labels is not None and self._labels.device != device:
            self._labels = self._labels.to(device)
        if self._duplicate_ids is not None and self._duplicate_ids.device != device:
            self._duplicate_ids = self._duplicate_ids.to(device)
        return self

    def enqueue(
        self, embeddings: torch.Tensor, labels: torch.Tensor, duplicate_ids: torch.Tensor | None = None
    ) -> None:
        """Append rows (detached), dropping the oldest when full; the memory moves to their device.

        ``duplicate_ids`` (``(N,)``, optional) are kept with the rows; see the class docstring.
        """
        if duplicate_ids is not None and duplicate_ids.shape != labels.shape:
            raise ValueError(
                f"duplicate_ids of shape {tuple(duplicate_ids.shape)} must have the labels' shape "
                f"{tuple(labels.shape)}."
            )
        embeddings, labels = embeddings.detach(), labels.detach()
        self.to(embeddings.device)
        if self._embeddings is None or self._labels is None:
            self._embeddings = embeddings.new_zeros(self.size, embeddings.shape[1])
            self._labels = labels.new_zeros(self.size)
        elif embeddings.shape[1] != self._embeddings.shape[1]:
            raise ValueError(
                f"embeddings of dimension {embeddings.shape[1]} cannot join a memory of dimension "
                f"{self._embeddings.shape[1]}."
            )
        if duplicate_ids is not None and self._duplicate_ids is None:
            self._duplicate_ids = torch.full((self.size,), -1, dtype=torch.int64, device=self._labels.device)
        embeddings, labels = embeddings[-self.size :], labels[-self.size :]
        rows = (self._next + torch.arange(embeddings.shape[0], device=self._embeddings.device)) % self.size
        self._embeddings[rows] = embeddings.to(self._embeddings.device, self._embeddings.dtype)
        self._labels[rows] = labels.to(self._labels.device, self._labels.dtype)
        if self._duplicate_ids is not None:
            ids = (
                -1
                if duplicate_ids is None
                else duplicate_ids.detach()[-self.size :].to(self._labels.device, torch.int64)
            )
            self._duplicate_ids[rows] = ids
        self._next = (self._next + embeddings.shape[0]) % self.size
        self._filled = min(self.size, self._filled + embeddings.shape[0])

    def state_dict(self) -> dict[str, Any]:
        """The whole memory, for checkpoints: copies, which later steps' writes leave alone."""
        return {
            "size": self.size,
            "embeddings": _copy(self._embeddings, torch.device("cpu")),
            "labels": _copy(self._labels, torch.device("cpu")),
            "duplicate_ids": _copy(self._duplicate_ids, torch.device("cpu")),
            "next": self._next,
            "filled": self._filled,
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Restore a memory saved by :meth:`state_dict`, onto ``device`` (default: where it was saved).

        The rows keep their saved dtype; they move to the embeddings' device on first use (:meth:`to`).
        A checkpoint saved before duplicate ids were kept restores without them (its rows have no id).
        """
        if state["size"] != self.size:
            raise ValueError(f"the checkpoint's memory holds {state['size']} rows, this one {self.size}.")
        self._embeddings, self._labels = _copy(state["embeddings"], device), _copy(state["labels"], device)
        self._duplicate_ids = _copy(state.get("duplicate_ids"), device)
        self._next, self._filled = int(state["next"]), int(state["filled"])


def _copy(tensor: torch.Tensor | None, device: torch.device | None) -> torch.Tensor | None:
    """A copy of ``tensor`` on ``device`` (default: its own), never a view that later writes could reach."""
    return None if tensor is None else tensor.to(device if device is not None else tensor.device, copy=True)
