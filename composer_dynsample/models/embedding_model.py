"""``EmbeddingModel``: a ComposerModel around an encoder that trains on mined tuples."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from composer.models import ComposerModel
from torch import nn
from torchmetrics import Metric

from composer_dynsample.losses.tuple_losses import TripletMarginLoss, _TupleLoss
from composer_dynsample.mined import MinedBatch
from composer_dynsample.validation import InputTypeError, check_bool

__all__ = ["EmbeddingModel"]


class EmbeddingModel(ComposerModel):
    """Wrap an encoder that maps a batch of features to ``(B, D)`` embeddings for metric learning.

    ``forward`` embeds the batch (L2-normalised by default). ``loss`` receives a
    :class:`~composer_dynsample.MinedBatch` when :class:`~composer_dynsample.HardNegativeMining` runs and
    calls ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``, the signature of
    pytorch-metric-learning losses, which therefore work unchanged; without the algorithm it receives the
    embeddings and calls ``loss(embeddings, labels)`` (the loss then uses every tuple of the batch).

    Batches are dicts (``features_key``/``labels_key``, default ``"features"``/``"labels"``, what
    :class:`~composer_dynsample.data.GatherCollate` produces) or ``(features, labels)`` sequences.

    Args:
        encoder (torch.nn.Module): Maps features to ``(B, D)`` embeddings.
        loss (torch.nn.Module, optional): A loss of :mod:`composer_dynsample.losses` or of PML.
            Default: ``TripletMarginLoss(margin=0.2)``.
        normalize (bool): L2-normalise the embeddings. Default: ``True``.
        features_key (str): The features' key in dict batches. Default: ``"features"``.
        labels_key (str): The labels' key in dict batches. Default: ``"labels"``.
        train_metrics (Mapping[str, Metric] | Sequence[Metric], optional): Metrics updated with
            ``(embeddings, labels)`` on every train batch. Default: none.
        eval_metrics (Mapping[str, Metric] | Sequence[Metric], optional): Metrics updated with
            ``(embeddings, labels)`` on every evaluation batch. Default: none.

    Example:
        >>> encoder = torch.nn.Linear(4, 3)
        >>> model = EmbeddingModel(encoder)
        >>> batch = {"features": torch.randn(6, 4), "labels": torch.tensor([0, 0, 1, 1, 2, 2])}
        >>> embeddings = model(batch)
        >>> tuple(embeddings.shape), bool(model.loss(embeddings, batch) >= 0)
        ((6, 3), True)
    """

    def __init__(
        self,
        encoder: nn.Module,
        loss: nn.Module | None = None,
        *,
        normalize: bool = True,
        features_key: str = "features",
        labels_key: str = "labels",
        train_metrics: Mapping[str, Metric] | Sequence[Metric] | None = None,
        eval_metrics: Mapping[str, Metric] | Sequence[Metric] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise InputTypeError(f"encoder must be a torch.nn.Module, got {type(encoder).__name__}.")
        self.encoder = encoder
        self.loss_fn = loss if loss is not None else TripletMarginLoss(margin=0.2)
        self.normalize = check_bool("normalize", normalize)
        for name, key in (("features_key", features_key), ("labels_key", labels_key)):
            if not isinstance(key, str) or not key:
                raise InputTypeError(f"{name} must be a non-empty string, got {key!r}.")
        self.features_key, self.labels_key = features_key, labels_key
        self.train_metrics = _as_metric_dict(train_metrics)
        self.eval_metrics = _as_metric_dict(eval_metrics)

    def _split(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(batch, Mapping):
            missing = [key for key in (self.features_key, self.labels_key) if key not in batch]
            if missing:
                raise ValueError(f"EmbeddingModel: the batch has keys {sorted(batch)}, missing {missing}.")
            return batch[self.features_key], batch[self.labels_key]
        if isinstance(batch, Sequence) and len(batch) >= 2:
            return batch[0], batch[1]
        raise ValueError(
            f"EmbeddingModel expects a dict batch with {self.features_key!r} and {self.labels_key!r} or a "
            f"(features, labels) sequence, got {type(batch).__name__}."
        )

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        """Embed features with the encoder (and L2-normalise them when ``normalize``)."""
        embeddings = self.encoder(features)
        return nn.functional.normalize(embeddings, dim=-1) if self.normalize else embeddings

    def forward(self, batch: Any) -> torch.Tensor:
        features, _ = self._split(batch)
        return self.embed(features)

    def loss(self, outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(outputs, MinedBatch):
            extra = {"global_mean": outputs.global_mean} if isinstance(self.loss_fn, _TupleLoss) else {}
            return self.loss_fn(
                outputs.embeddings,
                outputs.labels,
                outputs.indices_tuple,
                outputs.ref_embeddings,
                outputs.ref_labels,
                **extra,
            )
        _, labels = self._split(batch)
        return self.loss_fn(outputs, labels)

    def eval_forward(self, batch: Any, outputs: Any | None = None) -> torch.Tensor:
        if isinstance(outputs, MinedBatch):
            return outputs.embeddings
        return outputs if outputs is not None else self.forward(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        return dict(self.train_metrics if is_train else self.eval_metrics)

    def update_metric(self, batch: Any, outputs: Any, metric: Metric) -> None:
        _, labels = self._split(batch)
        embeddings = outputs.embeddings if isinstance(outputs, MinedBatch) else outputs
        metric.update(embeddings.detach(), labels)


def _as_metric_dict(metrics: Mapping[str, Metric] | Sequence[Metric] | None) -> nn.ModuleDict:
    if metrics is None:
        return nn.ModuleDict()
    if isinstance(metrics, Mapping):
        return nn.ModuleDict(dict(metrics))
    return nn.ModuleDict({type(metric).__name__: metric for metric in metrics})
