"""Attach a fixed gallery (e.g. the train set, embedded by the current model) to retrieval metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from composer.core import Callback, State, get_precision_context
from composer.loggers import Logger
from torch import nn

from composer_dynsample.data.store import TensorStore
from composer_dynsample.distributed import broadcast_buffers, unwrap_model
from composer_dynsample.validation import check_int

__all__ = ["RetrievalGallery", "embed_store"]


def embed_store(
    model: nn.Module,
    store: TensorStore,
    *,
    batch_size: int = 1024,
    device: torch.device | str | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Embed every item of a :class:`TensorStore` in batches, under ``no_grad`` and in eval mode.

    The model's ``embed(features)`` is used when it has one (as
    :class:`~composer_dynsample.EmbeddingModel` does), else ``eval_forward({"features", "labels"})``.
    The model's train/eval mode is restored afterwards.

    Args:
        model (torch.nn.Module): The model, possibly wrapped in DDP.
        store (TensorStore): The items to embed.
        batch_size (int): Items per forward pass. Default: ``1024``.
        device (torch.device | str, optional): Where to run. Default: the model's parameters' device.
        transform (Callable, optional): Applied to each batch of features first (as in
            :class:`~composer_dynsample.data.GatherCollate`). Default: ``None``.

    Returns:
        torch.Tensor: ``(len(store), D)`` float32 embeddings on ``device``.

    Raises:
        ValueError: If ``batch_size`` is not a positive integer.

    Example:
        >>> from composer_dynsample import EmbeddingModel
        >>> store = TensorStore(torch.randn(10, 4), torch.arange(10) % 2)
        >>> embed_store(EmbeddingModel(torch.nn.Linear(4, 3)), store, batch_size=4).shape
        torch.Size([10, 3])
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    inner = unwrap_model(model)
    if device is None:
        parameter = next(inner.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
    modes = [(module, module.training) for module in inner.modules()]  # e.g. a frozen BatchNorm stays in eval
    inner.eval()
    chunks = []
    try:
        with torch.no_grad():
            for start in range(0, len(store), batch_size):
                features = store.features[start : start + batch_size]
                if transform is not None:
                    features = transform(features)
                features = features.to(device)
                embed = getattr(inner, "embed", None)
                if callable(embed):
                    out = embed(features)
                else:
                    labels = store.labels[start : start + batch_size].to(device)
                    out = inner.eval_forward({"features": features, "labels": labels})
                chunks.append(out.float())
    finally:
        for module, training in modes:
            module.training = training
    if not chunks:
        return torch.empty(0, 0, device=device)
    return torch.cat(chunks)


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
        gallery (TensorStore): The gallery items, e.g. the train split.
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
        gallery: TensorStore,
        *,
        evaluator_label: str = "test",
        batch_size: int = 1024,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if not isinstance(gallery, TensorStore):
            raise TypeError(f"gallery must be a TensorStore, got {type(gallery).__name__}.")
        if len(gallery) == 0:
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
                batch_size=self.batch_size,
                transform=self.transform,
            )
        labels = self.gallery.labels.to(embeddings.device)
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
