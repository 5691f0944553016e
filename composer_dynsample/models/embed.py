"""Embed the items of a store with a model, in batches, under ``no_grad`` in eval mode.

The one place that turns stored features or texts into embeddings outside a training step: the
retrieval gallery, the final evaluation, ``composer-dynsample embed`` and the embedding table's refresh
all call :func:`embed_store`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from composer_dynsample.data.store import TensorStore
from composer_dynsample.data.text.store import TextCollate, TextStore
from composer_dynsample.distributed import unwrap_model
from composer_dynsample.validation import check_int

__all__ = ["Store", "check_rows", "embed_store", "store_labels"]

#: What :func:`embed_store` embeds: feature tensors, or texts (tokenized, gathered by their collate).
Store = TensorStore | TextStore


def check_rows(store: Store, rows: Sequence[int] | np.ndarray | torch.Tensor | None) -> np.ndarray:
    """The rows to embed as an int64 array, all of the sampled rows when ``rows`` is ``None``."""
    if not isinstance(store, (TensorStore, TextStore)):
        raise TypeError(f"store must be a TensorStore or a TextStore, got {type(store).__name__}.")
    if rows is None:
        return np.arange(len(store), dtype=np.int64)
    array = np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(
            f"rows must be a 1-D sequence of integers, got shape {array.shape}, dtype {array.dtype}."
        )
    if array.size and (array.min() < 0 or array.max() >= len(store)):
        raise IndexError(f"rows must lie in [0, {len(store) - 1}], the store's {len(store)} rows.")
    return array.astype(np.int64, copy=False)


def store_labels(store: Store, rows: Sequence[int] | np.ndarray | torch.Tensor | None = None) -> torch.Tensor:
    """The int64 labels of ``rows`` of a store (all of its sampled rows when ``None``)."""
    return store.labels.index_select(0, torch.from_numpy(check_rows(store, rows)))


def _feature_batches(
    store: Store, rows: np.ndarray, batch_size: int, transform: Callable[[Any], Any] | None
) -> Iterator[tuple[np.ndarray, Any]]:
    """``(positions in rows, features)`` batches; texts are sorted by length so a batch pads little."""
    if isinstance(store, TextStore):
        order = np.argsort(store.lengths(rows), kind="stable")
        collate = TextCollate(store, negatives=False)
        for start in range(0, len(rows), batch_size):
            positions = order[start : start + batch_size]
            features = collate(rows[positions].tolist())["features"]
            yield positions, transform(features) if transform is not None else features
        return
    for start in range(0, len(rows), batch_size):
        positions = np.arange(start, min(start + batch_size, len(rows)))
        features = store.gather(torch.from_numpy(rows[positions]))
        yield positions, transform(features) if transform is not None else features


def _to(features: Any, device: torch.device | str) -> Any:
    if isinstance(features, Mapping):
        return {key: value.to(device) for key, value in features.items()}
    return features.to(device)


def embed_store(
    model: nn.Module,
    store: Store,
    *,
    rows: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    batch_size: int = 1024,
    device: torch.device | str | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> torch.Tensor:
    """Embed the items of a :class:`TensorStore` or a :class:`TextStore` in batches, under ``no_grad`` in eval mode.

    The model's ``embed(features)`` is used when it has one (as
    :class:`~composer_dynsample.EmbeddingModel` does), else ``eval_forward({"features", "labels"})``.
    The model's train/eval mode is restored afterwards. Texts are gathered and padded by
    :class:`~composer_dynsample.data.text.store.TextCollate` (without given negatives), sorted by
    length so that each batch pads little; the result is in the order of ``rows``.

    Args:
        model (torch.nn.Module): The model, possibly wrapped in DDP.
        store (TensorStore | TextStore): The items to embed.
        rows (Sequence[int], optional): Which rows, in this order. Default: all the sampled rows
            (``range(len(store))``).
        batch_size (int): Items per forward pass. Default: ``1024``.
        device (torch.device | str, optional): Where to run. Default: the model's parameters' device.
        transform (Callable, optional): Applied to each batch of features first (as in
            :class:`~composer_dynsample.data.GatherCollate`). Default: ``None``.

    Returns:
        torch.Tensor: ``(len(rows), D)`` float32 embeddings on ``device``.

    Raises:
        ValueError: If ``batch_size`` is not a positive integer.

    Example:
        >>> from composer_dynsample import EmbeddingModel
        >>> store = TensorStore(torch.randn(10, 4), torch.arange(10) % 2)
        >>> embed_store(EmbeddingModel(torch.nn.Linear(4, 3)), store, batch_size=4).shape
        torch.Size([10, 3])
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    rows_array = check_rows(store, rows)
    inner = unwrap_model(model)
    if device is None:
        parameter = next(inner.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
    modes = [(module, module.training) for module in inner.modules()]  # e.g. a frozen BatchNorm stays in eval
    inner.eval()
    out: torch.Tensor | None = None
    try:
        with torch.no_grad():
            for positions, features in _feature_batches(store, rows_array, batch_size, transform):
                features = _to(features, device)
                embed = getattr(inner, "embed", None)
                if callable(embed):
                    chunk = embed(features)
                else:
                    labels = store.labels.index_select(0, torch.from_numpy(rows_array[positions]))
                    chunk = inner.eval_forward({"features": features, "labels": labels.to(device)})
                if out is None:
                    out = torch.empty(len(rows_array), chunk.shape[1], device=chunk.device)
                out[torch.from_numpy(positions).to(chunk.device)] = chunk.float()
    finally:
        for module, training in modes:
            module.training = training
    return out if out is not None else torch.empty(0, 0, device=device)
