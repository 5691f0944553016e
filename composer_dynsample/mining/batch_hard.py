"""``BatchHardMiner``: per anchor its farthest positive and nearest negative (Hermans et al., 2017)."""

from __future__ import annotations

from composer_dynsample.mining.hard_topk import HardTopKMiner

__all__ = ["BatchHardMiner"]


class BatchHardMiner(HardTopKMiner):
    """Batch-hard triplets (Hermans et al., 2017): per anchor its farthest positive and nearest negative.

    Anchors without a positive or without a negative are left out, so at most one triplet per anchor is
    returned, in increasing anchor order. On L2-normalised embeddings this returns the same triplets as
    pytorch-metric-learning's ``BatchHardMiner()`` (ties aside). It is
    :class:`~composer_dynsample.mining.HardTopKMiner` with ``k=1``. Called as
    :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns triplets.

    Args:
        distance (str), chunk_size (int, optional): As for every miner (:class:`BaseMiner`).

    Example:
        >>> import torch
        >>> emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
        >>> BatchHardMiner()(emb, torch.tensor([0, 0, 1, 1]))
        (tensor([0, 1, 2, 3]), tensor([1, 0, 3, 2]), tensor([2, 2, 1, 1]))
    """

    def __init__(self, *, distance: str = "cosine", chunk_size: int | None = None) -> None:
        super().__init__(k=1, distance=distance, chunk_size=chunk_size)
