"""Attach a fixed gallery (e.g. the train set, embedded by the current model) to retrieval metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from composer.core import Callback, State, get_precision_context
from composer.loggers import Logger
from torch import nn

from composer_dynsample.data.store import TensorStore
from composer_dynsample.data.text_store import TextCollate, TextStore
from composer_dynsample.distributed import broadcast_buffers, unwrap_model
from composer_dynsample.validation import check_int

__all__ = ["RetrievalGallery", "embed_store", "store_labels"]

#: What :func:`embed_store` embeds: feature tensors, or texts (tokenized, gathered by their collate).
Store = TensorStore | TextStore


def _check_rows(store: Store, rows: Sequence[int] | np.ndarray | torch.Tensor | None) -> np.ndarray:
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
    return store.labels.index_select(0, torch.from_numpy(_check_rows(store, rows)))


def _feature_batches(
    store: Store, rows: np.ndarray, batch_size: int, transform: Callable[[Any], Any] | None
) -> Iterator[tuple[np.ndarray, Any]]:
    """``(positions in rows, features)`` batches; texts are sorted by length so a batch pads little."""
    if isinstance(store, TextStore):
        order = np.argsort(store.tokens.lengths()[store.text_ids[rows]], kind="stable")
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
    :class:`~composer_dynsample.data.text_store.TextCollate` (without given negatives), sorted by
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
    rows_array = _check_rows(store, rows)
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


class RetrievalGallery(Callback):
    """At ``EVAL_START`` of one evaluator, embed a gallery with the current model and attach it to its metrics.

    Retrieval metrics of :mod:`composer_dynsample.metrics` rank the evaluator's queries (e.g. the test
    set) against a fixed gallery set with ``set_gallery``. Composer deep-copies the model's metrics, so
    this callback sets the gallery on the copies the trainer uses, ``state.eval_metrics[label]``, at
    every ``EVAL_START`` (which Composer runs in eval mode, under ``no_grad``, before it resets the
    metrics). Every rank embeds the whole gallery itself, so no collective is needed and every rank holds
    the same gallery. Metrics without ``set_gallery`` are left alone.

    With more than one rank it first broadcasts rank 0's buffers (BatchNorm statistics, see
    :func:`broadcast_buffers`), so that every rank evaluates the same model, the one rank 0 checkpoints.

    It also keeps :attr:`history`: the evaluator's metric values at every ``EVAL_END``, with the epoch
    and batch they were measured at; a dict-valued metric such as
    :class:`~composer_dynsample.metrics.RetrievalMetrics` gives ``name/key`` entries.

    Args:
        gallery (TensorStore | TextStore): The gallery items, e.g. the train split, or the texts of a
            pair split.
        rows (Sequence[int], optional): The gallery's rows of ``gallery`` (the passages of a pair split:
            its rows that are not queries). Default: all its sampled rows.
        evaluator_label (str): The label of the evaluator whose metrics get the gallery. Default: ``"test"``.
        batch_size (int): Gallery items embedded per forward pass. Default: ``1024``.
        transform (Callable, optional): Applied to each batch of gallery features. Default: ``None``.

    Attributes:
        history (list[dict[str, float]]): One entry per evaluation of ``evaluator_label``.

    Example:
        >>> from composer import Trainer
        >>> gallery_callback = RetrievalGallery(splits.train, evaluator_label="test")  # doctest: +SKIP
        >>> trainer = Trainer(..., eval_dataloader=Evaluator(label="test", dataloader=test_loader),
        ...                   callbacks=[gallery_callback])  # doctest: +SKIP
    """

    def __init__(
        self,
        gallery: Store,
        *,
        rows: Sequence[int] | np.ndarray | None = None,
        evaluator_label: str = "test",
        batch_size: int = 1024,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if not isinstance(gallery, (TensorStore, TextStore)):
            raise TypeError(f"gallery must be a TensorStore or a TextStore, got {type(gallery).__name__}.")
        self.rows = _check_rows(gallery, rows)
        if len(self.rows) == 0:
            raise ValueError("gallery must hold at least one item, got 0.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        self.gallery = gallery
        self.evaluator_label = evaluator_label
        self.batch_size = batch_size
        self.transform = transform
        self.history: list[dict[str, float]] = []

    def eval_start(self, state: State, logger: Logger) -> None:
        if state.dataloader_label != self.evaluator_label:
            return
        broadcast_buffers(state.model)
        with get_precision_context(state.precision, state.precision_config):
            embeddings = embed_store(
                state.model,
                self.gallery,
                rows=self.rows,
                batch_size=self.batch_size,
                transform=self.transform,
            )
        labels = store_labels(self.gallery, self.rows).to(embeddings.device)
        for metric in state.eval_metrics.get(self.evaluator_label, {}).values():
            if hasattr(metric, "set_gallery"):
                metric.set_gallery(embeddings.float(), labels)

    def eval_end(self, state: State, logger: Logger) -> None:
        if state.dataloader_label != self.evaluator_label:
            return
        entry: dict[str, float] = {
            "epoch": int(state.timestamp.epoch),
            "batch": int(state.timestamp.batch),
        }
        for name in state.eval_metrics.get(self.evaluator_label, {}):
            value = state.eval_metric_values.get(name)
            if value is None:
                continue
            if isinstance(value, Mapping):  # RetrievalMetrics computes every metric at once, as a dict
                entry.update({f"{name}/{key}": _to_float(item) for key, item in value.items()})
            else:
                entry[name] = _to_float(value)
        self.history.append(entry)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state.get("history", []))


def _to_float(value: Any) -> float:
    number = float(value.item() if isinstance(value, torch.Tensor) else value)
    return number if math.isfinite(number) else float("nan")
