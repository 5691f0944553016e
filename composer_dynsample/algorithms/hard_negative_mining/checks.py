"""The checks of :class:`~composer_dynsample.HardNegativeMining`, as functions of their own.

:func:`check_pool_options`, :func:`check_batch_key` and :func:`build_scheduled_miners` validate what the
algorithm is built with; :func:`check_embeddings_and_labels` and :func:`check_duplicate_ids` what it reads
from ``State`` (found there by :func:`~composer_dynsample.batches.find_in_batch`);
:func:`check_batches` the log interval, :func:`largest_label_count` the host's bound of the positives;
:func:`microbatch_warning` and :func:`nonfinite_message` say what went wrong in words. The warnings that
watch the steps while training are in :mod:`.monitors`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from composer_dynsample.algorithms.hard_negative_mining.schedule import parse_schedule
from composer_dynsample.batches import find_in_batch
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.registry import MINERS, build_miner, check_strategy
from composer_dynsample.mining.step import HEALTH_NONFINITE
from composer_dynsample.validation import check_bool, check_labels

__all__ = [
    "GATHERS",
    "build_scheduled_miners",
    "check_batch_key",
    "check_batches",
    "check_duplicate_ids",
    "check_embeddings_and_labels",
    "check_pool_options",
    "check_strategy",
    "largest_label_count",
    "microbatch_warning",
    "nonfinite_message",
    "parse_schedule",
    "read_step_tensors",
]

#: The values of ``gather`` with ``cross_rank=True``.
GATHERS = ("autograd", "constant")


def check_embeddings_and_labels(embeddings: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise a ``ValueError`` unless the embeddings are ``(B, D)`` floats and the labels ``B`` integers."""
    if embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(
            f"HardNegativeMining needs (batch, dim) float embeddings, got shape {tuple(embeddings.shape)} and dtype {embeddings.dtype}."
        )
    check_labels("labels", labels, embeddings.shape[0], "embeddings")


