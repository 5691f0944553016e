"""The training set as the embedding table reads it outside a training step: its size, its labels and its
items encoded for the refresh and the warm start.

Both encodings embed items as the train collate builds them (its store and its transform), in batches under
``no_grad`` in eval mode (:func:`~composer_dynsample.models.embed.embed_store`), each rank a share of the
rows, gathered so that every rank writes the same rows.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from composer.core import State

from composer_dynsample.batches import find_in_batch
from composer_dynsample.checkpoints import CheckpointError
from composer_dynsample.distributed import all_gather_embeddings, get_rank, get_world_size, unwrap_model
from composer_dynsample.models.embed import embed_store
from composer_dynsample.validation import check_int

__all__ = [
    "batch_indices",
    "dataset_length",
    "embed_rows",
    "encode_training_set",
    "rng_untouched",
    "search_on_the_model_device",
    "size_mismatch",
    "train_collate",
    "train_labels",
    "train_loader",
]


def train_loader(state: State) -> Any:
    """The train ``DataLoader``, out of a ``DataSpec`` when Composer wrapped it in one."""
    return getattr(state.train_dataloader, "dataloader", state.train_dataloader)


def train_labels(state: State) -> torch.Tensor:
    """The training set's labels, from the index dataset or the collate's store.

    Raises:
        ValueError: If neither holds a labels tensor.
    """
    loader = train_loader(state)
    labels = getattr(getattr(loader, "dataset", None), "labels", None)
    if not isinstance(labels, torch.Tensor):
        labels = getattr(getattr(getattr(loader, "collate_fn", None), "store", None), "labels", None)
    if not isinstance(labels, torch.Tensor):
        raise ValueError(
            "EmbeddingTable: class centroids need the training labels, and neither the train dataset nor its "
            "collate has a labels tensor; use composer_dynsample.data.IndexDataset and GatherCollate."
        )
    return labels


def dataset_length(state: State) -> int:
    """The training set's size, read off the train dataloader's dataset.

    Raises:
        ValueError: If the dataset has no length, or an empty one.
    """
    loader = train_loader(state)
    dataset = getattr(loader, "dataset", None)
    try:
        return check_int("num_items", len(dataset), minimum=1)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            "EmbeddingTable: cannot read the training set's size off the train dataloader; pass num_items."
        ) from None


def train_collate(state: State, option: str) -> Any:
    """The train loader's collate, which must hold the store of the training items.

    Args:
        state (State): Composer's state, with the train dataloader.
        option (str): The table's option that asked for an encoding, named in the error.

    Returns:
        Any: The collate (a ``GatherCollate`` or a ``TextCollate``), with its ``store``.

    Raises:
        ValueError: If the collate has no ``store``.
    """
    collate = getattr(train_loader(state), "collate_fn", None)
    if getattr(collate, "store", None) is None:
        raise ValueError(
            f"EmbeddingTable: {option} encodes samples from the train loader's GatherCollate store, and this "
            f"loader has none; use composer_dynsample.data.GatherCollate or leave {option} unset."
        )
    return collate


def embed_rows(
    model: torch.nn.Module, collate: Any, indices: torch.Tensor, batch_size: int, dim: int
) -> torch.Tensor:
    """Embed the items at ``indices`` as the train collate builds them, under ``no_grad`` in eval mode."""
    if indices.numel() == 0:
        parameter = next(unwrap_model(model).parameters(), None)
        return torch.empty(0, dim, device=parameter.device if parameter is not None else "cpu")
    transform = getattr(collate, "transform", None)
    return embed_store(model, collate.store, rows=indices.cpu(), batch_size=batch_size, transform=transform)


def encode_training_set(
    model: torch.nn.Module, collate: Any, num_items: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embed rows ``0 .. num_items - 1`` of the collate's store, each rank every ``world_size``-th row,
    and gather them: every rank returns the same rows (each computed once, by one rank).

    With fewer rows than ranks, every rank embeds them all and nothing is gathered.

    Args:
        model (torch.nn.Module): The model, possibly wrapped in DDP.
        collate (Any): The train collate, with the ``store`` (and the ``transform``) of the training items.
        num_items (int): The rows to embed, the table's size.
        batch_size (int): Items per forward pass.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: The ``(num_items,)`` row indices and their ``(num_items, D)``
        float32 embeddings, in rank order.

    Raises:
        ValueError: If the store holds fewer than ``num_items`` rows.
    """
    held = len(collate.store)
    if held < num_items:
        raise ValueError(
            f"EmbeddingTable: warm_start encodes the table's {num_items} rows from the train collate's store, "
            f"which holds {held}; pass num_items of at most {held}."
        )
    rows = torch.arange(num_items)
    world = get_world_size()
    sharded = world > 1 and num_items >= world
    mine = rows[get_rank() :: world] if sharded else rows
    embeddings = embed_store(
        model, collate.store, rows=mine, batch_size=batch_size, transform=getattr(collate, "transform", None)
    )
    if not sharded:
        return mine.to(embeddings.device), embeddings
    gathered, indices, _ = all_gather_embeddings(embeddings, mine.to(embeddings.device), with_grad=False)
    return indices, gathered


@contextmanager
def rng_untouched() -> Iterator[None]:
    """Run the block, then put back the global random states it drew from: Python's, NumPy's, torch's on
    the CPU and on every CUDA device in use, so the training that follows draws what it would have."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def search_on_the_model_device(sampler: Any, model: torch.nn.Module) -> None:
    """Run a sampler's corpus search (``search_device``) on the model's device when that is a CUDA device
    and the sampler was given none: the GPU that trains also searches."""
    if sampler is None or not hasattr(sampler, "search_device") or sampler.search_device is not None:
        return
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.device.type == "cuda":
        sampler.search_device = parameter.device


def batch_indices(state: State, key: str) -> torch.Tensor:
    """The step's sample indices (batch key ``key``), flat int64; a missing key is one line of advice."""
    advice = (
        f"Since the batch has no {key!r} tensor, set index_key to where the indices are, or use "
        "composer_dynsample.data.GatherCollate, which adds them as 'index'."
    )
    indices = find_in_batch(state, key, owner="EmbeddingTable", what="the sample indices", advice=advice)
    return indices.view(-1).to(torch.int64)


def size_mismatch(rows: int, items: int | None) -> CheckpointError:
    """The error of a checkpoint's table that does not fit this run's training set."""
    return CheckpointError(
        f"the checkpoint's embedding table has {rows} rows, this run's training set {items}; resume with "
        "the same data."
    )
