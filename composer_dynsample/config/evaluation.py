"""How a run scores its test split: one protocol per kind of data, for the evaluator and at the end.

The data says which (``splits.test_protocol``):

- ``"train_gallery"`` (data without a protocol: the test classes are the train split's, as in
  mnist1d or digits): every test item queries the train split. Recall@K, MAP@R, R-precision.
- ``"leave_one_out"`` (glyphs, labelled texts: test classes never seen in training): every test item
  queries the other test items. Recall@K, MAP@R, R-precision.
- ``"queries_vs_passages"`` (text pairs): the test split's queries (anchors) rank its passages (the
  positives; given negatives are left out of the gallery): MRR, MRR@10, Recall@K, nDCG@10 and
  CodeSearchNet's MRR (:class:`~composer_dynsample.metrics.RankingMetrics`).

During training a Composer ``Evaluator`` streams the queries (:func:`build_evaluation`) and a
:class:`~composer_dynsample.callbacks.RetrievalGallery` attaches the gallery; at the end
:func:`final_metrics` computes the same numbers in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from composer.core import DataSpec, Evaluator
from composer.core.data_spec import default_split_batch
from composer.utils import dist
from torch.utils.data import DataLoader

from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.loading import EvaluationConfig
from composer_dynsample.config.matryoshka import RESULTS_KEY, truncated_scores
from composer_dynsample.data import DatasetSplits, GatherCollate, IndexDataset, TextCollate, TextStore
from composer_dynsample.data.text.data_spec import count_tokens
from composer_dynsample.metrics import (
    MeanAveragePrecisionAtR,
    RankingScore,
    RetrievalRecallAtK,
    RPrecision,
    count_queries_without_positive,
    ranking_metrics,
    retrieval_metrics,
)
from composer_dynsample.models.embed import Store, embed_store, store_labels

__all__ = [
    "LEAVE_ONE_OUT",
    "QUERIES_VS_PASSAGES",
    "TRAIN_GALLERY",
    "build_eval_dataloader",
    "build_evaluation",
    "check_ks_fit_the_gallery",
    "describe_protocol",
    "eval_metrics",
    "final_metrics",
    "gallery_rows",
    "protocol_of",
    "query_rows",
]

TRAIN_GALLERY = "train_gallery"
LEAVE_ONE_OUT = "leave_one_out"
QUERIES_VS_PASSAGES = "queries_vs_passages"
MIX = "mix"  # the sources of a mix of data sets, each scored by its own protocol
_GALLERY_WORDS = {
    TRAIN_GALLERY: "the train split",
    LEAVE_ONE_OUT: "the other test items, leave-one-out",
    QUERIES_VS_PASSAGES: "the test passages",
}
#: The ``k`` of MRR@k and nDCG@k for pairs (Recall@k takes ``evaluation.ks``).
RANKING_KS = (10,)


def source_splits(splits: DatasetSplits) -> dict[str, DatasetSplits]:
    """The splits an evaluation scores, by evaluator label: ``{"test": splits}``, or each source of a mix of
    data sets (``data: {name: mix}``) on its own, as ``test_NAME``."""
    sources = getattr(splits, "sources", None)
    if not sources:
        return {"test": splits}
    return {f"test_{name}": source for name, source in sources.items()}


def protocol_of(splits: DatasetSplits) -> str:
    """The test protocol of ``splits`` (see the module docstring); a mix's sources' protocol when they share
    one, else ``"mix"``."""
    protocol = getattr(splits, "test_protocol", None) or TRAIN_GALLERY
    if protocol == MIX:
        protocols = {protocol_of(source) for source in source_splits(splits).values()}
        return protocols.pop() if len(protocols) == 1 else MIX
    if protocol not in (TRAIN_GALLERY, LEAVE_ONE_OUT, QUERIES_VS_PASSAGES):
        raise ConfigError(
            f"data: {splits.name} has test_protocol {protocol!r}; the run knows "
            f"{[TRAIN_GALLERY, LEAVE_ONE_OUT, QUERIES_VS_PASSAGES]}."
        )
    return protocol


def _is_query(splits: DatasetSplits) -> np.ndarray:
    return np.asarray(splits.test.is_query[: len(splits.test)], dtype=bool)  # type: ignore[attr-defined]


def query_rows(splits: DatasetSplits) -> np.ndarray:
    """The test rows that query: the anchors of pairs, else every test row; of a mix, each source's, as rows
    of the joined test split."""
    sources = source_splits(splits)
    if "test" not in sources:
        starts = splits.test.row_starts  # type: ignore[attr-defined]
        return np.concatenate([query_rows(one) + start for one, start in zip(sources.values(), starts)])
    if protocol_of(splits) == QUERIES_VS_PASSAGES:
        return np.flatnonzero(_is_query(splits))
    return np.arange(len(splits.test), dtype=np.int64)


def gallery_rows(splits: DatasetSplits) -> np.ndarray | None:
    """The test rows of the gallery for pairs (the passages), else ``None`` (the train split, or leave-one-out)."""
    if protocol_of(splits) == QUERIES_VS_PASSAGES:
        return np.flatnonzero(~_is_query(splits))
    return None


def describe_protocol(splits: DatasetSplits) -> tuple[str, int]:
    """``(what the queries are scored against, the gallery's size)``, for reports and ``metrics.json``; a mix's
    sources are each scored on their own (the galleries' sizes summed)."""
    sources = source_splits(splits)
    if "test" not in sources:
        return "each source on its own test split", sum(describe_protocol(one)[1] for one in sources.values())
    protocol = protocol_of(splits)
    if protocol == QUERIES_VS_PASSAGES:
        return "test queries vs test passages", len(gallery_rows(splits))  # type: ignore[arg-type]
    if protocol == LEAVE_ONE_OUT:
        return "leave-one-out among the test items", len(splits.test) - 1
    return "test queries vs train gallery", len(splits.train)


def check_ks_fit_the_gallery(ks: Sequence[int], splits: DatasetSplits) -> None:
    """Refuse a Recall@K whose K reaches the gallery: it would count every query a hit."""
    _, gallery = describe_protocol(splits)
    what = _GALLERY_WORDS[protocol_of(splits)]
    # A query's passage is always in its gallery: Recall@K of all the passages would be 1 for every query.
    passages = protocol_of(splits) == QUERIES_VS_PASSAGES
    largest = gallery - 1 if passages else gallery
    too_large = [k for k in ks if k > largest]
    if too_large:
        needs = f"more than {too_large[0]}" if passages else f"at least {too_large[0]}"
        raise ConfigError(
            f"evaluation.ks={list(ks)}: Recall@{too_large[0]} needs {needs} gallery items, but "
            f"the gallery holds {gallery} ({what}); use ks of at most {max(largest, 1)}."
        )


def eval_metrics(evaluation: EvaluationConfig, splits: DatasetSplits) -> dict[str, Any]:
    """The model's eval metrics for the data's protocol, scalar each (Composer logs them by name).

    A mix of data sets: those of its sources' shared protocol (each source's evaluator keeps its own
    copy); sources scored by different protocols are scored at the end only (``evaluation.interval:
    null``), and the model holds no eval metric.
    """
    sources = source_splits(splits)
    if len(sources) > 1 or "test" not in sources:
        for source in sources.values():
            check_ks_fit_the_gallery(evaluation.ks, source)
        if protocol_of(splits) != MIX:
            return eval_metrics(evaluation, next(iter(sources.values())))
        if evaluation.interval is None:
            return {}
        kinds = ", ".join(f"{label[5:]}: {protocol_of(source)}" for label, source in sources.items())
        raise ConfigError(
            f"evaluation.interval: the sources are scored by different protocols ({kinds}), whose metrics one "
            "evaluator cannot hold; set evaluation.interval: null (each source is scored at the end of "
            "training, into metrics.json), or mix sources of one kind."
        )
    check_ks_fit_the_gallery(evaluation.ks, splits)
    distance = evaluation.distance
    if protocol_of(splits) == QUERIES_VS_PASSAGES:
        options = {
            "distance": distance,
            "recall_ks": evaluation.ks,
            "mrr_ks": RANKING_KS,
            "ndcg_ks": RANKING_KS,
        }
        return {_metric_key(name): RankingScore(name, **options) for name in _ranking_names(evaluation.ks)}
    metrics: dict[str, Any] = {f"recall_at_{k}": RetrievalRecallAtK(k, distance) for k in evaluation.ks}
    metrics["map_at_r"] = MeanAveragePrecisionAtR(distance)
    metrics["r_precision"] = RPrecision(distance)
    return metrics


def _ranking_names(ks: Sequence[int]) -> list[str]:
    """The ranking values of pairs, in the order they are reported."""
    names = ["mrr", *(f"mrr@{k}" for k in RANKING_KS), *(f"recall@{k}" for k in ks)]
    return [*names, *(f"ndcg@{k}" for k in RANKING_KS), "csn_mrr"]


def _metric_key(name: str) -> str:
    """``recall@1`` as ``recall_at_1``: the names of every protocol's results read alike."""
    return name.replace("@", "_at_")


class _Rows:
    """A dataset of ``(row, label)`` items over chosen rows of a store (the queries of a pair split)."""

    def __init__(self, rows: np.ndarray, labels: torch.Tensor) -> None:
        self.rows, self.labels = rows.tolist(), labels.tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.rows[index], self.labels[index]


def _rows_in_batch(batch: Mapping[str, Any]) -> int:
    return int(batch["labels"].shape[0])


def build_eval_dataloader(store: Store, batch_size: int, rows: np.ndarray | None = None) -> DataSpec:
    """The query loader: ``rows`` of the store (default: all), sharded over ranks without shuffling.

    Composer drops the sampler's padding. A ``DataSpec`` whose batches are split into microbatches as
    Composer's default does, except that a batch no larger than the microbatch size (the last, shorter
    batch) stays whole without Composer's "Cannot split tensor of length N into batches of size M"
    warning; text batches (features a mapping) are sized by their labels.
    """
    if isinstance(store, TextStore):
        chosen = np.arange(len(store)) if rows is None else np.asarray(rows, dtype=np.int64)
        dataset: Any = _Rows(chosen, store.labels.index_select(0, torch.from_numpy(chosen)))
        collate: Any = TextCollate(store, negatives=False)
        extra: dict[str, Any] = {
            "get_num_samples_in_batch": _rows_in_batch,
            "get_num_tokens_in_batch": count_tokens,
        }
    else:
        dataset, collate, extra = IndexDataset(store.labels), GatherCollate(store), {}
    sampler = dist.get_sampler(dataset, drop_last=False, shuffle=False)
    # No larger than one rank's share: Composer's eval microbatch size is the loader's batch size.
    batch_size = max(1, min(batch_size, math.ceil(len(dataset) / dist.get_world_size())))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate)
    return DataSpec(loader, split_batch=_split_unless_short, **extra)


def _split_unless_short(batch: Any, microbatch_size: int | float) -> Sequence[Any]:
    """Composer's default microbatch split, with a batch of at most ``microbatch_size`` rows kept whole."""
    rows = batch["labels"].shape[0] if isinstance(batch, Mapping) and "labels" in batch else None
    if rows is not None and rows <= microbatch_size:
        return [batch]
    return default_split_batch(batch, microbatch_size)


@dataclass
class Evaluation:
    """What :func:`build_evaluation` made: the evaluator and the callback that attaches its gallery.

    Attributes:
        evaluator (composer.core.Evaluator): The test queries, labelled ``"test"``.
        gallery (RetrievalGallery | None): ``None`` when the test items are scored leave-one-out.
        protocol (str): The data's test protocol.
    """

    evaluator: Evaluator
    gallery: RetrievalGallery | None
    protocol: str


def build_evaluation(evaluation: EvaluationConfig, splits: DatasetSplits, label: str = "test") -> Evaluation:
    """The evaluator ``label`` of the data's protocol and its gallery callback (add it to the callbacks)."""
    protocol = protocol_of(splits)
    gallery = None
    size = evaluation.gallery_batch_size
    if protocol == QUERIES_VS_PASSAGES:
        gallery = RetrievalGallery(
            splits.test, rows=gallery_rows(splits), evaluator_label=label, batch_size=size
        )
    elif protocol == TRAIN_GALLERY:
        gallery = RetrievalGallery(splits.train, evaluator_label=label, batch_size=size)
    loader = build_eval_dataloader(splits.test, evaluation.batch_size, rows=query_rows(splits))
    return Evaluation(Evaluator(label=label, dataloader=loader), gallery, protocol)


def final_metrics(
    model: torch.nn.Module,
    splits: DatasetSplits,
    ks: Sequence[int],
    distance: str,
    *,
    batch_size: int = 1000,
    gallery_batch_size: int = 2048,
    dims: Sequence[int] = (),
) -> tuple[dict[str, Any], torch.Tensor]:
    """Score the test split with ``model`` by the data's protocol, in one pass: ``(metrics, query embeddings)``.

    Every rank computes the same result (each embeds the whole split). The metrics are those of
    :func:`eval_metrics` by the same names, ``queries_without_positive`` (the queries every metric
    leaves out) and ``num_queries``. The queries are embedded ``batch_size`` at a time and the gallery
    ``gallery_batch_size`` at a time (``evaluation.batch_size`` and ``evaluation.gallery_batch_size``):
    what a forward pass holds at once, the evaluation's peak memory. With ``dims`` (Matryoshka
    dimensions) the same metrics of the embeddings truncated to each narrower dimension and L2-normalised
    again follow under ``"matryoshka"``, keyed by the dimension (``{"64": {"mrr": ...}}``; see
    :mod:`composer_dynsample.config.matryoshka`); without, the result is as before.
    """
    sources = source_splits(splits)
    if "test" not in sources:
        options = {"batch_size": batch_size, "gallery_batch_size": gallery_batch_size, "dims": dims}
        return _mix_metrics(model, sources, ks, distance, options)
    protocol, test = protocol_of(splits), splits.test
    rows = query_rows(splits)
    queries = embed_store(model, test, rows=rows, batch_size=batch_size)
    labels = store_labels(test, rows).to(queries.device)
    gallery, gallery_labels = None, None
    if protocol == QUERIES_VS_PASSAGES:
        passages = gallery_rows(splits)
        gallery = embed_store(model, test, rows=passages, batch_size=gallery_batch_size)
        gallery_labels = store_labels(test, passages).to(gallery.device)
    elif protocol == TRAIN_GALLERY:
        gallery = embed_store(model, splits.train, batch_size=gallery_batch_size)
        gallery_labels = store_labels(splits.train).to(gallery.device)

    def score(query_embeddings: torch.Tensor, gallery_embeddings: torch.Tensor | None) -> dict[str, float]:
        """The metrics (and ``queries_without_positive``) of these embeddings of the queries and gallery."""
        if protocol == QUERIES_VS_PASSAGES:
            values = ranking_metrics(
                query_embeddings, labels, gallery_embeddings, gallery_labels,
                distance=distance, recall_ks=list(ks), mrr_ks=RANKING_KS, ndcg_ks=RANKING_KS,
            )  # fmt: skip
            found = {_metric_key(name): values[name] for name in _ranking_names(ks)}
            return {**found, "queries_without_positive": values["queries_without_positive"]}
        values = retrieval_metrics(
            query_embeddings, labels, gallery_embeddings, gallery_labels, ks=tuple(ks), distance=distance
        )
        found = {name: float(value) for name, value in values.items()}
        return {**found, "queries_without_positive": count_queries_without_positive(labels, gallery_labels)}

    result: dict[str, Any] = score(queries, gallery)
    result["num_queries"] = len(labels)
    if dims:
        truncated = truncated_scores(score, queries, gallery, dims)
        result[RESULTS_KEY] = {
            dim: {name: value for name, value in values.items() if name != "queries_without_positive"}
            for dim, values in truncated.items()
        }
    return result, queries.cpu()


def _mix_metrics(
    model: torch.nn.Module,
    sources: Mapping[str, DatasetSplits],
    ks: Sequence[int],
    distance: str,
    options: dict[str, Any],
) -> tuple[dict[str, Any], torch.Tensor]:
    """A mix's final metrics: each source's under ``sources`` (by name), and the mean over the sources of
    each metric they all have at the top level (``num_queries`` summed); the queries of every source."""
    each, queries = {}, []
    for label, source in sources.items():
        each[label[len("test_") :]], embedded = final_metrics(model, source, ks, distance, **options)
        queries.append(embedded)
    shared = [
        name
        for name, value in next(iter(each.values())).items()
        if isinstance(value, (int, float)) and all(name in metrics for metrics in each.values())
    ]
    result: dict[str, Any] = {name: sum(m[name] for m in each.values()) / len(each) for name in shared}
    result["num_queries"] = sum(int(m["num_queries"]) for m in each.values())
    result["queries_without_positive"] = sum(int(m["queries_without_positive"]) for m in each.values())
    result["sources"] = each
    return result, torch.cat(queries)
