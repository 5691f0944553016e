"""What a training run draws: a PNG of the test embeddings (PCA, coloured by class) and, for images, a PNG
of test queries with their nearest neighbours.

Plots use matplotlib's Agg canvas directly (``matplotlib.figure.Figure``), so they work without a
display and never change the process's global backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

# composer_dynsample.metrics (it loads torchmetrics and transformers) is imported in the function using it.
from composer_dynsample.distances import pairwise_distance

__all__ = ["nearest_neighbours", "pca_2d", "plot_embeddings", "plot_retrievals"]


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
