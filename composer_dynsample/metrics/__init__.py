"""Retrieval metrics for metric learning: Recall@K, MAP@R and R-precision; ranking metrics of queries.

Functional forms (:func:`retrieval_metrics`, :func:`retrieval_recall_at_k`,
:func:`mean_average_precision_at_r`, :func:`r_precision`) score query embeddings against a gallery,
or each item against all others (leave-one-out) when no gallery is given. The torchmetrics classes
(:class:`RetrievalMetrics`, :class:`RetrievalRecallAtK`, :class:`MeanAveragePrecisionAtR`,
:class:`RPrecision`) accumulate over batches and sync across ranks, for Composer evaluators; a fixed
gallery (e.g. the train set) is attached with ``set_gallery``. Definitions, tie handling and the Composer
pattern are documented in :mod:`composer_dynsample.metrics.functional` and
:mod:`composer_dynsample.metrics.retrieval`.

Queries against a corpus (text pairs: anchors against their passages) are scored by
:func:`ranking_metrics` and :class:`RankingMetrics` (:class:`RankingScore`: one of its values): MRR, MRR@k, Recall@k, nDCG@k and CodeSearchNet's
MRR (:mod:`composer_dynsample.metrics.ranking`).

Example:
    >>> import torch
    >>> emb, labels = torch.eye(4).repeat(2, 1), torch.arange(4).repeat(2)
    >>> retrieval_metrics(emb, labels, ks=1)["recall_at_1"]
    tensor(1.)
"""

from composer_dynsample.metrics.functional import (
    count_queries_without_positive,
    mean_average_precision_at_r,
    r_precision,
    retrieval_metrics,
    retrieval_recall_at_k,
)
from composer_dynsample.metrics.ranking import RankingMetrics, ranking_metrics
from composer_dynsample.metrics.ranking_score import RankingScore
from composer_dynsample.metrics.retrieval import (
    MeanAveragePrecisionAtR,
    RetrievalMetrics,
    RetrievalRecallAtK,
    RPrecision,
)

__all__ = [
    "MeanAveragePrecisionAtR",
    "RPrecision",
    "RankingMetrics",
    "RankingScore",
    "RetrievalMetrics",
    "RetrievalRecallAtK",
    "count_queries_without_positive",
    "mean_average_precision_at_r",
    "r_precision",
    "ranking_metrics",
    "retrieval_metrics",
    "retrieval_recall_at_k",
]
