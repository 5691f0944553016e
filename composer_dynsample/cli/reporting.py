"""What a training run reports: a metrics table, ``metrics.json``, a PNG of the test embeddings and, for
images, a PNG of test queries with their nearest neighbours.

Plots use matplotlib's Agg canvas directly (``matplotlib.figure.Figure``), so they work without a
display and never change the process's global backend.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

# composer_dynsample.metrics (it loads torchmetrics and transformers) is imported in the function using it.
from composer_dynsample.distances import pairwise_distance

__all__ = [
    "format_metrics_table",
    "metrics_table_title",
    "nearest_neighbours",
    "pca_2d",
    "plot_embeddings",
    "plot_retrievals",
    "write_json",
]

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

    from composer_dynsample.metrics.ranking import ranking_metrics

    candidates = inspect.signature(ranking_metrics).parameters["csn_candidates"].default
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


def pca_2d(embeddings: torch.Tensor | np.ndarray) -> np.ndarray:
    """Project ``(N, D)`` embeddings on their first two principal components.

    Args:
        embeddings (torch.Tensor | np.ndarray): ``(N, D)`` with ``N >= 1``.

    Returns:
        np.ndarray: ``(N, 2)`` float64 coordinates (a zero column when ``D < 2`` or the data is flat).

    Raises:
        ValueError: If ``embeddings`` is not 2-D.

    Example:
        >>> points = pca_2d(np.array([[0.0, 0.0, 1.0], [2.0, 0.0, 1.0], [4.0, 0.1, 1.0]]))
        >>> points.shape, bool(np.ptp(points[:, 0]) > np.ptp(points[:, 1]))
        ((3, 2), True)
    """
    array = embeddings.detach().cpu().double().numpy() if isinstance(embeddings, torch.Tensor) else embeddings
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"embeddings must be 2-D (N, D), got shape {array.shape}.")
    centered = array - array.mean(axis=0, keepdims=True)
    out = np.zeros((array.shape[0], 2))
    if array.shape[0] < 2:
        return out
    _, _, vt = np.linalg.svd(centered, full_matrices=False)
    components = vt[:2]
    projected = centered @ components.T
    out[:, : projected.shape[1]] = projected
    return out


def plot_embeddings(
    embeddings: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray | Sequence[int],
    path: str | os.PathLike[str],
    *,
    title: str = "test embeddings (PCA)",
    class_names: Sequence[str] | None = None,
    dpi: int = 110,
) -> Path:
    """Scatter a 2-D PCA projection of embeddings, coloured by class, with a legend, to a PNG.

    Args:
        embeddings (torch.Tensor | np.ndarray): ``(N, D)`` embeddings.
        labels (torch.Tensor | np.ndarray | Sequence[int]): ``(N,)`` integer classes.
        path (str | os.PathLike): The PNG to write.
        title (str): The plot title, e.g. with the Recall@1. Default: ``"test embeddings (PCA)"``.
        class_names (Sequence[str], optional): The name of each label, for the legend
            (``DatasetSplits.class_names``). Default: ``None`` (the label numbers).
        dpi (int): Resolution. Default: ``110``.

    Returns:
        Path: ``path``.

    Raises:
        ValueError: If the lengths of ``embeddings`` and ``labels`` differ, or a label has no name.

    Example:
        >>> import tempfile
        >>> file = plot_embeddings(torch.randn(30, 8), torch.arange(30) % 3, Path(tempfile.mkdtemp()) / "e.png")
        >>> file.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = pca_2d(embeddings)
    label_array = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if label_array.shape != (points.shape[0],):
        raise ValueError(
            f"labels must have one entry per embedding ({points.shape[0]}), got shape {label_array.shape}."
        )
    names = _class_names(label_array, class_names)
    figure = Figure(figsize=(6.4, 5.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    classes = np.unique(label_array)
    cmap = _colour_map(len(classes))
    for position, cls in enumerate(classes):
        mask = label_array == cls
        axes.scatter(
            points[mask, 0], points[mask, 1], s=7, alpha=0.75, color=cmap(position), label=names(cls)
        )
    axes.set_title(title)
    axes.set_xlabel("PC 1")
    axes.set_ylabel("PC 2")
    if len(classes) <= 30:
        axes.legend(title="class", loc="center left", bbox_to_anchor=(1.0, 0.5), markerscale=2, fontsize=8)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=dpi)
    return target


def _class_names(labels: np.ndarray, class_names: Sequence[str] | None) -> Callable[[Any], str]:
    """A label's name for a plot: ``class_names[label]`` (at most 20 characters), else the number."""
    if class_names is None:
        return lambda label: str(int(label))
    names = [str(name) for name in class_names]
    top = int(labels.max()) if labels.size else -1
    if top >= len(names) or (labels.size and int(labels.min()) < 0):
        raise ValueError(
            f"class_names holds {len(names)} names, but the labels range over [{int(labels.min())}, {top}]."
        )
    return lambda label: _shorten(names[int(label)], 20)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _colour_map(count: int) -> Any:
    from matplotlib import colormaps

    name = "tab10" if count <= 10 else "tab20" if count <= 20 else "viridis"
    cmap = colormaps[name]
    if name == "viridis":
        return lambda i: cmap(i / max(count - 1, 1))
    return cmap


def nearest_neighbours(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    k: int,
    *,
    exclude: torch.Tensor | None = None,
    distance: str = "cosine",
) -> torch.Tensor:
    """The ``k`` nearest gallery rows of each query, ``(Q, k)`` int64 (distances of :mod:`~composer_dynsample.distances`).

    ``exclude`` holds, per query, a gallery row it may not return (itself, when the gallery holds the
    queries: leave-one-out).

    Example:
        >>> items = torch.tensor([[0.0, 1.0], [0.0, 2.0], [5.0, 0.0]])
        >>> nearest_neighbours(items[:1], items, 1, exclude=torch.tensor([0]), distance="euclidean").tolist()
        [[1]]
    """
    distances = pairwise_distance(queries.float(), gallery.float(), distance)
    if exclude is not None:
        distances[torch.arange(queries.shape[0]), exclude] = float("inf")
    return distances.topk(min(k, gallery.shape[0] - int(exclude is not None)), dim=1, largest=False).indices


def plot_retrievals(
    images: torch.Tensor,
    labels: torch.Tensor,
    embeddings: torch.Tensor,
    path: str | os.PathLike[str],
    *,
    num_queries: int = 8,
    k: int = 5,
    distance: str = "cosine",
    title: str = "test queries and their nearest test items",
    class_names: Sequence[str] | None = None,
    seed: int = 0,
    dpi: int = 110,
) -> Path:
    """A grid a person can look at: random test queries (left) and their ``k`` nearest other test items.

    Each neighbour is framed green when its class is the query's, red otherwise; the gallery is the
    test items themselves (leave-one-out), as the evaluation of unseen classes scores them. Three
    channels are drawn as RGB colour; one channel in gray, ink dark (``0`` white, ``1`` black, as
    glyphs are drawn); any other number of channels as the gray of their mean.

    Args:
        images (torch.Tensor): ``(N, C, H, W)`` or ``(N, H, W)`` images of the test items, in [0, 1].
        labels (torch.Tensor): ``(N,)`` their classes.
        embeddings (torch.Tensor): ``(N, D)`` their embeddings.
        path (str | os.PathLike): The PNG to write.
        num_queries (int): Rows of the grid. Default: ``8``.
        k (int): Neighbours per query. Default: ``5``.
        distance (str): ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.
        title (str): The figure title. Default: as above.
        class_names (Sequence[str], optional): The name of each label, shown beside each query.
            Default: ``None`` (``class <label>``).
        seed (int): Which queries are drawn. Default: ``0``.
        dpi (int): Resolution. Default: ``110``.

    Returns:
        Path: ``path``.

    Example:
        >>> import tempfile
        >>> images, labels = torch.rand(20, 1, 8, 8), torch.arange(20) % 4
        >>> file = plot_retrievals(images, labels, torch.randn(20, 3), Path(tempfile.mkdtemp()) / "r.png", num_queries=3)
        >>> file.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not (len(images) == len(labels) == len(embeddings)):
        raise ValueError(
            f"images, labels and embeddings must have one row per item, got {len(images)}, {len(labels)} and "
            f"{len(embeddings)}."
        )
    pictures = _displayable(images)
    names = _class_names(labels.cpu().numpy(), class_names) if class_names is not None else None
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(labels), generator=generator)[: min(num_queries, len(labels))]
    items = embeddings.detach().cpu()
    neighbours = nearest_neighbours(items[chosen], items, k, exclude=chosen, distance=distance)
    figure = Figure(figsize=(1.2 * (k + 1), 1.25 * len(chosen) + 0.6))
    FigureCanvasAgg(figure)
    grid = figure.subplots(len(chosen), k + 1, squeeze=False)
    for row, query in enumerate(chosen.tolist()):
        cells = [(query, None), *((int(j), bool(labels[j] == labels[query])) for j in neighbours[row])]
        _draw_retrieval_row(grid[row], pictures, cells)
        label = int(labels[query])
        grid[row][0].set_ylabel(names(label) if names is not None else f"class {label}", fontsize=7)
    grid[0][0].set_title("query", fontsize=8)
    for column in range(1, k + 1):
        grid[0][column].set_title(f"#{column}", fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=dpi)
    return target


def _displayable(images: torch.Tensor) -> torch.Tensor:
    """``(N, H, W, 3)`` colour images from three channels, else ``(N, H, W)`` gray ones, in [0, 1]."""
    pictures = images.detach().cpu().float()
    if pictures.ndim == 4 and pictures.shape[1] == 3:
        return pictures.permute(0, 2, 3, 1).clamp(0.0, 1.0)  # imshow takes RGB as (H, W, 3)
    return pictures if pictures.ndim == 3 else pictures.mean(dim=1)


def _draw_retrieval_row(axes_row: Any, pictures: torch.Tensor, cells: list[tuple[int, bool | None]]) -> None:
    """One query (black frame) and its neighbours, framed green when of the query's class, else red."""
    for axes, (item, right) in zip(axes_row, cells):
        if pictures.ndim == 4:  # colour, drawn as it is
            axes.imshow(pictures[item].numpy())
        else:
            axes.imshow(pictures[item].numpy(), cmap="gray_r", vmin=0.0, vmax=1.0)
        axes.set_xticks([])
        axes.set_yticks([])
        colour = "black" if right is None else ("tab:green" if right else "tab:red")
        for spine in axes.spines.values():
            spine.set_edgecolor(colour)
            spine.set_linewidth(1.0 if right is None else 3.0)
