"""The metrics table of a run on several data sets: each source's metrics in a column, their mean last.

Printed by ``train`` and ``eval`` in place of the one-column table when the results hold ``sources`` (a
``data: {name: mix}`` run, :mod:`composer_dynsample.config.mix_data`): each source is scored on its own
test split, by its own protocol; a metric one source lacks (sources of two kinds) is ``n/a`` there and
has no mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composer_dynsample.cli.reporting import _COUNTS, _aligned, _cell, _metric_label, _numbers

__all__ = ["format_sources_table"]


def format_sources_table(metrics: Mapping[str, Any], title: str) -> str:
    """Each source's metrics (``metrics["sources"]``) beside their mean (the top-level metrics).

    Args:
        metrics (Mapping[str, Any]): The results of a mix: the mean over the sources of each metric they
            share, and under ``sources`` each source's metrics by name.
        title (str): The heading.

    Returns:
        str: The table, one metric per line, and a line of each source's number of queries.

    Example:
        >>> results = {"mrr": 0.6, "num_queries": 30, "sources": {
        ...     "code": {"mrr": 0.5, "num_queries": 10}, "qa": {"mrr": 0.7, "num_queries": 20}}}
        >>> print(format_sources_table(results, "mix"))
        mix
        metric    code      qa    mean
        ------  ------  ------  ------
        MRR     0.5000  0.7000  0.6000
        queries: code 10, qa 20
    """
    sources: Mapping[str, Mapping[str, Any]] = metrics["sources"]
    columns = {name: dict(_numbers(values)) for name, values in sources.items()}
    columns["mean"] = dict(_numbers(metrics))
    names = list(dict.fromkeys(n for values in columns.values() for n in values if n not in _COUNTS))
    rows = [
        [_metric_label(name), *(_cell(values.get(name)) for values in columns.values())] for name in names
    ]
    counts = ", ".join(f"{name} {int(values.get('num_queries', 0))}" for name, values in sources.items())
    return "\n".join(
        text.rstrip() for text in [title, *_aligned([["metric", *columns], *rows]), f"queries: {counts}"]
    )
