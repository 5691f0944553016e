"""Every cross-rank operation of the package, in one place, on plain ``torch.distributed``.

Without an initialised process group each function behaves as the single rank of a world of one, so
the same code runs in a plain script, under Composer's launcher and under ``torchrun``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as torch_dist

__all__ = ["all_gather_rows", "get_rank", "get_world_size", "is_distributed"]


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
