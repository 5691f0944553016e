"""Retrieval metrics as torchmetrics :class:`~torchmetrics.Metric` objects, for Composer evaluators.

The quantities, tie handling and the skipping of queries without positives are those of
:mod:`composer_dynsample.metrics.functional`. Each metric runs in one of two modes:

* **Leave-one-out** (no gallery set): :meth:`update` appends embeddings and labels to list states
  (``dist_reduce_fx="cat"``); :meth:`compute` ranks every item against all the others, gathered from
  every rank. Memory: the embeddings of the whole evaluation set, stored in the metric's dtype
  (float32 unless changed with ``set_dtype``), plus ``chunk_size x N`` while computing.
* **Query/gallery** (a gallery set with :meth:`set_gallery` or the constructor): the gallery is fixed,
  e.g. the train set's embeddings, while the queries, e.g. the test set, stream through
  :meth:`update`. Each update ranks its queries against the gallery at once and adds the per-query
  results to sum states (``dist_reduce_fx="sum"``), so the state is a few numbers and syncing is a
  sum. The gallery itself is not a metric state: every rank must hold the *whole* gallery (all-gather
  the per-rank shards before calling :meth:`set_gallery`), and :meth:`reset` keeps it.

Design: a Composer :class:`~composer.core.Evaluator` streams one dataloader through
``ComposerModel.update_metric``, and the gallery of a query/gallery evaluation is another dataset, so
the gallery is attached to the metric from outside, typically by a callback at ``Event.EVAL_START``
(which Composer runs *before* it resets the eval metrics). Composer deep-copies the metrics of
``ComposerModel.get_metrics``, so the callback must call :meth:`set_gallery` on the copies the trainer
uses, ``state.eval_metrics[evaluator_label][metric_name]``. :meth:`set_gallery` and
:meth:`clear_gallery` reset the metric, since results against another gallery cannot be mixed.

Composer logs the value of ``compute()`` under the metric's name, so the scalar metrics
(:class:`RetrievalRecallAtK`, :class:`MeanAveragePrecisionAtR`, :class:`RPrecision`) suit it best;
:class:`RetrievalMetrics` returns a dict of all of them from one ranking pass. In leave-one-out mode
each metric object stores its own copy of the embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from composer_dynsample.metrics._gallery_ranking import (
    _compute_dtype,
    _Gallery,
    _gallery_to,
    _prepare_gallery,
    _RankingPass,
    _retrieval_compute,
    _retrieval_update,
    _RetrievalSums,
)
from composer_dynsample.metrics.functional import (
    Distance,
    _check_batch,
    _check_chunk_size,
    _check_distance,
    _check_k,
    _check_ks,
)

__all__ = ["MeanAveragePrecisionAtR", "RPrecision", "RetrievalMetrics", "RetrievalRecallAtK"]


class _RetrievalMetricBase(Metric):
    """Shared state and logic; subclasses choose ``ks``, whether R is needed and what compute returns."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    embeddings: list[torch.Tensor] | torch.Tensor
    labels: list[torch.Tensor] | torch.Tensor
    recall_hits: torch.Tensor
    ap_sum: torch.Tensor
    r_precision_sum: torch.Tensor
    num_valid: torch.Tensor
    num_queries: torch.Tensor

    def __init__(
        self,
        ks: tuple[int, ...],
        need_r: bool,
        distance: Distance,
        gallery_embeddings: torch.Tensor | None,
        gallery_labels: torch.Tensor | None,
        chunk_size: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ks = ks
        self.need_r = need_r
        self.distance = _check_distance(distance)
        self.chunk_size = _check_chunk_size(chunk_size)
        # Leave-one-out mode: the evaluation set itself; embeddings are flattened to 1-D (see _sync_dist).
        self.add_state("embeddings", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        # Query/gallery mode: per-query results summed over the queries with R > 0.
        self.add_state("recall_hits", default=torch.zeros(len(ks), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("ap_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("r_precision_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_valid", default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("num_queries", default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self._gallery: _Gallery | None = None
        if (gallery_embeddings is None) != (gallery_labels is None):
            raise ValueError(
                "gallery_embeddings and gallery_labels must be given together "
                "(or both None for leave-one-out)."
            )
        if gallery_embeddings is not None and gallery_labels is not None:
            self.set_gallery(gallery_embeddings, gallery_labels)

    @property
    def has_gallery(self) -> bool:
        """Whether a gallery is set (query/gallery mode) or not (leave-one-out mode)."""
        return self._gallery is not None

    def set_gallery(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Rank the queries of later updates against this fixed gallery, and reset the metric.

        Args:
            embeddings (torch.Tensor): ``(G, D)`` floating-point, finite: the whole gallery, on every rank.
            labels (torch.Tensor): ``(G,)`` integer.

        Raises:
            TypeError: If an input is not a tensor, or has the wrong dtype.
            ValueError: If the gallery is empty, the shapes disagree or embeddings are not finite.

        Example:
            >>> metric = RetrievalRecallAtK(k=1, distance="euclidean")
            >>> metric.set_gallery(torch.tensor([[0.0], [5.0]]), torch.tensor([0, 1]))
            >>> metric.update(torch.tensor([[1.0], [4.0], [3.0]]), torch.tensor([0, 1, 0]))
            >>> metric.has_gallery, round(metric.compute().item(), 4)
            (True, 0.6667)
        """
        emb, labels = _check_batch("gallery embeddings", embeddings, "gallery labels", labels)
        if emb.shape[0] == 0:
            raise ValueError("the gallery must hold at least one item, got 0.")
        self._gallery = _prepare_gallery(emb, labels.to(emb.device), self.distance, _compute_dtype(emb))
        self.reset()

    def clear_gallery(self) -> None:
        """Go back to leave-one-out mode, and reset the metric."""
        self._gallery = None
        self.reset()

    def update(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch of embeddings and their labels.

        Args:
            embeddings (torch.Tensor): ``(B, D)`` floating-point, finite.
            labels (torch.Tensor): ``(B,)`` integer.

        Raises:
            TypeError: If an input is not a tensor, or has the wrong dtype.
            ValueError: If the shapes disagree with each other, the gallery or earlier batches.
        """
        emb, labels = _check_batch("embeddings", embeddings, "labels", labels)
        if self._gallery is not None:
            if emb.shape[1] != self._gallery.embeddings.shape[1]:
                raise ValueError(
                    f"embeddings have dim {emb.shape[1]} but the gallery has dim "
                    f"{self._gallery.embeddings.shape[1]}; they must match."
                )
            if self._gallery.embeddings.device != emb.device:
                self._gallery = _gallery_to(self._gallery, emb.device)
            sums = self._rank(emb, labels, self._gallery, leave_one_out=False)
            self.recall_hits += sums.recall_hits.to(self.recall_hits.device)
            self.ap_sum += sums.ap_sum.to(self.ap_sum.device)
            self.r_precision_sum += sums.r_precision_sum.to(self.r_precision_sum.device)
            self.num_valid += sums.num_valid.to(self.num_valid.device)
            self.num_queries += sums.num_queries.to(self.num_queries.device)
            return
        if emb.shape[0] == 0:
            return
        if not isinstance(self.embeddings, list) or not isinstance(self.labels, list):
            raise RuntimeError("update() was called on a synced metric; call unsync() first.")
        if self.labels:
            dim = self.embeddings[0].numel() // self.labels[0].numel()
            if emb.shape[1] != dim:
                raise ValueError(
                    f"embeddings have dim {emb.shape[1]} but earlier batches had dim {dim}; they must match."
                )
        self.embeddings.append(emb.to(self.dtype).flatten())
        self.labels.append(labels)

    def _sums(self) -> _RetrievalSums:
        if self._gallery is not None:
            return _RetrievalSums(
                self.recall_hits, self.ap_sum, self.r_precision_sum, self.num_valid, self.num_queries
            )
        labels = (
            dim_zero_cat(self.labels)
            if len(self.labels)
            else torch.empty(0, dtype=torch.int64, device=self.device)
        )
        flat = dim_zero_cat(self.embeddings) if len(self.embeddings) else torch.empty(0, device=self.device)
        if labels.numel() == 0:
            empty = torch.zeros((), dtype=torch.int64, device=self.device)
            return _RetrievalSums(
                torch.zeros(len(self.ks), dtype=torch.int64, device=self.device),
                empty.double(),
                empty.double(),
                empty,
                empty,
            )
        if flat.numel() % labels.numel():
            raise ValueError(
                f"gathered {flat.numel()} embedding values for {labels.numel()} labels: "
                "the ranks' embedding dims differ."
            )
        embeddings = flat.view(labels.numel(), -1)
        gallery = _prepare_gallery(embeddings, labels, self.distance, _compute_dtype(embeddings))
        return self._rank(embeddings, labels, gallery, leave_one_out=True)

    def _rank(
        self, query: torch.Tensor, labels: torch.Tensor, gallery: _Gallery, *, leave_one_out: bool
    ) -> _RetrievalSums:
        """The summed per-query results of ``query`` ranked against ``gallery`` with this metric's settings."""
        return _retrieval_update(query, labels, gallery, self._ranking(), leave_one_out=leave_one_out)

    def _ranking(self) -> _RankingPass:
        """This metric's ranking pass: its ``ks``, whether it needs ``R``, its distance and chunk size."""
        return _RankingPass(self.ks, self.need_r, self.distance, self.chunk_size)

    def _compute_dict(self) -> dict[str, torch.Tensor]:
        leave_one_out = self._gallery is None
        return _retrieval_compute(self._sums(), self._ranking(), leave_one_out=leave_one_out)

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        # torchmetrics fills an empty list state on a rank without data with a float tensor of the
        # metric's dtype; give the int64 labels an int64 empty tensor instead, so every rank gathers
        # the same dtype and number of dimensions.
        if isinstance(self.labels, list) and len(self.labels) == 0:
            self.labels = [torch.empty(0, dtype=torch.int64, device=self.device)]
        if isinstance(self.embeddings, list) and len(self.embeddings) == 0:
            self.embeddings = [torch.empty(0, dtype=self.dtype, device=self.device)]
        kwargs = {} if dist_sync_fn is None else {"dist_sync_fn": dist_sync_fn}
        super()._sync_dist(process_group=process_group, **kwargs)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # Move the gallery with the metric (``.to(device)``, as Composer does before evaluating), but
        # never cast it: a half-precision cast would merge its int64 labels and re-rank its rows.
        this = super()._apply(fn, *args, **kwargs)
        if this._gallery is not None:
            this._gallery = _Gallery(*(None if t is None else t.to(fn(t[:0]).device) for t in this._gallery))
        return this


class RetrievalMetrics(_RetrievalMetricBase):
    """Recall@K for each ``k`` in ``ks``, MAP@R and R-precision, computed as a dict from one ranking pass.

    See the module docstring for the two modes (leave-one-out, or a fixed gallery with queries
    streaming through :meth:`update`) and how to use them with Composer.

    Args:
        ks (int | Sequence[int]): The ``K`` of Recall@K, each >= 1. Default: ``(1, 5)``.
        distance (str): ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.
        gallery_embeddings (torch.Tensor, optional): A fixed ``(G, D)`` gallery. Default: ``None``
            (leave-one-out).
        gallery_labels (torch.Tensor, optional): ``(G,)``, given with ``gallery_embeddings``.
        chunk_size (int): Queries ranked at once. Default: ``1024``.
        kwargs: Passed to :class:`torchmetrics.Metric` (e.g. ``compute_on_cpu``, ``process_group``).

    Example:
        >>> metric = RetrievalMetrics(ks=(1, 2), distance="euclidean")
        >>> metric.update(torch.tensor([[0.0], [1.0]]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[2.5], [4.0], [5.5]]), torch.tensor([0, 1, 1]))
        >>> {name: round(value.item(), 4) for name, value in metric.compute().items()}
        {'recall_at_1': 0.2, 'recall_at_2': 0.6, 'map_at_r': 0.15, 'r_precision': 0.2}
    """

    def __init__(
        self,
        ks: int | Sequence[int] = (1, 5),
        distance: Distance = "cosine",
        *,
        gallery_embeddings: torch.Tensor | None = None,
        gallery_labels: torch.Tensor | None = None,
        chunk_size: int = 1024,
        **kwargs: Any,
    ) -> None:
        checked = _check_ks(ks)
        if not checked:
            raise ValueError("ks must hold at least one K.")
        super().__init__(checked, True, distance, gallery_embeddings, gallery_labels, chunk_size, **kwargs)

    def compute(self) -> dict[str, torch.Tensor]:
        """Return float32 scalars ``recall_at_{k}`` per ``k``, ``map_at_r`` and ``r_precision`` (NaN if empty)."""
        return self._compute_dict()


class RetrievalRecallAtK(_RetrievalMetricBase):
    """Recall@K: the fraction of queries with a same-label item among their ``k`` nearest gallery items.

    Only the ``k`` nearest items are ranked. Modes and arguments as in :class:`RetrievalMetrics`.

    Args:
        k (int): ``K`` >= 1; ``k=1`` is 1-NN accuracy. Default: ``1``.
        distance (str): ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.
        gallery_embeddings (torch.Tensor, optional): A fixed ``(G, D)`` gallery. Default: ``None``.
        gallery_labels (torch.Tensor, optional): ``(G,)``, given with ``gallery_embeddings``.
        chunk_size (int): Queries ranked at once. Default: ``1024``.
        kwargs: Passed to :class:`torchmetrics.Metric`.

    Example:
        >>> gallery = torch.tensor([[0.9, 0.1], [0.1, 0.9], [1.0, 1.0]])
        >>> gallery_labels = torch.tensor([0, 1, 0])
        >>> metric = RetrievalRecallAtK(k=1, gallery_embeddings=gallery, gallery_labels=gallery_labels)
        >>> metric.update(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        >>> metric.update(torch.tensor([[0.0, 1.0]]), torch.tensor([0]))
        >>> metric.compute()
        tensor(0.5000)
    """

    def __init__(
        self,
        k: int = 1,
        distance: Distance = "cosine",
        *,
        gallery_embeddings: torch.Tensor | None = None,
        gallery_labels: torch.Tensor | None = None,
        chunk_size: int = 1024,
        **kwargs: Any,
    ) -> None:
        self.k = _check_k(k)
        super().__init__((self.k,), False, distance, gallery_embeddings, gallery_labels, chunk_size, **kwargs)

    def compute(self) -> torch.Tensor:
        """Return Recall@K as a float32 scalar (NaN without data)."""
        return self._compute_dict()[f"recall_at_{self.k}"]


class _MetricAtR(_RetrievalMetricBase):
    """A metric over each query's ``R`` nearest items; :meth:`compute` returns the one named ``_result``."""

    _result: str

    def __init__(
        self,
        distance: Distance = "cosine",
        *,
        gallery_embeddings: torch.Tensor | None = None,
        gallery_labels: torch.Tensor | None = None,
        chunk_size: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__((), True, distance, gallery_embeddings, gallery_labels, chunk_size, **kwargs)

    def compute(self) -> torch.Tensor:
        """Return the metric as a float32 scalar (NaN without data)."""
        return self._compute_dict()[self._result]


class MeanAveragePrecisionAtR(_MetricAtR):
    """MAP@R (Musgrave et al. 2020). Modes and arguments as in :class:`RetrievalMetrics`, without ``ks``.

    Example:
        >>> metric = MeanAveragePrecisionAtR(distance="euclidean")
        >>> metric.update(torch.tensor([[0.0], [1.0], [3.0], [4.0]]), torch.tensor([0, 0, 1, 1]))
        >>> metric.compute()
        tensor(1.)
    """

    _result = "map_at_r"


class RPrecision(_MetricAtR):
    """R-precision (Musgrave et al. 2020). Modes and arguments as in :class:`RetrievalMetrics`, but no ``ks``.

    Example:
        >>> metric = RPrecision(distance="euclidean")
        >>> metric.update(torch.tensor([[0.0], [1.0], [3.0], [1.5]]), torch.tensor([0, 0, 1, 1]))
        >>> metric.compute()
        tensor(0.5000)
    """

    _result = "r_precision"
