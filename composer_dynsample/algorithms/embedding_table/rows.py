"""How the forward pass's embeddings become table rows: :func:`write_rows`, and :class:`StagedWrites` for a
model on a GPU and a table in host memory; and what class-level samplers read off the rows
(:func:`class_centroids`).

Copying a step's embeddings from the GPU into a table in host memory as they are produced (at
``AFTER_FORWARD``) makes the host wait there for the forward pass to finish, before it can queue the
backward. :class:`StagedWrites` starts the copy instead (into pinned memory, ``non_blocking``, with an
event after it) and applies it at ``BATCH_END``, when Composer has read the loss, so the copy ran beside the
backward and is done; the table is written before the sampler draws the next batch, as before, and a
state read (a checkpoint, a snapshot, a refresh) applies what is staged first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from composer_dynsample.samplers.hard_class import class_means

__all__ = ["StagedWrites", "class_centroids", "staleness", "table_fingerprint", "write_rows"]


def write_rows(
    rows: torch.Tensor, written_at: torch.Tensor, indices: torch.Tensor, embeddings: torch.Tensor, step: int
) -> None:
    """Write ``embeddings`` into ``rows[indices]`` (in place) and stamp them with ``step``.

    An index that occurs twice (a sampler that repeats a sample within a batch) keeps its last row, as
    a sequential write would. Negative indices (padding) are skipped.

    Args:
        rows (torch.Tensor): The ``(N, D)`` table.
        written_at (torch.Tensor): The ``(N,)`` int64 step of each row's last write, ``-1`` if never.
        indices (torch.Tensor): ``(B,)`` row indices.
        embeddings (torch.Tensor): ``(B, D)`` embeddings, cast to the table's dtype and device.
        step (int): The step to stamp.

    Example:
        >>> rows, written = torch.zeros(4, 2), torch.full((4,), -1)
        >>> write_rows(rows, written, torch.tensor([3, 1, 3]), torch.tensor([[1.0, 1], [2, 2], [3, 3]]), step=7)
        >>> rows.tolist(), written.tolist()
        ([[0.0, 0.0], [2.0, 2.0], [0.0, 0.0], [3.0, 3.0]], [-1, 7, -1, 7])
    """
    keep = indices >= 0
    indices, embeddings = indices[keep].to(rows.device), embeddings[keep]
    # Last occurrence wins: write in reverse and keep each index's first hit of the reversed order.
    reversed_indices = indices.flip(0)
    unique, inverse = torch.unique(reversed_indices, return_inverse=True)
    first = torch.full((unique.numel(),), reversed_indices.numel(), dtype=torch.int64, device=rows.device)
    first.scatter_reduce_(0, inverse, torch.arange(reversed_indices.numel(), device=rows.device), "amin")
    source = embeddings.flip(0)[first.to(embeddings.device)]
    rows[unique] = source.detach().to(device=rows.device, dtype=rows.dtype)
    written_at[unique] = int(step)


@dataclass
class _Staged:
    indices: torch.Tensor
    embeddings: torch.Tensor
    step: int
    done: Any  # a CUDA event recorded after the copies, or None for a copy already made


class StagedWrites:
    """Writes started on the device and applied to the table later, in order.

    Args:
        mode (bool, optional): ``True`` stages every write, ``False`` none; ``None`` (default) stages the
            writes of embeddings on a CUDA device into a table elsewhere, the ones whose copy would wait.

    Example:
        >>> staged = StagedWrites(mode=True)
        >>> rows, written = torch.zeros(3, 2), torch.full((3,), -1)
        >>> staged.stage(torch.tensor([2]), torch.ones(1, 2), step=5, dtype=torch.float32)
        >>> rows.tolist(), len(staged)
        ([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], 1)
        >>> staged.apply(lambda i, e, s: write_rows(rows, written, i, e, s))
        >>> rows[2].tolist(), written.tolist(), len(staged)
        ([1.0, 1.0], [-1, -1, 5], 0)
    """

    def __init__(self, mode: bool | None = None) -> None:
        self.mode = mode
        self._staged: list[_Staged] = []

    def __len__(self) -> int:
        return len(self._staged)

    def wanted(self, embeddings: torch.Tensor, table_device: torch.device) -> bool:
        """Whether this write is to be staged (see ``mode``)."""
        if self.mode is not None:
            return self.mode
        return embeddings.device.type == "cuda" and embeddings.device != table_device

    def stage(
        self, indices: torch.Tensor, embeddings: torch.Tensor, *, step: int, dtype: torch.dtype
    ) -> None:
        """Start copying ``indices`` and ``embeddings`` (cast to the table's ``dtype``) to host memory."""
        embeddings = embeddings.detach().to(dtype)
        if embeddings.device.type != "cuda":
            self._staged.append(_Staged(indices.clone(), embeddings.clone(), step, None))
            return
        host_indices = torch.empty(indices.shape, dtype=indices.dtype, pin_memory=True)
        host_rows = torch.empty(embeddings.shape, dtype=dtype, pin_memory=True)
        host_indices.copy_(indices, non_blocking=True)
        host_rows.copy_(embeddings, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._staged.append(_Staged(host_indices, host_rows, step, done))

    def apply(self, write: Any) -> None:
        """Call ``write(indices, embeddings, step)`` for each staged write, in order, once its copy is done."""
        staged, self._staged = self._staged, []
        for item in staged:
            if item.done is not None:
                item.done.synchronize()  # by BATCH_END long finished: Composer has read the loss since
            write(item.indices, item.embeddings, item.step)


def class_centroids(
    rows: torch.Tensor, written_at: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of each class's written rows, in float32, and how many rows each mean is over.

    Args:
        rows (torch.Tensor): The ``(N, D)`` table.
        written_at (torch.Tensor): ``(N,)`` steps of the last writes, ``-1`` for rows never written.
        labels (torch.Tensor): ``(N,)`` class of each row, in ``[0, num_classes)``.
        num_classes (int): The number of classes ``C``.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``(C, D)`` centroids (zeros for a class with no written row) and
        the ``(C,)`` int64 counts.

    Example:
        >>> rows = torch.tensor([[0.0, 2.0], [2.0, 0.0], [4.0, 4.0]])
        >>> centroids, counts = class_centroids(rows, torch.tensor([1, 1, -1]), torch.tensor([0, 0, 1]), 2)
        >>> centroids.tolist(), counts.tolist()
        ([[1.0, 1.0], [0.0, 0.0]], [2, 0])
    """
    return class_means(rows, labels, num_classes, held=written_at >= 0)


def staleness(written_at: torch.Tensor | None, step: int) -> dict[str, float]:
    """``rows_written`` and the mean and max batches since each written row was written, at ``step``.

    Example:
        >>> staleness(torch.tensor([-1, 2, 6]), 10)
        {'rows_written': 2.0, 'staleness_mean': 6.0, 'staleness_max': 8.0}
    """
    if written_at is None or not bool((written_at >= 0).any()):
        return {"rows_written": 0.0, "staleness_mean": float("nan"), "staleness_max": float("nan")}
    written = written_at[written_at >= 0]
    age = (int(step) - written).double()
    return {
        "rows_written": float(written.numel()),
        "staleness_mean": float(age.mean()),
        "staleness_max": float(age.max()),
    }


def table_fingerprint(rows: torch.Tensor | None, written_at: torch.Tensor | None) -> str:
    """A SHA-256 of the rows and their stamps (of nothing before the first write)."""
    digest = hashlib.sha256()
    if rows is not None and written_at is not None:
        digest.update(rows.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        digest.update(written_at.cpu().numpy().tobytes())
    return digest.hexdigest()
