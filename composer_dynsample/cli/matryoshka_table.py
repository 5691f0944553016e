"""The metrics table of a run's Matryoshka dimensions: each metric at the full width and at each truncation.

Printed after the metrics table by ``train`` and ``eval`` when the results hold ``matryoshka`` (see
:mod:`composer_dynsample.config.matryoshka`): one row per metric, the full width's column first, then one
column per dimension, narrowest last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composer_dynsample.cli.reporting import _COUNTS, _aligned, _cell, _metric_label, _numbers

__all__ = ["format_matryoshka_table"]


def format_matryoshka_table(metrics: Mapping[str, Any], *, gallery_size: int | None = None) -> str:
    """The metrics of ``metrics`` (full width) beside those of ``metrics["matryoshka"]`` (one column a dimension).

    Args:
        metrics (Mapping[str, Any]): The results: the full width's metrics, and under ``matryoshka`` each
            dimension's (``{"64": {"mrr": ...}}``).
        gallery_size (int, optional): As for :func:`~composer_dynsample.cli.reporting.format_metrics_table`
            (CodeSearchNet MRR's candidates). Default: ``None``.

    Returns:
        str: The table, titled; ``""`` when there is no ``matryoshka`` entry.

    Example:
        >>> results = {"mrr": 0.5, "num_queries": 9, "matryoshka": {"128": {"mrr": 0.45}, "64": {"mrr": 0.4}}}
        >>> print(format_matryoshka_table(results))
        Matryoshka: each metric on the first d dimensions (L2-normalised again)
        metric    full     128      64
        ------  ------  ------  ------
        MRR     0.5000  0.4500  0.4000
    """
    per_dim = metrics.get("matryoshka")
    if not isinstance(per_dim, Mapping) or not per_dim:
        return ""
    full = dict(_numbers(metrics))
    columns = {"full": full, **{str(dim): dict(_numbers(values)) for dim, values in per_dim.items()}}
    names = [name for name in full if name not in _COUNTS]
    rows = [
        [_metric_label(name, gallery_size), *(_cell(values.get(name)) for values in columns.values())]
        for name in names
    ]
    title = "Matryoshka: each metric on the first d dimensions (L2-normalised again)"
    return "\n".join(text.rstrip() for text in [title, *_aligned([["metric", *columns], *rows])])