def read_step_tensors(
    state: Any,
    embeddings_key: str | int | None,
    labels_key: str | int | None,
    duplicate_key: str | int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The step's embeddings (from ``state.outputs``), labels and duplicate ids (from ``state.batch``; ids
    only with a ``duplicate_key``), checked; a missing one raises an error naming the option to set."""

    def find(source: Any, key: str | int | None, what: str, option: str, **defaults: Any) -> torch.Tensor:
        advice = f"Set {option} to where it is."
        return find_in_batch(source, key, owner="HardNegativeMining", what=what, advice=advice, **defaults)

    embeddings = find(
        state.outputs, embeddings_key, "the embeddings", "embeddings_key", where="state.outputs"
    )
    labels = find(state, labels_key, "the labels", "labels_key", dict_key="labels", index=1)
    check_embeddings_and_labels(embeddings, labels)
    if duplicate_key is None:
        return embeddings, labels, None
    ids = find(state, duplicate_key, "the duplicate ids", "duplicate_key")
    return embeddings, labels, check_duplicate_ids(ids, labels, duplicate_key)


def check_duplicate_ids(ids: torch.Tensor, labels: torch.Tensor, key: str | int) -> torch.Tensor:
    """Return the batch's duplicate ids if they are a 1-D integer tensor of the labels' length."""
    return check_labels(
        f"the duplicate id tensor at state.batch[{key!r}] (duplicate_key)", ids, labels.shape[0], "labels"
    )


def build_scheduled_miners(
    names: Iterable[str], miner_kwargs: Mapping[str, Mapping[str, Any]] | None, distance: str
) -> dict[str, BaseMiner]:
    """Build the miner of every scheduled strategy and of every ``miner_kwargs`` key, checked now.

    A strategy scheduled from a later epoch would otherwise fail only there, after hours of training.

    Example:
        >>> build_scheduled_miners(["semi_hard"], {"hard_topk": {"k": 3}}, "cosine")["hard_topk"]
        HardTopKMiner(k=3, distance='cosine', chunk_size=None)
    """
    kwargs = dict(miner_kwargs or {})
    for name in kwargs:
        check_strategy(name, MINERS, "a miner_kwargs key")
    return {
        name: build_miner(name, kwargs.get(name), distance=distance, where=f"miner_kwargs[{name!r}]")
        for name in dict.fromkeys([*names, *kwargs])
    }


def check_pool_options(cross_rank: object, gather: object) -> tuple[bool, str | None]:
    """``(cross_rank, gather)`` checked: ``gather`` must be explicit with ``cross_rank`` and absent without."""
    cross_rank = check_bool("cross_rank", cross_rank)
    if cross_rank and gather not in GATHERS:
        raise ValueError(
            f"cross_rank=True needs an explicit gather: 'autograd' (gradients flow to every rank) or "
            f"'constant' (other ranks' embeddings as constants), got {gather!r}."
        )
    if not cross_rank and gather is not None:
        raise ValueError(f"gather={gather!r} only applies with cross_rank=True.")
    return cross_rank, gather  # type: ignore[return-value]


def check_batch_key(name: str, key: object) -> str | int | None:
    """``key`` if it is a batch key (a string or an index) or ``None``."""
    if key is not None and (isinstance(key, bool) or not isinstance(key, (str, int))):
        raise ValueError(f"{name} must be a batch key (a string or an index) or None, got {key!r}.")
    return key  # type: ignore[return-value]


def nonfinite_message(batch: int, health: int = HEALTH_NONFINITE) -> str:
    """The error for NaN or inf embeddings (or, by ``health``, entries too large for float32 distances) at
    ``batch`` with ``on_nonfinite='raise'``.

    Example:
        >>> nonfinite_message(3, health=2)[:80]
        'HardNegativeMining: the embeddings at batch 3 hold entries too large for float32'
    """
    if health & HEALTH_NONFINITE:
        found = "contain NaN or inf"
    else:
        found = "hold entries too large for float32 distances (1e17 and above: the squared norms overflow)"
    return (
        f"HardNegativeMining: the embeddings at batch {batch} {found} (on this or another rank). "
        "Lower the learning rate, check the inputs, or pass on_nonfinite='skip' to skip such steps."
    )


def check_batches(name: str, value: object) -> int:
    """A positive number of batches, from an int or a time string in batches (``"50ba"``).

    Example:
        >>> check_batches("log_interval", "50ba"), check_batches("log_interval", 3)
        (50, 3)
        >>> check_batches("log_interval", "2ep")
        Traceback (most recent call last):
            ...
        ValueError: log_interval must be a number of batches >= 1 (an int or a time string such as '50ba'), got '2ep'.
    """
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str) and value.endswith("ba") and value[:-2].isdigit():
        number = int(value[:-2])
    if number is None or number < 1:
        raise ValueError(
            f"{name} must be a number of batches >= 1 (an int or a time string such as '50ba'), got {value!r}."
        )
    return number


def largest_label_count(labels: object) -> int | None:
    """The most rows any label has in a batch still on the host (``None`` for a batch already on a device,
    where counting would read it): a bound, less one, of the positives any anchor has in the batch.

    Example:
        >>> largest_label_count(torch.tensor([3, 1, 3, 3])), largest_label_count(torch.tensor([], dtype=torch.int64))
        (3, 0)
    """
    if not isinstance(labels, torch.Tensor) or labels.device.type != "cpu" or labels.ndim != 1:
        return None
    if not labels.numel():
        return 0
    _, counts = np.unique(labels.numpy(), return_counts=True)  # host memory: no device read
    return int(counts.max())


def microbatch_warning(rows: int, device_rows: int | None, forward_chunk_size: int | None) -> str | None:
    """The warning when Composer split the device batch of ``device_rows`` into microbatches of ``rows``,
    so that mining sees a microbatch, not the batch; ``None`` when it did not.

    Example:
        >>> microbatch_warning(32, 32, None) is None, microbatch_warning(16, 32, None)[:42]
        (True, 'HardNegativeMining: Composer split the dev')
    """
    if device_rows is None or rows >= device_rows:
        return None
    advice = (
        f"forward_chunk_size={forward_chunk_size} already bounds the activation memory: set "
        f"device_train_microbatch_size to the device batch ({device_rows})"
        if forward_chunk_size
        else "EmbeddingModel(forward_chunk_size=N) with device_train_microbatch_size at the device batch "
        "gives mining the whole batch at one chunk's activation memory"
    )
    return (
        f"HardNegativeMining: Composer split the device batch of {device_rows} rows into "
        f"microbatches of {rows} (device_train_microbatch_size), so mining, the cross-batch memory and "
        f"the loss see one microbatch at a time. {advice}."
    )
