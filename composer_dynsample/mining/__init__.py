"""Hard-negative mining on tensors: miners as configured objects and their functional forms.

Each miner is a class built with its options, checked there, and called on
``(embeddings, labels[, ref_embeddings, ref_labels])`` to return an ``indices_tuple`` in
pytorch-metric-learning's format, so its output can be passed to any PML loss; each has a functional form
(torchmetrics-style) that builds it and calls it:

* :class:`BatchHardMiner` / :func:`batch_hard`: per anchor the farthest positive and nearest negative
  (triplets).
* :class:`HardTopKMiner` / :func:`hard_topk`: per anchor the ``k`` nearest negatives with its farthest
  positive (triplets).
* :class:`SemiHardMiner` / :func:`semi_hard`: per anchor-positive pair the nearest semi-hard negative
  (triplets).
* :class:`DistanceWeightedMiner` / :func:`distance_weighted`: per anchor-positive pair a negative sampled
  by inverse distance density (triplets).
* :class:`MultiSimilarityMiner` / :func:`multi_similarity`: multi-similarity positive and negative pairs
  (``(a1, p, a2, n)``).
* :class:`RandomTripletsMiner` / :func:`random_triplets`: the baseline, a random positive and negative per
  anchor (triplets).

:data:`MINERS` names them for YAML and :class:`~composer_dynsample.HardNegativeMining`
(:func:`build_miner`, :func:`mine`); a new miner subclasses :class:`BaseMiner` and writes its ``mine``.

Beside them, the pure steps around a miner in training: :func:`mining_step` runs one step (the pool, the
miner, duplicate negatives, the memory, the statistics) and returns the
:class:`~composer_dynsample.MinedBatch` the loss receives; :func:`assemble_pool` builds the :class:`Pool` a
batch is mined against (the batch, other ranks' rows, a :class:`CrossBatchMemory`),
:func:`mining_statistics` summarises the mined tuples for logging and :func:`drop_duplicate_negatives`
leaves out negatives that repeat the anchor's sample under another label (duplicate ids).

The miners run under ``torch.no_grad()``, are vectorised over anchors, and compute the distance matrix
in chunks of anchors so that memory stays ``O(chunk x M)``. No Composer import is needed here.

Example:
    >>> import torch
    >>> from composer_dynsample.mining import BatchHardMiner
    >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    >>> anchors, positives, negatives = BatchHardMiner(distance="cosine")(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    >>> anchors.tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from composer_dynsample.distances import DISTANCES, pairwise_distance
from composer_dynsample.mining._common import MiningInputs, validate_mining_inputs
from composer_dynsample.mining.base import KINDS, BaseMiner, functional_form
from composer_dynsample.mining.batch_hard import BatchHardMiner, batch_hard
from composer_dynsample.mining.distance_weighted import DistanceWeightedMiner, distance_weighted
from composer_dynsample.mining.duplicates import drop_duplicate_negatives, duplicate_negatives
from composer_dynsample.mining.hard_topk import HardTopKMiner, hard_topk
from composer_dynsample.mining.memory import CrossBatchMemory
from composer_dynsample.mining.multi_similarity import MultiSimilarityMiner, multi_similarity
from composer_dynsample.mining.pool import Pool, assemble_pool
from composer_dynsample.mining.random_triplets import RandomTripletsMiner, random_triplets
from composer_dynsample.mining.registry import MINERS, STRATEGIES, build_miner, check_strategy, mine
from composer_dynsample.mining.semi_hard import SEMI_HARD_FALLBACKS, SemiHardMiner, semi_hard
from composer_dynsample.mining.statistics import mining_statistics
from composer_dynsample.mining.step import all_ranks_finite, mining_step, skipped_step

__all__ = [
    "DISTANCES",
    "KINDS",
    "MINERS",
    "SEMI_HARD_FALLBACKS",
    "STRATEGIES",
    "BaseMiner",
    "BatchHardMiner",
    "CrossBatchMemory",
    "DistanceWeightedMiner",
    "HardTopKMiner",
    "MiningInputs",
    "MultiSimilarityMiner",
    "Pool",
    "RandomTripletsMiner",
    "SemiHardMiner",
    "all_ranks_finite",
    "assemble_pool",
    "batch_hard",
    "build_miner",
    "check_strategy",
    "distance_weighted",
    "drop_duplicate_negatives",
    "duplicate_negatives",
    "functional_form",
    "hard_topk",
    "mine",
    "mining_statistics",
    "mining_step",
    "multi_similarity",
    "pairwise_distance",
    "random_triplets",
    "semi_hard",
    "skipped_step",
    "validate_mining_inputs",
]
