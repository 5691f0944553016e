"""``EmbeddingModel``: a ComposerModel around an encoder that trains on mined tuples."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from composer.models import ComposerModel
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchmetrics import Metric

from composer_dynsample.batches import find_in_batch
from composer_dynsample.losses.infonce import InfoNCELoss
from composer_dynsample.losses.mined_loss import mined_loss
from composer_dynsample.losses.tuple_losses import TripletMarginLoss, forward_takes
from composer_dynsample.mining.mined_batch import MinedBatch
from composer_dynsample.validation import InputTypeError, check_bool, check_int

__all__ = ["EmbeddingModel"]


class EmbeddingModel(ComposerModel):
    """Wrap an encoder that maps a batch of features to ``(B, D)`` embeddings for metric learning.

    ``forward`` embeds the batch (L2-normalised by default). ``loss`` receives a
    :class:`~composer_dynsample.MinedBatch` when :class:`~composer_dynsample.HardNegativeMining` runs and
    calls ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``, the signature of
    pytorch-metric-learning losses, which therefore work unchanged; without the algorithm it receives the
    embeddings and calls ``loss(embeddings, labels)`` (the loss then uses every tuple of the batch).
    When the algorithm reads duplicate ids (``duplicate_key``) and the loss's ``forward`` takes
    ``duplicate_ids``, it also passes ``duplicate_ids=`` and ``ref_duplicate_ids=``. Without the algorithm,
    ``duplicate_key=`` (e.g. ``"text_group"`` of text pairs) names where the batch holds them, and the loss
    gets ``duplicate_ids=`` from the batch itself: an in-batch recipe then masks repeated texts with no miner,
    and no anchor loses its positive pair because a miner dropped its triplet.

    Batches are dicts (``features_key``/``labels_key``, default ``"features"``/``"labels"``, what
    :class:`~composer_dynsample.data.GatherCollate` produces) or ``(features, labels)`` sequences.

    **The whole batch as the pool at a chunk's memory** (GradCache, Gao et al. 2021). With
    ``forward_chunk_size=N`` the encoder embeds the batch in ``ceil(B / N)`` chunks of at most ``N`` rows
    (sizes within one of each other, so no tiny remainder) and keeps no activations:
    each chunk runs under :func:`torch.utils.checkpoint.checkpoint` (non-reentrant), so the forward keeps
    only the chunk's inputs, and the backward recomputes one chunk at a time. Mining and the loss see the
    embeddings of the whole batch, and the gradient is the unchunked one (tested to float tolerance),
    while activation memory is one chunk's. The cost is a second forward pass per step. Leave
    Composer's ``device_train_microbatch_size`` at the device batch size: Composer's microbatches are
    separate forward passes, so mining would see only a microbatch again (HardNegativeMining warns).

    Dropout draws its masks chunk by chunk and the recomputation replays each chunk's random state, so
    the gradient is exactly that of the forward that produced the embeddings. BatchNorm in training mode
    normalises each chunk with the chunk's own statistics and updates its running statistics once per
    chunk, as Composer's microbatches would; the recomputation leaves the running statistics alone.
    ``features`` may be a tensor or a mapping of tensors (e.g. a tokenizer's output) sharing the batch
    dimension. Evaluation and ``torch.no_grad`` embed chunk by chunk too, without the recomputation.

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
        forward_chunk_size (int, optional): Embed at most this many rows at a time, recomputing each
            chunk in the backward (see above). Default: ``None``, the whole batch in one pass.
        duplicate_key (str, optional): The key of dict batches holding each row's duplicate ids, passed to
            a loss that takes ``duplicate_ids`` when no :class:`~composer_dynsample.HardNegativeMining` does
            (see above). Default: ``None``.

    Example:
        >>> encoder = torch.nn.Linear(4, 3)
        >>> model = EmbeddingModel(encoder)
        >>> batch = {"features": torch.randn(6, 4), "labels": torch.tensor([0, 0, 1, 1, 2, 2])}
        >>> embeddings = model(batch)
        >>> tuple(embeddings.shape), bool(model.loss(embeddings, batch) >= 0)
        ((6, 3), True)
        >>> chunked = EmbeddingModel(encoder, forward_chunk_size=4)
        >>> torch.allclose(chunked(batch), embeddings)
        True
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
        forward_chunk_size: int | None = None,
        duplicate_key: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise InputTypeError(f"encoder must be a torch.nn.Module, got {type(encoder).__name__}.")
        self.encoder = encoder
        self.loss_fn = loss if loss is not None else TripletMarginLoss(margin=0.2)
        self._takes_source = forward_takes(self.loss_fn, "source")  # read once: the signature, not every step
        self.normalize = check_bool("normalize", normalize)
        for name, key in (("features_key", features_key), ("labels_key", labels_key)):
            if not isinstance(key, str) or not key:
                raise InputTypeError(f"{name} must be a non-empty string, got {key!r}.")
        self.features_key, self.labels_key = features_key, labels_key
        self.train_metrics = _as_metric_dict(train_metrics)
        self.eval_metrics = _as_metric_dict(eval_metrics)
        self.forward_chunk_size = check_int(
            "forward_chunk_size", forward_chunk_size, minimum=1, allow_none=True
        )
        if duplicate_key is not None:
            if not isinstance(duplicate_key, str) or not duplicate_key:
                raise InputTypeError(f"duplicate_key must be a non-empty string, got {duplicate_key!r}.")
            if not forward_takes(self.loss_fn, "duplicate_ids"):
                raise ValueError(
                    f"duplicate_key={duplicate_key!r} passes duplicate ids to the loss, and "
                    f"{type(self.loss_fn).__name__} takes no duplicate_ids; use a loss that does (InfoNCELoss) "
                    "or leave duplicate_key unset."
                )
        self.duplicate_key = duplicate_key

    def _split(self, batch: Any) -> tuple[Any, Any]:
        """The features and labels: at ``features_key`` and ``labels_key`` of a dict, else first and second."""
        features = self._find(batch, "the features", self.features_key, 0)
        return features, self._find(batch, "the labels", self.labels_key, 1)

    def _find(self, batch: Any, what: str, dict_key: str, index: int) -> Any:
        """The value at ``dict_key`` of a dict batch or ``index`` of a sequence, else an error naming both forms."""
        advice = (
            f"EmbeddingModel takes dict batches with {self.features_key!r} and {self.labels_key!r} "
            "(features_key, labels_key) or (features, labels) sequences."
        )
        return find_in_batch(
            batch,
            None,
            dict_key,
            index,
            owner="EmbeddingModel",
            what=what,
            advice=advice,
            where="batch",
            tensor=False,
        )

    def embed(self, features: Any) -> torch.Tensor:
        """Embed features with the encoder (and L2-normalise them when ``normalize``), by chunks if asked."""
        size = self.forward_chunk_size
        if size is None or _batch_size(features) <= size:
            return self._embed(features)
        rows = _batch_size(features)
        chunks = _split_features(features, -(-rows // size))
        if rows < 2 * len(chunks) and self.training and _has_batch_norm(self.encoder):
            raise ValueError(
                f"EmbeddingModel: forward_chunk_size={size} cuts this batch of {rows} rows into {len(chunks)} "
                "chunks, one of a single row, which BatchNorm cannot normalise in training; use "
                "forward_chunk_size >= 3, or a batch with at least two rows per chunk."
            )
        if not torch.is_grad_enabled():
            return torch.cat([self._embed(chunk) for chunk in chunks])
        return torch.cat(
            [
                checkpoint(self._embed, chunk, use_reentrant=False, context_fn=self._contexts)
                for chunk in chunks
            ]
        )

    def _contexts(self) -> tuple[Any, Any]:
        """The checkpoint's (forward, recomputation) contexts: the recomputation keeps running statistics."""
        return nullcontext(), running_stats_kept(self.encoder)

    def _embed(self, features: Any) -> torch.Tensor:
        embeddings = self.encoder(features)
        return nn.functional.normalize(embeddings, dim=-1) if self.normalize else embeddings

    def forward(self, batch: Any) -> torch.Tensor:
        features, _ = self._split(batch)
        return self.embed(features)

    def loss(self, outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(outputs, MinedBatch):
            extra = self._query_flags(batch)
            if outputs.duplicate_ids is None and self.duplicate_key is not None:
                if outputs.ref_embeddings is not None:
                    raise ValueError(
                        f"EmbeddingModel(duplicate_key={self.duplicate_key!r}) knows the batch's ids, not those of "
                        "the mining pool (other ranks, the memory): give HardNegativeMining "
                        f"labels_key={self.duplicate_key!r} (each group one class in the pool, its texts "
                        f"positives) or duplicate_key={self.duplicate_key!r}, and the model duplicate_key=None."
                    )
                extra.update(self._duplicate_ids(batch))
            # A step whose value checks run on the device (HardNegativeMining) reads none in the loss either.
            return mined_loss(self.loss_fn, outputs, **extra, **self._source(batch))
        _, labels = self._split(batch)
        # InfoNCE on L2-normalised rows: no entry can overflow a distance, so nothing is read on the host.
        unit_rows = self.normalize and isinstance(self.loss_fn, InfoNCELoss)
        return self.loss_fn(
            outputs,
            labels,
            **self._query_flags(batch),
            **self._duplicate_ids(batch),
            **self._source(batch),
            **({"values_checked": True} if unit_rows else {}),
        )

    def _source(self, batch: Any) -> dict[str, str]:
        """``{"source": batch["source"]}`` for a loss per source of a mix (:class:`~composer_dynsample.losses.
        per_source.PerSourceLoss`), whose forward takes it; else ``{}``."""
        if not self._takes_source or not isinstance(batch, Mapping):
            return {}
        return {"source": batch.get("source")}

    def _duplicate_ids(self, batch: Any) -> dict[str, torch.Tensor]:
        """``{"duplicate_ids": batch[duplicate_key]}`` with a ``duplicate_key``, else ``{}``."""
        if self.duplicate_key is None:
            return {}
        if not isinstance(batch, Mapping) or self.duplicate_key not in batch:
            keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(
                f"EmbeddingModel(duplicate_key={self.duplicate_key!r}): the batch holds no such key ({keys}); "
                "text pairs hold 'text_group' and 'text_hash', or leave duplicate_key unset."
            )
        return {"duplicate_ids": batch[self.duplicate_key]}

    def _query_flags(self, batch: Any) -> dict[str, torch.Tensor]:
        """``{"is_query": ...}`` of a text batch (its ``features["is_query"]``) for a loss that takes it
        (:class:`~composer_dynsample.InfoNCELoss` with ``negatives="passages"``), else ``{}``."""
        features = batch.get("features") if isinstance(batch, Mapping) else None
        if not isinstance(features, Mapping) or "is_query" not in features:
            return {}
        if getattr(self.loss_fn, "negatives", None) != "passages" or not forward_takes(
            self.loss_fn, "is_query"
        ):
            return {}
        return {"is_query": features["is_query"]}

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


@contextmanager
def running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Restore every BatchNorm's running statistics (and batch count) of ``module`` on exit.

    The recomputation of a chunk in the backward runs the encoder a second time; without this, each
    BatchNorm would count the chunk twice.

    Example:
        >>> norm = nn.BatchNorm1d(2)
        >>> with running_stats_kept(norm):
        ...     _ = norm(torch.randn(4, 2) + 5)
        >>> norm.running_mean.tolist(), int(norm.num_batches_tracked)
        ([0.0, 0.0], 0)
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [
        {name: buffer.clone() for name, buffer in norm.named_buffers(recurse=False) if buffer is not None}
        for norm in norms
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for norm, buffers in zip(norms, saved):
                for name, value in buffers.items():
                    getattr(norm, name).copy_(value)


def _batch_size(features: Any) -> int:
    if isinstance(features, torch.Tensor):
        return features.shape[0]
    if isinstance(features, Mapping) and features:
        sizes = {key: value.shape[0] for key, value in features.items() if isinstance(value, torch.Tensor)}
        if len(sizes) == len(features) and len(set(sizes.values())) == 1:
            return next(iter(sizes.values()))
    raise InputTypeError(
        "forward_chunk_size needs features that are a tensor or a mapping of tensors with one batch size, "
        f"got {_describe(features)}."
    )


def _describe(features: Any) -> str:
    if isinstance(features, Mapping):
        return "{" + ", ".join(f"{key!r}: {_describe(value)}" for key, value in features.items()) + "}"
    if isinstance(features, torch.Tensor):
        return f"tensor of shape {tuple(features.shape)}"
    return type(features).__name__


def _split_features(features: Any, count: int) -> list[Any]:
    """``count`` chunks of sizes that differ by one at most (never a small remainder chunk)."""
    if isinstance(features, torch.Tensor):
        return list(features.tensor_split(count))
    parts = {key: value.tensor_split(count) for key, value in features.items()}
    return [dict(zip(parts, chunk)) for chunk in zip(*parts.values())]


def _has_batch_norm(module: nn.Module) -> bool:
    return any(isinstance(child, nn.modules.batchnorm._BatchNorm) for child in module.modules())


def _as_metric_dict(metrics: Mapping[str, Metric] | Sequence[Metric] | None) -> nn.ModuleDict:
    if metrics is None:
        return nn.ModuleDict()
    if isinstance(metrics, Mapping):
        return nn.ModuleDict(dict(metrics))
    return nn.ModuleDict({type(metric).__name__: metric for metric in metrics})
