"""What a training run reports in text: the metrics table and ``metrics.json``.

Its pictures (the test embeddings, the nearest neighbours of image queries) are in
:mod:`~composer_dynsample.cli.plots`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["format_metrics_table", "metrics_table_title", "write_json"]

_NAMES = {
    "map_at_r": "MAP@R",
    "r_precision": "R-precision",
    "mrr": "MRR",
}
# Metrics with a cut-off, ``<prefix><k>``, and how the table names them.
_AT_K = (("recall_at_", "Recall@"), ("mrr_at_", "MRR@"), ("ndcg_at_", "nDCG@"))
# Counts of queries that the table reports in a closing line rather than as metrics.
_COUNTS = ("queries_without_positive", "num_queries")


def _metric_label(name: str, gallery_size: int | None = None) -> str:
    for prefix, label in _AT_K:
        if name.startswith(prefix):
            return f"{label}{name.removeprefix(prefix)}"
    if name == "csn_mrr":
        return f"MRR (CodeSearchNet, {_csn_candidates(gallery_size)} candidates)"
    return _NAMES.get(name, name)


def _csn_candidates(gallery_size: int | None) -> str:
    """How many candidates CodeSearchNet's MRR ranks each query among: its groups' size, at most the gallery."""
    import inspect

    from composer_dynsample.metrics.ranking import RankingMetrics

    candidates = inspect.signature(RankingMetrics).parameters["csn_candidates"].default
    return f"up to {candidates}" if gallery_size is None else str(min(candidates, gallery_size))


def metrics_table_title(dataset: str, num_queries: int, protocol: str, gallery_size: int) -> str:
    """The heading of a training run's metrics table: the data set, then what its test queries were scored against.

    Args:
        dataset (str): The test split's name (``DatasetSplits.test_name``: a test file's stem, else the
            data's name).
        num_queries (int): The test queries.
        protocol (str): What :func:`~composer_dynsample.config.evaluation.describe_protocol` says.
        gallery_size (int): The items the queries are ranked among.

    Example:
        >>> metrics_table_title("pairs", 500, "test queries vs test passages", 500)
        'pairs: final retrieval metrics of 500 test queries vs 500 test passages'
    """
    against = {
        "leave-one-out among the test items": "leave-one-out among themselves (unseen classes)",
        "test queries vs test passages": f"vs {gallery_size} test passages",
    }.get(protocol, f"vs {gallery_size} train items")
    return f"{dataset}: final retrieval metrics of {num_queries} test queries {against}"


def format_metrics_table(
    metrics: Mapping[str, float],
    title: str = "final retrieval metrics",
    *,
    gallery_size: int | None = None,
    start: Mapping[str, float] | None = None,
) -> str:
    """Format retrieval metrics as a text table: a column of values, or the starting model's beside them.

    Args:
        metrics (Mapping[str, float]): ``recall_at_{k}``, ``map_at_r``, ``r_precision`` (or the ranking
            metrics of text pairs: ``mrr``, ``mrr_at_{k}``, ``ndcg_at_{k}``, ``csn_mrr``) and any other
            numbers (Python or numpy numbers, or one-element tensors, as the metrics return them);
            non-numbers are left out, and NaN shows as ``n/a``. The counts ``queries_without_positive``
            and ``num_queries`` are no rows: they make a closing line that says how many queries the
            metrics leave out (see :func:`~composer_dynsample.metrics.count_queries_without_positive`).
        title (str): The heading. Default: ``"final retrieval metrics"``.
        gallery_size (int, optional): The items the queries were ranked among: CodeSearchNet's MRR ranks
            each query among ``min(1000, gallery_size)`` candidates, and its row says how many.
            Default: ``None`` (the row says "up to 1000").
        start (Mapping[str, float], optional): The starting model's metrics (``evaluation.at_start``):
            the table then has a column ``at start`` before the column ``final`` (``metrics``), with
            ``n/a`` where ``start`` lacks a row's metric. Default: ``None`` (one column, ``value``).

    Returns:
        str: The table, one metric per line.

    Example:
        >>> metrics = {"recall_at_1": 0.975, "map_at_r": 0.8, "queries_without_positive": 2, "num_queries": 40}
        >>> print(format_metrics_table(metrics, title="test"))
        test
        metric     value
        --------  ------
        Recall@1  0.9750
        MAP@R     0.8000
        2 of 40 queries have no item of their class in the gallery: every metric leaves them out.
        >>> print(format_metrics_table({"recall_at_1": 0.975}, title="test", start={"recall_at_1": 0.5}))
        test
        metric    at start   final
        --------  --------  ------
        Recall@1    0.5000  0.9750
    """
    columns = {"value": dict(_numbers(metrics))}
    if start is not None:
        columns = {"at start": dict(_numbers(start)), "final": columns["value"]}
    names = [name for name, _ in _numbers(metrics) if name not in _COUNTS]
    rows = [
        [_metric_label(name, gallery_size), *(_cell(values.get(name)) for values in columns.values())]
        for name in names
    ]
    lines = _aligned([["metric", *columns], *rows])
    note = _queries_without_positive_note(metrics)
    return "\n".join(text.rstrip() for text in [title, *lines, *([note] if note else [])])


def _aligned(rows: list[list[str]]) -> list[str]:
    """A header row, a rule and the other rows: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    rule = ["-" * width for width in widths]
    return [
        f"{row[0]:<{widths[0]}}  " + "  ".join(f"{text:>{size}}" for text, size in zip(row[1:], widths[1:]))
        for row in [rows[0], rule, *rows[1:]]
    ]


def _cell(number: float | None) -> str:
    """A metric's value as the table shows it: four decimals, ``n/a`` for NaN or a missing value."""
    return f"{number:.4f}" if number is not None and math.isfinite(number) else "n/a"


def _queries_without_positive_note(metrics: Mapping[str, Any]) -> str | None:
    """The closing line of the table when some queries have no same-class gallery item, else ``None``."""
    missing, total = (_python(metrics.get(key)) for key in _COUNTS)
    if not isinstance(missing, int) or missing <= 0:
        return None
    if missing == total:
        return f"n/a: none of the {total} queries has an item of its class in the gallery, so no metric can be computed."
    of_total = f" of {total}" if isinstance(total, int) else ""
    return f"{missing}{of_total} queries have no item of their class in the gallery: every metric leaves them out."


def _numbers(metrics: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The entries that are one real number: Python, numpy or a one-element tensor (as the metrics return)."""
    pairs = ((name, _python(value)) for name, value in metrics.items())
    return [
        (name, float(value))
        for name, value in pairs
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


def _python(value: Any) -> Any:
    """Tensors and numpy values as Python numbers (one element) or lists; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _jsonable(value: Any) -> Any:
    value = _python(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (tensors and numpy scalars become numbers, NaN null).

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "m.json"
        >>> write_json(file, {"recall_at_1": torch.tensor(0.5), "ks": (1, 5)})
        >>> json.loads(file.read_text())
        {'recall_at_1': 0.5, 'ks': [1, 5]}
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(json.dumps(_jsonable(dict(data)), indent=2) + "\n")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no stray temporary file when the target cannot be written
        raise
