"""Every cross-rank operation of the package, in one place, on plain ``torch.distributed``.

Without an initialised process group each function behaves as the single rank of a world of one, so
the same code runs in a plain script, under Composer's launcher and under ``torchrun``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

__all__ = [
    "RankMismatchError",
    "all_gather_embeddings",
    "all_gather_rows",
    "all_reduce_sum",
    "barrier",
    "broadcast_buffers",
    "broadcast_object",
    "check_ranks_agree",
    "gather_host_ints",
    "gather_objects",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "stable_hash",
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


def get_local_rank() -> int:
    """This process's rank on its machine: the launcher's ``LOCAL_RANK`` (``composer -n`` and ``torchrun`` set
    it), else ``0``."""
    return _env_int("LOCAL_RANK", 0)


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
    rows = gather_host_ints(embeddings.shape[0])  # over the host: no device read
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


_HOST_GROUPS: dict[int, Any] = {}


def gather_host_ints(value: int) -> list[int]:
    """Every rank's ``value``, in rank order, exchanged through host memory: no device tensor is read.

    With a gloo default group the exchange is its own; with NCCL (whose collectives run on the GPU, where
    reading the result would wait for the GPU's whole queue) a gloo group of all ranks is made on the first
    call, which every rank reaches in the same order, as every collective. With one rank: ``[value]``.

    Example:
        >>> gather_host_ints(7)
        [7]
    """
    if not is_distributed() or get_world_size() == 1:
        return [int(value)]
    group = _host_group()
    parts = [torch.zeros(1, dtype=torch.int64) for _ in range(get_world_size())]
    torch_dist.all_gather(parts, torch.tensor([int(value)], dtype=torch.int64), group=group)
    return [int(part.numpy()[0]) for part in parts]  # host memory: numpy reads no device


def _host_group() -> Any:
    """The default group when it runs on the host (gloo), else a gloo group of every rank, made once."""
    default = torch_dist.group.WORLD
    if torch_dist.get_backend(default) == "gloo":
        return default
    key = id(default)
    if key not in _HOST_GROUPS:
        _HOST_GROUPS.clear()  # a process group made after another was destroyed
        _HOST_GROUPS[key] = torch_dist.new_group(backend="gloo")
    return _HOST_GROUPS[key]


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


class RankMismatchError(ValueError, RuntimeError):
    """Ranks that must hold the same value (a sampler's epoch plan, a run's config) hold different ones.

    A ``ValueError`` (the ranks were given different inputs) and, as before it existed, a ``RuntimeError``.
    """


def stable_hash(value: object) -> int:
    """A non-negative 63-bit SHA-256 hash of a value, the same in every process (unlike ``hash``).

    Strings, bytes, integers, floats, ``None``, numpy arrays and tensors (their dtype, shape and
    contents), and tuples or lists of those.

    Example:
        >>> stable_hash(np.arange(3)) == stable_hash(torch.arange(3))
        True
        >>> stable_hash("a") == stable_hash("b")
        False
    """
    digest = hashlib.sha256()
    _hash_into(digest, value)
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def _hash_into(digest: Any, value: object) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        digest.update(f"array:{array.dtype.str}:{array.shape}:".encode())
        digest.update(array.tobytes())
    elif isinstance(value, (tuple, list)):
        digest.update(f"seq:{len(value)}:".encode())
        for item in value:
            _hash_into(digest, item)
    elif isinstance(value, (bytes, bytearray)):
        digest.update(b"bytes:%d:" % len(value) + bytes(value))
    elif value is None or isinstance(value, (str, int, float, np.integer, np.floating)):
        text = f"{type(value).__name__}:{value!r}"
        digest.update(f"{len(text)}:{text}".encode())
    else:
        raise TypeError(
            f"stable_hash takes strings, bytes, numbers, None, arrays, tensors and sequences of them, got "
            f"a {type(value).__name__}."
        )


def _code(value: object) -> int:
    """An integer that fits an int64 as itself, anything else as its :func:`stable_hash`."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return int(value)
    return stable_hash(value)


def _collective_device() -> torch.device:
    """Where the default process group's collectives take their tensors: the current GPU under NCCL."""
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_ranks_agree(
    values: Mapping[str, object],
    *,
    subject: str,
    advice: str,
    on: str = "",
    details: Callable[[], Mapping[str, object]] | None = None,
    local_error: str | None = None,
    error: type[Exception] = RankMismatchError,
) -> None:
    """Raise the same one-line error on every rank when the ranks hold different ``values``.

    One small ``all_gather`` carries every rank's values (integers as they are, anything else as its
    :func:`stable_hash`) and whether the rank has a ``local_error``, so a rank that knows it cannot go on
    says so in the same collective and no rank is left waiting for it in the next one. Only when
    something is wrong does a second collective run (every rank knows it does): it gathers the failing
    ranks' errors, or every rank's ``details()``. Every rank then raises ``error`` with the same message,
    ``"{subject}: rank r cannot go on: {local_error}"`` (the first failing rank's), or ``"{subject}:
    ranks [...] disagree with rank 0 on {on}{names} ({differences}). {advice}"``, where the differences
    are the integers that differ and the detail entries that differ, or else the hashes that differ (as
    ``#`` and 8 hex digits). Every rank must pass the same keys. With one rank or without a process
    group only ``local_error`` raises.

    Args:
        values (Mapping[str, object]): What must be equal on every rank, by name (see :func:`stable_hash`).
        subject (str): What is checked: the start of the message (e.g. ``"SetSamplerEpoch, epoch 0"``).
        advice (str): The end of the message: what to do.
        on (str): Put before the names of the values that differ (e.g. ``"the train sampler's "``).
            Default: ``""``.
        details (Callable[[], Mapping[str, object]], optional): Called on a mismatch only: named values
            (say, a config's keys) whose differences the message lists, by their ``repr``. Default: ``None``.
        local_error (str, optional): Why this rank cannot go on, or ``None``. Default: ``None``.
        error (type[Exception]): The exception raised. Default: :class:`RankMismatchError`.

    Example:
        >>> check_ranks_agree({"seed": 0, "labels": np.arange(4)}, subject="demo", advice="")  # one rank
    """
    if not is_distributed() or get_world_size() == 1:
        if local_error is not None:
            raise error(local_error)
        return
    codes = [_code(value) for value in values.values()] + [int(local_error is not None)]
    table = (
        all_gather_rows(torch.tensor(codes, dtype=torch.int64, device=_collective_device())).cpu().tolist()
    )
    failed = [rank for rank, row in enumerate(table) if row[-1]]
    if failed:
        errors = gather_objects(local_error)
        raise error(f"{subject}: rank {failed[0]} cannot go on: {errors[failed[0]]}")
    ranks = [rank for rank, row in enumerate(table) if row != table[0]]
    if not ranks:
        return
    names = list(values)
    differing = [i for i, name in enumerate(names) if any(row[i] != table[0][i] for row in table)]
    numbers = [i for i in differing if _is_integer(values[names[i]])]
    shown = [(names[i], {r: str(table[r][i]) for r in [0, *ranks]}) for i in numbers]
    if details is not None:
        found = gather_objects({key: repr(value) for key, value in details().items()})
        shown += [item for item in _differences(found, [0, *ranks]) if item[0] not in names]
    if not shown:  # no number or detail says more: show the hashes that differ
        hashed = [i for i in differing if i not in numbers]
        shown += [(names[i], {r: f"#{table[r][i]:016x}"[:9] for r in [0, *ranks]}) for i in hashed]
    text = "; ".join(
        f"{key}: " + ", ".join(f"{value} on rank {rank}" for rank, value in list(per_rank.items())[:4])
        for key, per_rank in shown[:8]
    )
    keys = ", ".join(names[i] for i in differing)
    shown_ranks = str(ranks) if len(ranks) <= 8 else f"[{', '.join(map(str, ranks[:8]))}, ...]"
    raise error(
        f"{subject}: ranks {shown_ranks} disagree with rank 0 on {on}{keys} ({text}). {advice}".rstrip()
    )


def _is_integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and _code(value) == value


def gather_objects(value: object) -> list[object]:
    """Every rank's picklable ``value``, in rank order; ``[value]`` without a process group."""
    if not is_distributed() or get_world_size() == 1:
        return [value]
    gathered: list[object] = [None] * get_world_size()
    torch_dist.all_gather_object(gathered, value)
    return gathered


def broadcast_object(value: object, src: int = 0) -> object:
    """Rank ``src``'s picklable ``value`` on every rank; ``value`` without a process group."""
    if not is_distributed() or get_world_size() == 1:
        return value
    box = [value]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def _differences(found: list[object], ranks: list[int]) -> list[tuple[str, dict[int, str]]]:
    """The detail entries that differ between ``ranks`` (rank 0 first), with each rank's value."""
    mappings = {rank: found[rank] if isinstance(found[rank], Mapping) else {} for rank in ranks}
    keys = sorted(set().union(*mappings.values()))
    out = []
    for key in keys:
        per_rank = {rank: str(mapping.get(key, "(absent)")) for rank, mapping in mappings.items()}
        if len(set(per_rank.values())) > 1:
            out.append((key, per_rank))
    return out
