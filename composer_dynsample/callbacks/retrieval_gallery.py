"""Attach a fixed gallery (e.g. the train set, embedded by the current model) to retrieval metrics."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from composer.core import Callback, State, get_precision_context
from composer.loggers import Logger

from composer_dynsample.distributed import broadcast_buffers

if TYPE_CHECKING:
    from composer_dynsample.models.embed import Store

__all__ = ["RetrievalGallery"]


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
        from composer_dynsample.data.store import TensorStore

        if not isinstance(gallery, TensorStore) and not _is_text_store(gallery):
            raise TypeError(f"gallery must be a TensorStore or a TextStore, got {type(gallery).__name__}.")
        from composer_dynsample.models.embed import check_rows  # the gallery's embedding, loaded when used

        self.rows = check_rows(gallery, rows)
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
        from composer_dynsample.models.embed import embed_store, store_labels

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


def _is_text_store(gallery: Any) -> bool:
    """Whether ``gallery`` is a :class:`~composer_dynsample.data.TextStore`, without importing the text data
    when it was never imported (then no object can be one)."""
    module = sys.modules.get("composer_dynsample.data.text.store")
    return module is not None and isinstance(gallery, module.TextStore)
