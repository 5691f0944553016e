"""Hard-negative mining as pure functions on tensors.

Each miner maps ``(embeddings, labels[, ref_embeddings, ref_labels])`` to an ``indices_tuple`` in
pytorch-metric-learning's format, so its output can be passed to any PML loss:

* :func:`batch_hard`: per anchor the farthest positive and nearest negative (triplets).
* :func:`hard_topk`: per anchor the ``k`` nearest negatives with its farthest positive (triplets).
* :func:`semi_hard`: per anchor-positive pair the nearest semi-hard negative (triplets).
* :func:`distance_weighted`: per anchor-positive pair a negative sampled by inverse distance density
  (triplets).
* :func:`multi_similarity`: multi-similarity positive and negative pairs (``(a1, p, a2, n)``).
* :func:`random_triplets`: the baseline, a random positive and negative per anchor (triplets).

Beside them, the two pure steps around a miner in training: :func:`assemble_pool` builds the
:class:`Pool` a batch is mined against (the batch, other ranks' rows, a memory), and
:func:`mining_statistics` summarises the mined tuples for logging; :func:`drop_duplicate_negatives`
leaves out negatives that repeat the anchor's sample under another label (duplicate ids).

The miners run under ``torch.no_grad()``, are vectorised over anchors, and compute the distance matrix
in chunks of anchors so that memory stays ``O(chunk x M)``. No Composer import is needed here.

Example:
    >>> import torch
    >>> from composer_dynsample.mining import batch_hard
    >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    >>> anchors, positives, negatives = batch_hard(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    >>> anchors.tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from composer_dynsample.distances import DISTANCES, pairwise_distance
from composer_dynsample.mining._common import MiningInputs, validate_mining_inputs
from composer_dynsample.mining.duplicates import drop_duplicate_negatives, duplicate_negatives
from composer_dynsample.mining.miners import (
    SEMI_HARD_FALLBACKS,
    batch_hard,
    distance_weighted,
    hard_topk,
    multi_similarity,
    semi_hard,
)
from composer_dynsample.mining.pool import Pool, assemble_pool
from composer_dynsample.mining.random_triplets import random_triplets
from composer_dynsample.mining.statistics import mining_statistics

__all__ = [
    "DISTANCES",
    "SEMI_HARD_FALLBACKS",
    "MiningInputs",
    "Pool",
    "assemble_pool",
    "batch_hard",
    "distance_weighted",
    "drop_duplicate_negatives",
    "duplicate_negatives",
    "hard_topk",
    "mining_statistics",
    "multi_similarity",
    "pairwise_distance",
    "random_triplets",
    "semi_hard",
    "validate_mining_inputs",
]
