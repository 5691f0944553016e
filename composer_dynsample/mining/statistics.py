"""Per-step mining statistics as a pure function of the embeddings, the pool and the mined tuples.

Every value is a 0-d tensor on the embeddings' device, all of one dtype (float32, or float64 for embeddings whose
squares overflow float32, as the miners decide), so a caller can stack them and read them back to the host in
one transfer instead of one per statistic.
"""

from __future__ import annotations

import torch

from composer_dynsample.distances import paired_distance, working_dtype

__all__ = ["STATISTICS", "embedding_spread", "mining_statistics"]

#: The names :func:`mining_statistics` can return, in the order it returns them.
STATISTICS = (
    "skipped",
    "num_tuples",
    "active_fraction",
    "positive_distance",
    "negative_distance",
    "embedding_spread",
)


def mining_statistics(
    embeddings: torch.Tensor,
    pool: torch.Tensor,
    tuples: tuple[torch.Tensor, ...],
    *,
    distance: str = "cosine",
    margin: float = 0.2,
    skipped: bool = False,
    values_checked: bool = False,
) -> dict[str, torch.Tensor]:
    """Statistics of one mining step, as 0-d float tensors of one dtype (one host sync: the dtype).

    Args:
        embeddings (torch.Tensor): ``(B, D)`` anchors.
        pool (torch.Tensor): ``(M, D)`` reference pool the tuples' positives and negatives index (the batch
            itself when nothing joined it).
        tuples (tuple[torch.Tensor, ...]): Triplets ``(a, p, n)`` or pairs ``(a1, p, a2, n)``.
        distance (str): The distance the tuples were mined with. Default: ``"cosine"``.
        margin (float): The margin of ``active_fraction``, the share of triplets with
            ``d(a, p) - d(a, n) + margin > 0`` (triplets only). Default: ``0.2``.
        skipped (bool): The step was skipped (non-finite embeddings): only ``skipped = 1`` is returned.
        values_checked (bool): The caller checked the entries' size on the device: the dtype is chosen
            with no host read (:func:`~composer_dynsample.distances.working_dtype`).

    Returns:
        dict[str, torch.Tensor]: ``skipped``, ``num_tuples``, ``active_fraction`` (triplets only),
        ``positive_distance`` and ``negative_distance`` (means over the tuples, 0 when there are none) and
        ``embedding_spread`` (see :func:`embedding_spread`).

    Example:
        >>> emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
        >>> tuples = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
        >>> {k: round(float(v), 3) for k, v in mining_statistics(emb, emb, tuples).items()}
        {'skipped': 0.0, 'num_tuples': 1.0, 'active_fraction': 0.0, 'positive_distance': 0.0, 'negative_distance': 1.0, 'embedding_spread': 0.667}
    """
    if skipped:
        return {"skipped": embeddings.new_ones((), dtype=torch.float32)}
    # One dtype for every statistic (they are stacked): float32, or float64 where float32 would overflow.
    dtype = working_dtype(embeddings, pool, values_checked=values_checked)
    zero = embeddings.new_zeros((), dtype=dtype)
    stats = {"skipped": zero}
    if len(tuples) == 3:
        anchors, positives, negatives = tuples
        ap = paired_distance(embeddings[anchors], pool[positives], distance, dtype=dtype)
        an = paired_distance(embeddings[anchors], pool[negatives], distance, dtype=dtype)
        stats["num_tuples"] = zero + anchors.numel()
        stats["active_fraction"] = _mean_or_zero((ap - an + margin > 0).to(dtype), zero)
    else:
        a1, p, a2, n = tuples
        ap = paired_distance(embeddings[a1], pool[p], distance, dtype=dtype)
        an = paired_distance(embeddings[a2], pool[n], distance, dtype=dtype)
        stats["num_tuples"] = zero + (a1.numel() + a2.numel())
    stats["positive_distance"] = _mean_or_zero(ap, zero)
    stats["negative_distance"] = _mean_or_zero(an, zero)
    stats["embedding_spread"] = embedding_spread(embeddings, distance, dtype=dtype)
    return stats


def _mean_or_zero(values: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return values.mean() if values.numel() else zero


def embedding_spread(
    embeddings: torch.Tensor, distance: str = "cosine", *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Mean distance over distinct pairs in O(B x D), as a 0-d tensor; near zero when the embeddings collapsed.

    Under ``"cosine"`` a zero (or near-zero-norm) row has no direction: it counts as at distance 0 from every
    row (collapsed), not as orthogonal to everything, which normalising it to zeros would make it. Under
    ``"euclidean"`` the value is the root of the mean squared distance.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` embeddings.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        dtype (torch.dtype, optional): The dtype to compute in. Default: the
            :func:`~composer_dynsample.distances.working_dtype` of the embeddings (float64 where float32
            squares would overflow).

    Returns:
        torch.Tensor: The spread (``inf`` with fewer than two rows), in ``dtype``.

    Example:
        >>> float(embedding_spread(torch.zeros(4, 3)))
        0.0
    """
    count = embeddings.shape[0]
    x = embeddings.detach()
    x = x.to(working_dtype(x, x) if dtype is None else dtype)
    if count < 2:
        return x.new_full((), float("inf"))
    if distance == "cosine":
        norms = x.norm(dim=1)
        directed = norms > torch.clamp(norms.max() * 1e-6, min=1e-12)
        unit = torch.nn.functional.normalize(x, dim=1) * directed[:, None]
        valid = directed.sum()
        similarity_sum = unit.sum(0).pow(2).sum() - valid  # over ordered pairs of distinct directed rows
        return (valid * (valid - 1) - similarity_sum) / (count * (count - 1))
    # Mean squared distance over ordered pairs: 2 (mean |x|^2 - |mean x|^2) * n / (n - 1).
    squared = (2.0 * (x.pow(2).sum(1).mean() - x.mean(0).pow(2).sum()) * count / (count - 1)).clamp_min(0.0)
    return squared.sqrt() if distance == "euclidean" else squared
