"""Every cross-rank operation of the package, in one place, on plain ``torch.distributed``.

Without an initialised process group each function behaves as the single rank of a world of one, so
the same code runs in a plain script, under Composer's launcher and under ``torchrun``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as torch_dist

__all__ = [
    "all_gather_embeddings",
    "all_gather_rows",
    "all_reduce_sum",
    "barrier",
    "broadcast_buffers",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "unwrap_model",
]


def is_distributed() -> bool:
    """Whether a default process group is initialised."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_world_size() -> int:
    """The number of ranks: the default process group's, else the launcher's ``WORLD_SIZE``, else ``1``.

    Reading the environment matters because samplers are usually built before Composer's ``Trainer``
    initialises the process group; ``composer -n N`` and ``torchrun`` set ``WORLD_SIZE`` and ``RANK``
    in every process before the script starts.
    """
    return torch_dist.get_world_size() if is_distributed() else _env_int("WORLD_SIZE", 1)


def get_rank() -> int:
    """This process's global rank: the default process group's, else the launcher's ``RANK``, else ``0``."""
    return torch_dist.get_rank() if is_distributed() else _env_int("RANK", 0)


def barrier() -> None:
    """Wait until every rank gets here; a no-op without a process group or with one rank."""
    if is_distributed() and torch_dist.get_world_size() > 1:
        torch_dist.barrier()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"The environment variable {name} must be an integer, got {value!r}.") from None


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Gather a tensor of the same shape from every rank and stack the copies: ``(world_size, *shape)``.

    Meant for small bookkeeping tensors (no gradient flows through it). With one rank it returns
    ``tensor[None]``.

    Example:
        >>> all_gather_rows(torch.tensor([3, 1])).tolist()
        [[3, 1]]
    """
    if not is_distributed():
        return tensor[None]
    parts = [torch.empty_like(tensor) for _ in range(get_world_size())]
    torch_dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sends every rank the sum, over ranks, of the gradient of its own slice.

    ``torch.distributed.nn.all_gather`` needs reduce-scatter or all-to-all in its backward, which gloo
    lacks for some layouts; an all-reduce of the whole gradient followed by taking this rank's slice is
    the same sum and works on every backend.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rank, ctx.rows = get_rank(), tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(get_world_size())]
        torch_dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous()
        torch_dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def all_gather_embeddings(
    embeddings: torch.Tensor, labels: torch.Tensor, *, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Gather every rank's embeddings and labels into one pool, in rank order.

    Ranks may hold different numbers of rows (the last microbatch of an epoch): rows are padded to the
    largest count for the collective and the padding is dropped again.

    Args:
        embeddings (torch.Tensor): This rank's ``(B, D)`` embeddings.
        labels (torch.Tensor): This rank's ``(B,)`` labels.
        with_grad (bool): ``True`` lets gradients flow back to every rank's embeddings through the pool
            (an autograd-aware gather); ``False`` gathers constants, except that this rank's own rows
            are the input tensor itself and keep their gradient.

    Returns:
        ``(pool_embeddings, pool_labels, offset)``: the ``(sum of B, D)`` pool, its labels, and the row
        at which this rank's embeddings start in the pool.

    Example:
        >>> pool, pool_labels, offset = all_gather_embeddings(torch.ones(2, 3), torch.tensor([0, 1]), with_grad=False)
        >>> tuple(pool.shape), pool_labels.tolist(), offset
        ((2, 3), [0, 1], 0)
    """
    if not is_distributed() or get_world_size() == 1:
        return embeddings, labels, 0
    rows = all_gather_rows(torch.tensor([embeddings.shape[0]], device=embeddings.device)).view(-1).tolist()
    largest, rank = max(rows), get_rank()
    pad = largest - embeddings.shape[0]
    padded = torch.nn.functional.pad(embeddings, (0, 0, 0, pad)) if pad else embeddings
    padded_labels = torch.nn.functional.pad(labels, (0, pad), value=-1) if pad else labels
    if with_grad:
        gathered = _AllGatherWithGrad.apply(padded)
    else:
        gathered = all_gather_rows(padded.detach()).reshape(-1, embeddings.shape[1])
    gathered_labels = all_gather_rows(padded_labels).reshape(-1)
    keep = torch.cat(
        [torch.arange(r * largest, r * largest + n, device=embeddings.device) for r, n in enumerate(rows)]
    )
    pool, pool_labels = gathered[keep], gathered_labels[keep]
    offset = sum(rows[:rank])
    if not with_grad:
        # This rank's own rows keep their gradient even when the others are constants.
        pool = torch.cat([pool[:offset], embeddings, pool[offset + embeddings.shape[0] :]])
    return pool, pool_labels, offset


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (a copy; no gradient). With one rank, returns it unchanged."""
    if not is_distributed():
        return value
    total = value.detach().clone()
    torch_dist.all_reduce(total)
    return total


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The ComposerModel inside a DDP (or similar) wrapper."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def broadcast_buffers(model: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (e.g. BatchNorm running statistics) to every rank, in place.

    DDP keeps parameters identical on every rank, but each rank's last training forward updates its own
    BatchNorm statistics; DDP broadcasts rank 0's at the start of the next forward. Calling this before
    an evaluation makes every rank evaluate rank 0's model, the one rank 0 checkpoints. A no-op on one rank.

    Args:
        model (torch.nn.Module): The model, possibly wrapped in DDP.
        src (int): The rank whose buffers win. Default: ``0``.

    Example:
        >>> broadcast_buffers(torch.nn.BatchNorm1d(3))  # a no-op without a process group
    """
    if not is_distributed() or get_world_size() < 2:
        return
    for buffer in unwrap_model(model).buffers():
        torch_dist.broadcast(buffer.data, src=src)
