"""Row-wise distances between matched rows, differentiable, for losses and mining statistics."""

from __future__ import annotations

import torch

from composer_dynsample.mining.distances import check_distance

__all__ = ["distance_matrix", "paired_distance"]


def paired_distance(x: torch.Tensor, y: torch.Tensor, distance: str = "cosine") -> torch.Tensor:
    """Distance between ``x[i]`` and ``y[i]`` for every row ``i``, with the miners' definitions.

    ``"cosine"`` is ``1 - cos(x, y)``, ``"euclidean"`` is ``||x - y||`` (its square root is taken of a
    value clamped at ``1e-12`` so identical rows get a finite gradient), ``"squared_euclidean"`` its square.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
        >>> y = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
        >>> paired_distance(x, y, "cosine").tolist(), paired_distance(x, y, "squared_euclidean").tolist()
        ([1.0, 0.0], [2.0, 4.0])
    """
    check_distance(distance)
    if distance == "cosine":
        return 1.0 - torch.nn.functional.cosine_similarity(x, y, dim=-1, eps=1e-12)
    squared = (x - y).pow(2).sum(-1)
    return squared.clamp_min(1e-12).sqrt() if distance == "euclidean" else squared


def distance_matrix(x: torch.Tensor, y: torch.Tensor, distance: str = "cosine") -> torch.Tensor:
    """Differentiable ``(N, M)`` distances between the rows of ``x`` and ``y``: one matrix multiplication.

    Losses index this matrix at their tuples: with tens of thousands of pairs, gathering embedding rows
    per tuple (and scattering their gradients back) costs far more than one ``N x M`` product.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
        >>> distance_matrix(x, x, "squared_euclidean").tolist()
        [[0.0, 10.0], [10.0, 0.0]]
    """
    check_distance(distance)
    if distance == "cosine":
        x_unit = torch.nn.functional.normalize(x, dim=-1, eps=1e-12)
        y_unit = x_unit if y is x else torch.nn.functional.normalize(y, dim=-1, eps=1e-12)
        return 1.0 - x_unit @ y_unit.T
    squared = (x.pow(2).sum(-1)[:, None] + y.pow(2).sum(-1)[None, :] - 2.0 * (x @ y.T)).clamp_min(0.0)
    return squared.clamp_min(1e-12).sqrt() if distance == "euclidean" else squared
